"""`store migrate` and `store compact` replace the store file with a copy: no write another process
makes meanwhile may be lost under that rename. Both close DuckDB's connection before the swap, take
the same file lock themselves and refuse a store written in between; migrate also holds the lock
while it copies, so nobody can open the store while the copy is made from it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from equipoise.evaluators import store as st
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.store_holder import held_elsewhere


def _old_store(tmp_path: Path) -> Path:
    """An empty store at schema v2, which ``store migrate`` upgrades: the v1 and v2 DDL applied to a
    new file."""
    path = tmp_path / "s.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for v, sql in st.MIGRATIONS[:2]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?)", [v])
    con.close()
    return path


def _current_store(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=20, seed=1))
    return path


COMMANDS: dict[str, tuple[Callable[[Path], Path], Callable[[Path], object]]] = {
    "migration": (_old_store, st.migrate_store),
    "compaction": (_current_store, st.compact_store),
}


@pytest.mark.parametrize("what", sorted(COMMANDS))
def test_a_write_before_the_lock_stops_the_swap_and_is_kept(tmp_path: Path, monkeypatch, what: str) -> None:
    """Another process writes the store after the command closed its connection and before it took
    the lock: the command refuses to rename its copy over the store, and that write is still there."""
    make, run = COMMANDS[what]
    path = make(tmp_path)
    taken = st._file_locked

    def write_then_lock(p: Path, doing: str):
        other = duckdb.connect(str(p))  # this process, but a write like any other writer's
        other.execute("CREATE TABLE written_meanwhile AS SELECT 42 AS answer")
        other.close()
        return taken(p, doing)

    monkeypatch.setattr(st, "_file_locked", write_then_lock)
    with pytest.raises(st.StoreLockedError, match=f"another process wrote this store during the {what}"):
        run(path)
    monkeypatch.undo()
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute("SELECT answer FROM written_meanwhile").fetchall() == [(42,)]
    finally:
        con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]


def _try_open(path: Path, read_only: bool) -> str:
    """What another process gets when it opens ``path``: 'opened' or the start of its error."""
    code = textwrap.dedent(f"""
        import duckdb
        try:
            duckdb.connect({str(path)!r}, read_only={read_only}).close()
            print("opened")
        except duckdb.IOException as exc:
            print(str(exc).splitlines()[0])
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_no_process_can_open_the_store_while_it_is_migrated(tmp_path: Path, monkeypatch) -> None:
    """While the copy is migrated the original is locked: a writer and a reader in another process
    both fail to open it (DuckDB's own lock error), and the migration then completes."""
    path = _old_store(tmp_path)
    seen: list[str] = []
    real = st.migrate

    def migrate_while_probed(con: duckdb.DuckDBPyConnection) -> int:
        seen.extend(_try_open(path, read_only) for read_only in (False, True))
        return real(con)

    monkeypatch.setattr(st, "migrate", migrate_while_probed)
    assert st.migrate_store(path) == (2, st.SCHEMA_VERSION)
    assert len(seen) == 2 and all("lock" in s.lower() and "opened" not in s for s in seen), seen
    assert _try_open(path, read_only=False).strip() == "opened"  # released afterwards


@pytest.mark.parametrize("sendfile", ["kernel", "missing", "fails_half_way", "short", "stops_early"])
def test_the_locked_copy_is_the_same_bytes(tmp_path: Path, monkeypatch, sendfile: str) -> None:
    """migrate copies the store through the descriptor it locked: in the kernel (os.sendfile), or
    by reads where sendfile is missing or stops part of the way, always the same bytes."""
    src = tmp_path / "src.bin"
    data = bytes(range(256)) * 4099 + b"tail"  # not a multiple of the chunk
    src.write_bytes(data)
    monkeypatch.setattr(st, "_COPY_CHUNK", 1 << 16)
    if sendfile == "missing":
        monkeypatch.delattr(st.os, "sendfile")
    elif sendfile == "fails_half_way":
        real, calls = st.os.sendfile, []

        def flaky(out_fd: int, in_fd: int, offset: int, count: int) -> int:
            calls.append(offset)
            if len(calls) > 3:
                raise OSError("sendfile refused")
            return real(out_fd, in_fd, offset, count)

        monkeypatch.setattr(st.os, "sendfile", flaky)
    elif sendfile in ("short", "stops_early"):  # fewer bytes than asked; then 0 before the end
        real_sf = st.os.sendfile

        def partial(out_fd: int, in_fd: int, offset: int, count: int) -> int:
            if sendfile == "stops_early" and offset >= 300_000:
                return 0
            return real_sf(out_fd, in_fd, offset, min(count, 1000))

        monkeypatch.setattr(st.os, "sendfile", partial)
    fd = st.os.open(src, st.os.O_RDWR)
    try:
        st.os.lseek(fd, 5, st.os.SEEK_SET)
        st._copy_from(fd, tmp_path / "copy.bin")
        assert st.os.lseek(fd, 0, st.os.SEEK_CUR) == 5  # the descriptor's offset is left alone
    finally:
        st.os.close(fd)
    assert (tmp_path / "copy.bin").read_bytes() == data


