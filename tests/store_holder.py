"""Another process that holds a store open, for the tests of what this process does meanwhile."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held_elsewhere(path: Path, sql: str | None = None) -> Iterator[subprocess.Popen]:
    """A second Python process that opens the store ``path`` for writing (DuckDB's lock), runs
    ``sql`` on it if given, and holds it until the block ends; the block starts once it holds it.
    It waits on its stdin rather than sleeping, so it never lets go early however slow the test."""
    code = textwrap.dedent(f"""
        import sys, duckdb
        c = duckdb.connect({str(path)!r})
        if {sql!r} is not None:
            c.execute({sql!r})
        print("held", flush=True)
        sys.stdin.read()
    """)
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()
