"""`equipoise store compact`: the free space that rewriting the fact tables in place leaves inside a
store file goes back to the file system, every table, key, view and metric stays what it was, and a
copy that fails its check leaves the store untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators import store as st
from equipoise.evaluators.metrics import facts
from equipoise.evaluators.metrics.registry import compute, metric_names, prepare, uses_facts
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.store_holder import held_elsewhere


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bloated_store(tmp_path: Path) -> Path:
    """A synthetic store whose fact tables were rebuilt in place three times after they were first
    written: their earlier copies are free blocks inside the file."""
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=400, models=("m1", "m2"), samples=3, unparsed_rate=0.1, seed=5))
    con = st.connect(path)
    try:
        for _ in range(4):
            assert facts.refresh(con, force=True)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return path


def _all_metrics(path: Path) -> dict[str, pd.DataFrame]:
    con = st.connect(path, read_only=True)
    try:
        prepare(con, materialize=True)
        assert uses_facts(con)  # the facts are current: the metrics below read them
        return {name: compute(con, name) for name in metric_names()}
    finally:
        con.close()


def _tables(path: Path) -> dict[str, list[tuple]]:
    """Every table and view of the store, rows sorted (NULLs and NaNs made comparable)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' UNION ALL "
                "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"
            ).fetchall()
        ]
        return {n: sorted(map(repr, con.execute(f'SELECT * FROM "{n}"').fetchall())) for n in sorted(names)}
    finally:
        con.close()


def test_compact_gives_the_free_space_back_and_keeps_everything(tmp_path: Path) -> None:
    path = _bloated_store(tmp_path)
    before_metrics, before_tables = _all_metrics(path), _tables(path)
    size = path.stat().st_size
    r = CliRunner().invoke(app, ["store", "compact", str(path)])
    assert r.exit_code == 0, r.output
    assert "MiB given back" in r.output and str(path.name) in r.output
    assert path.stat().st_size < size * 0.9, (size, path.stat().st_size)  # 8.0 -> 6.0 MiB here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]  # no copy left behind
    assert _tables(path) == before_tables
    after_metrics = _all_metrics(path)  # facts still current: no refresh was needed
    assert after_metrics.keys() == before_metrics.keys() and len(after_metrics) == len(metric_names())
    assert sum(len(df) for df in before_metrics.values()) > 100
    for name, df in before_metrics.items():
        pd.testing.assert_frame_equal(df, after_metrics[name], obj=name)
    con = st.connect(path)  # opens for writing at the current schema, keys still enforced
    try:
        assert st.store_version(con) == st.SCHEMA_VERSION
        with pytest.raises(duckdb.ConstraintException):
            con.execute("INSERT INTO runs SELECT * FROM runs LIMIT 1")
        assert facts.refresh(con) is False  # nothing to recompute
    finally:
        con.close()
    # a compacted store compacts to the same content again, and no larger
    size = path.stat().st_size
    assert st.compact_store(path) == (size, path.stat().st_size) and path.stat().st_size <= size
    assert _tables(path) == before_tables


def test_a_copy_that_fails_its_check_leaves_the_store_untouched(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=30, seed=2))
    sha = _sha(path)
    real = st._contents

    def lose_a_row(con: duckdb.DuckDBPyConnection, database: str) -> dict[str, object]:
        got = real(con, database)
        if database.startswith("equipoise_compacted"):
            cols, count, total = got["table main.predictions"]
            got["table main.predictions"] = (cols, count - 1, total)
        return got

    monkeypatch.setattr(st, "_contents", lose_a_row)
    with pytest.raises(st.StoreError, match="differs from the store; the store was left as it was"):
        st.compact_store(path)
    assert _sha(path) == sha
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]
    r = CliRunner().invoke(app, ["store", "compact", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    monkeypatch.undo()
    before, after = st.compact_store(path)
    assert after <= before


def test_a_copy_with_one_changed_value_is_caught(tmp_path: Path, monkeypatch) -> None:
    """The same row count, one value different in the copy: the row hashes must catch it."""
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=30, seed=2))
    sha = _sha(path)
    real = st._copy_table

    def copy_and_alter(con, source, target, schema, table) -> None:
        real(con, source, target, schema, table)
        if table == "predictions":
            con.execute(
                f"UPDATE {target}.main.predictions SET latency_ms = coalesce(latency_ms, 0) + 1 "
                f"WHERE rowid = (SELECT min(rowid) FROM {target}.main.predictions)"
            )

    monkeypatch.setattr(st, "_copy_table", copy_and_alter)
    with pytest.raises(st.StoreError, match="differs from the store"):
        st.compact_store(path)
    assert _sha(path) == sha
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]


def test_compact_errors_are_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["store", "compact", str(tmp_path / "missing.duckdb")])
    assert r.exit_code == 2 and "no such store" in r.output and "Traceback" not in r.output
    assert not list(tmp_path.iterdir())
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=20, seed=1))
    sha = _sha(path)
    r = CliRunner().invoke(app, ["store", "compact", str(path), "--memory-limit", "lots"])
    assert r.exit_code == 2 and "memory limit 'lots'" in r.output and "Traceback" not in r.output
    assert _sha(path) == sha and sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]


def test_compact_under_a_memory_limit_gives_the_same_store(tmp_path: Path) -> None:
    """A limit the caller gives (64 MB) is used as given: the same tables, and neither a spill
    folder nor a copy left behind."""
    path = _bloated_store(tmp_path)
    before = _tables(path)
    r = CliRunner().invoke(app, ["store", "compact", str(path), "--memory-limit", "64MB"])
    assert r.exit_code == 0, r.output
    assert _tables(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]


def test_compact_refuses_a_store_another_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=20, seed=1))
    with held_elsewhere(path):
        sha = _sha(path)
        r = CliRunner().invoke(app, ["store", "compact", str(path)])
        assert r.exit_code == 2 and "another process is writing" in " ".join(r.output.split())
        assert _sha(path) == sha
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]
        # the lock compact takes before its swap is the one DuckDB holds: a writer fails it
        with (
            pytest.raises(st.StoreLockedError, match="another process opened this store"),
            st._file_locked(path, "compaction"),
        ):
            pass