@pytest.mark.parametrize("what", sorted(COMMANDS))
def test_without_fcntl_the_commands_still_work_unlocked(tmp_path: Path, monkeypatch, what: str) -> None:
    """Where ``fcntl`` does not exist (Windows) both commands run unlocked: no descriptor is held
    (Windows would refuse the rename) and migrate copies with shutil."""
    make, run = COMMANDS[what]
    path = make(tmp_path)
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` raises ImportError

    def no_descriptor_copy(fd: int, target: Path) -> None:  # needs os.pread, which Windows lacks
        raise AssertionError("the descriptor copy ran without fcntl")

    monkeypatch.setattr(st, "_copy_from", no_descriptor_copy)
    with st._file_locked(path, what) as fd:
        assert fd is None
    run(path)
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert st.store_version(con) == st.SCHEMA_VERSION
    finally:
        con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]


def _replace_copy(copy: Path, text: bytes) -> None:
    """What a second migration or compaction does to ``<store>.migrating`` / ``.compacting`` once
    it holds the store: removes any file there as a leftover and makes its own under that name."""
    copy.unlink(missing_ok=True)
    copy.write_bytes(text)


COPY_SUFFIX = {"migration": ".migrating", "compaction": ".compacting"}


@pytest.mark.parametrize("what", sorted(COMMANDS))
def test_a_command_that_fails_on_the_lock_leaves_the_other_ones_copy(
    tmp_path: Path, monkeypatch, what: str
) -> None:
    """Another migration (compaction) got the store between this one's close and its lock and is
    working on its copy, under the name this one uses (a compaction's own copy removed first as a
    leftover): this one fails on the lock and must not delete that copy."""
    make, run = COMMANDS[what]
    path = make(tmp_path)
    theirs = tmp_path / f"s.duckdb{COPY_SUFFIX[what]}"
    taken, others = st._file_locked, contextlib.ExitStack()

    def other_gets_in_first(p: Path, doing: str):
        others.enter_context(held_elsewhere(p))
        _replace_copy(theirs, b"the other one's copy")
        return taken(p, doing)

    monkeypatch.setattr(st, "_file_locked", other_gets_in_first)
    refused = f"another process opened this store during the {what}"
    with others, pytest.raises(st.StoreLockedError, match=refused):
        run(path)
    assert theirs.read_bytes() == b"the other one's copy"


def test_a_compaction_whose_copy_was_replaced_renames_nothing(tmp_path: Path, monkeypatch) -> None:
    """Another compaction replaced this one's copy and let the store go before this one took the
    lock (the store's own file unchanged): the file under the copy's name is not this run's, so it
    is neither renamed over the store nor deleted, and the store keeps its bytes."""
    path = _current_store(tmp_path)
    theirs = tmp_path / "s.duckdb.compacting"
    original = path.read_bytes()
    taken = st._file_locked

    def copy_replaced_first(p: Path, doing: str):
        _replace_copy(theirs, b"the other compaction's copy")
        return taken(p, doing)

    monkeypatch.setattr(st, "_file_locked", copy_replaced_first)
    with pytest.raises(st.StoreLockedError, match="another process removed or replaced the compacted copy"):
        st.compact_store(path)
    assert theirs.read_bytes() == b"the other compaction's copy"
    assert path.read_bytes() == original


def test_a_failed_compaction_removes_its_copy_before_it_lets_go(tmp_path: Path, monkeypatch) -> None:
    """A compaction whose copy fails its check deletes that copy while its connection still holds
    the store: by the time another process can get in, nothing of it is left under the copy's name."""
    path = _current_store(tmp_path)
    copy = tmp_path / "s.duckdb.compacting"
    at_close: list[bool] = []
    real_open, real_contents = st._open_for_upkeep, st._contents

    class Watched:  # the upkeep connection, noting whether the copy is there when it is closed
        def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
            self._con = con

        def close(self) -> None:
            at_close.append(copy.exists())
            self._con.close()

        def __getattr__(self, name: str):
            return getattr(self._con, name)

    def differs(con, database: str) -> dict[str, object]:
        got = dict(real_contents(con, database))
        if database.startswith("equipoise_compacted"):
            got["an extra entry"] = True
        return got

    monkeypatch.setattr(st, "_open_for_upkeep", lambda p: Watched(real_open(p)))
    monkeypatch.setattr(st, "_contents", differs)
    with pytest.raises(st.StoreError, match="differs from the store"):
        st.compact_store(path)
    assert at_close == [False]


def test_a_compaction_that_fails_before_its_copy_leaves_the_name_alone(tmp_path: Path) -> None:
    """A compaction refused before it began its copy (a bad --memory-limit) deletes nothing under
    the copy's name: a file there may be another compaction's finished copy, waiting for the lock."""
    path = _current_store(tmp_path)
    theirs = tmp_path / "s.duckdb.compacting"
    theirs.write_bytes(b"the other compaction's copy")
    with pytest.raises(ValueError, match="memory limit"):
        st.compact_store(path, memory_limit="lots")
    assert theirs.read_bytes() == b"the other compaction's copy"


def test_a_compaction_out_of_memory_is_one_error_and_leaves_no_copy(tmp_path: Path, monkeypatch) -> None:
    """DuckDB running out of memory while the rows are copied becomes a StoreError that says what
    to raise; the copy is gone and the store has its bytes."""
    path = _current_store(tmp_path)
    original = path.read_bytes()

    def out_of_memory(*args: object) -> None:
        raise duckdb.OutOfMemoryException("could not allocate block")

    monkeypatch.setattr(st, "_copy_table", out_of_memory)
    with pytest.raises(st.StoreError, match=r"out of memory while copying .*raise --memory-limit"):
        st.compact_store(path)
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]
