"""Metric results cached per store content, so `equipoise metrics` on an unchanged store is instant.

Why: a metrics pass over a large store takes seconds to minutes, and the same tables are asked for
again and again (a report, a notebook, a second format). A result depends only on the store's
content, the code that computes it, the metric, its grouping and its parameters, so it is stored
under a key made of exactly those, in a folder next to the store (``<store>.cache/``):

- the content version is :func:`equipoise.evaluators.metrics.facts.fingerprint` (row counts and
  sums of row hashes of every source table, plus the fact definitions): any change to the rows,
  through this package or plain SQL, gives another key, so a stale result is never served;
- the code version is the package version plus a digest of the metric modules and their SQL files
  (:func:`code_digest`): a result computed by other metric code (an editable install between
  commits, a changed output shape under an unchanged version number) is never served;
- computing that fingerprint is one scan of the store, so it is memoised in ``stat.json`` against
  the store file's size and modification time (nanoseconds; the write-ahead log's too). A write
  changes the file's mtime, so a matching stat means the fingerprint is still right; a mismatch
  only costs one scan.

Results are Parquet files written to a temporary name and renamed into place, so a concurrent or
interrupted writer never leaves half a file under a key. A folder that cannot be written (a
read-only location) disables the cache silently: it is an optimisation, never a requirement.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from equipoise.evaluators.metrics import facts

if TYPE_CHECKING:  # imported where a frame is read or written: a metrics pass imports this module
    import pandas as pd

CACHE_FORMAT = 1


def cache_dir(store: Path) -> Path:
    return store.parent / (store.name + ".cache")


def _stat(store: Path) -> list[int]:
    out = []
    for p in (store, Path(f"{store}.wal")):
        try:
            st = p.stat()
            out += [st.st_size, st.st_mtime_ns]
        except FileNotFoundError:
            out += [-1, -1]
    return out


def content_version(con: duckdb.DuckDBPyConnection, store: Path) -> str:
    """The store's fingerprint, from the memo when the file is unchanged since it was computed."""
    memo = cache_dir(store) / "stat.json"
    stat = _stat(store)
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(memo.read_text(encoding="utf-8"))
        if saved.get("stat") == stat and isinstance(saved.get("fingerprint"), str):
            return str(saved["fingerprint"])
    fp = facts.fingerprint(con)
    _atomic_write(memo, json.dumps({"stat": stat, "fingerprint": fp}).encode())
    return fp


@functools.cache
def code_digest() -> str:
    """sha256 over the metric package's Python and SQL files (relative path and bytes, in path
    order). Why: the package version does not change between commits of an editable install, so
    without this a metric whose SQL or output shape changed would be served from an old result.
    Read once per process (a few dozen small files)."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in {".py", ".sql"} and p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def key(version: str, name: str, by: Sequence[str] | None, params: dict) -> str:
    from equipoise import __version__

    text = json.dumps(
        [CACHE_FORMAT, __version__, code_digest(), version, name, None if by is None else list(by), params],
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def path_for(store: Path, k: str) -> Path:
    return cache_dir(store) / f"{k}.parquet"


def get(store: Path, k: str) -> pd.DataFrame | None:
    p = path_for(store, k)
    if not p.exists():
        return None
    import pandas as pd

    try:
        return pd.read_parquet(p)
    except (OSError, ValueError):
        return None


def put_frame(store: Path, k: str, df: pd.DataFrame) -> None:
    tmp = path_for(store, k).with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path_for(store, k))
    except (OSError, ValueError):
        _discard(tmp)


def put_file(store: Path, k: str, src: Path) -> None:
    """Keep a copy of a result file already written elsewhere (``--out``)."""
    tmp = path_for(store, k).with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, tmp)
        os.replace(tmp, path_for(store, k))
    except OSError:
        _discard(tmp)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        _discard(tmp)


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
