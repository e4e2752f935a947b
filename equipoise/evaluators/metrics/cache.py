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
- computing that fingerprint is one scan of the store, so what the scan gives
  (:func:`equipoise.evaluators.metrics.facts.source_sums`) is memoised in ``stat.json`` against the
  store file's identity and times (device, inode, size, modification and change times in
  nanoseconds; the write-ahead log's too) and DuckDB's version (its ``hash`` gives the sums). On
  POSIX systems a write changes the file's mtime and ctime (ctime cannot be set back, as ``touch``
  or ``cp -p`` set mtime), so a matching stat means the sums are still right; a mismatch only costs
  one scan. (On Windows ``st_ctime`` is the creation time: there the stat rests on size and mtime.)
  A memo is kept only when the store's last change is older than its file system's timestamp
  granularity (``_settled``): a write in the same clock tick as the stat could otherwise leave the
  times, and with the size the stat, as they were. That compares file times with this machine's
  clock, so it assumes a file server's clock within about that granularity of it. The memo is read
  and written only through a read-only connection to a store file (a folder of Parquet parts is
  read into memory and always scanned) whose path still names the file the connection opened
  (:func:`file_stat` taken before opening it, equal to the stat now). The metrics pass of the same
  command reuses the sums (``registry.prepare``), so one command scans the store at most once, and
  a later one, on an unchanged store file, not at all.

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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from equipoise.evaluators.metrics import facts
from equipoise.evaluators.store import scalar

if TYPE_CHECKING:  # imported where a frame is read or written: a metrics pass imports this module
    import pandas as pd

CACHE_FORMAT = 1


def cache_dir(store: Path) -> Path:
    return store.parent / (store.name + ".cache")


# the memo's layout: 2 added the file identity, the change times, DuckDB's version and the sums in
# place of the whole fingerprint (which also hashes the fact definitions, so it is made again each
# time from the sums: a memo stays right across package versions)
MEMO_FORMAT = 2
# a change this recent (ns) before the stat may share its timestamps with a later write: on a file
# system whose timestamps have a sub-second part (ext4, XFS, btrfs, APFS, NTFS: a clock tick of a
# few ms or less), and on one whose timestamps are whole seconds (FAT's 2 s, HFS+, ext3)
SETTLE_FINE_NS = 100_000_000
SETTLE_COARSE_NS = 3_000_000_000


def file_stat(store: Path) -> list[int]:
    """Device, inode, size, mtime and ctime (ns) of the store and of its write-ahead log (-1 each
    where a file does not exist). Taken before a connection is opened and handed to
    :func:`source_sums` / :func:`memoised_sums`, it proves that the path still names the file the
    connection opened (a file renamed over the path in between would show another inode)."""
    out = []
    for p in (store, Path(f"{store}.wal")):
        try:
            st = p.stat()
            out += [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        except FileNotFoundError:
            out += [-1] * 5
    return out


def _unchanged(store: Path, opened: list[int]) -> bool:
    """Whether ``store`` is still the file whose :func:`file_stat` was ``opened`` (and a file, not a
    folder of Parquet parts): the condition for reading or writing the memo."""
    return file_stat(store) == opened and store.is_file()


def _settled(stat: list[int], taken_ns: int) -> bool:
    """Whether every write after ``taken_ns`` (the wall clock just after ``stat`` was taken) must
    change ``stat``: the files' last change is older than the timestamp granularity allows a later
    write to share. Whole-second times everywhere are read as a coarse file system (a fine one
    shows them one stat in hundreds of millions), which then needs a few seconds of quiet."""
    times = [t for i in range(0, len(stat), 5) if stat[i + 2] >= 0 for t in stat[i + 3 : i + 5]]
    if not times:
        return False
    coarse = all(t % 1_000_000_000 == 0 for t in times)
    return max(times) < taken_ns - (SETTLE_COARSE_NS if coarse else SETTLE_FINE_NS)


def _memo_header(stat: list[int]) -> dict[str, object]:
    return {"format": MEMO_FORMAT, "duckdb": duckdb.__version__, "stat": stat}


def memoised_sums(store: Path, opened: list[int]) -> dict[str, str] | None:
    """The store's ``facts.source_sums`` from the memo where the store file is unchanged since they
    were taken, else None; never scans or writes. ``opened``: the store's :func:`file_stat` taken
    before the caller opened its connection, which must be read-only (so that no other process
    writes the file while it is open, and none wrote it since ``opened``, which this checks). For
    a reader that only wants to skip the scan (``equipoise report``)."""
    if not _unchanged(store, opened):
        return None
    # a memo of another layout (older code: no "sums") or damaged is a miss, never an error
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
        saved = json.loads((cache_dir(store) / "stat.json").read_text(encoding="utf-8"))
        sums = saved.pop("sums")
        ok = saved == _memo_header(opened) and set(sums) == set(facts.SOURCE_TABLES)
        if ok and all(isinstance(v, str) for v in sums.values()):
            return dict(sums)
    return None


def source_sums(con: duckdb.DuckDBPyConnection, store: Path, opened: list[int] | None) -> dict[str, str]:
    """The store's ``facts.source_sums``: from the memo when the store is unchanged, else one scan,
    memoised where the store has settled (``_settled``). The memo is read and written only when
    ``con`` is read-only and ``opened`` (see :func:`memoised_sums`) is still the file's stat. Why
    read-only: such a connection holds DuckDB's shared lock on the file, so no process writes it
    while it is open and the stat is the stat of the rows scanned; a writable one could write
    between, or hold uncommitted rows that the memo's sums do not count. Otherwise: one scan."""
    read_only = scalar(con, "SELECT current_setting('access_mode')") == "read_only"
    if not read_only or opened is None:
        return facts.source_sums(con)
    sums = memoised_sums(store, opened)
    if sums is not None:
        return sums
    taken = time.time_ns()
    sums = facts.source_sums(con)
    if _unchanged(store, opened) and _settled(opened, taken):
        memo = json.dumps({**_memo_header(opened), "sums": sums})
        _atomic_write(cache_dir(store) / "stat.json", memo.encode())
    return sums


def content_version(
    con: duckdb.DuckDBPyConnection, store: Path, opened: list[int] | None
) -> tuple[str, dict[str, str]]:
    """The store's fingerprint (the cache's content version) and the source sums it is made of,
    which the caller hands on to ``registry.prepare`` so that the pass does not scan again;
    ``opened`` as in :func:`source_sums`."""
    sums = source_sums(con, store, opened)
    return facts.fingerprint(con, sums), sums


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
