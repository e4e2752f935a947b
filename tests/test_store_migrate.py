"""Schema v2 and `equipoise store migrate`: a v1 store is refused with the one command that upgrades
it, the upgrade is atomic, and every metric is identical before and after it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators import store as st
from equipoise.evaluators.metrics.registry import compute, metric_names, prepare, uses_facts
from equipoise.evaluators.synthetic import SyntheticSpec, make_store

V1_TABLES = ("datasets", "items", "options", "runs", "predictions", "option_scores")


def _v1_store(tmp_path: Path) -> Path:
    """A store written with the v1 DDL (migration 1 only), filled with a synthetic store's rows."""
    src = tmp_path / "src.duckdb"
    spec = SyntheticSpec(n_items=60, models=("m1", "m2"), samples=2, unparsed_rate=0.1, seed=3)
    make_store(src, spec)
    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    con.execute(st.MIGRATIONS[0][1])
    con.execute("INSERT INTO schema_version VALUES (1)")
    con.execute(f"ATTACH '{src}' AS src (READ_ONLY)")
    for t in V1_TABLES:
        cols = ", ".join(r[0] for r in con.execute(f"DESCRIBE {t}").fetchall())
        con.execute(f"INSERT INTO {t} ({cols}) SELECT {cols} FROM src.{t}")
    con.execute("DETACH src")
    con.close()
    return path


def _all_metrics(con: duckdb.DuckDBPyConnection) -> dict[str, pd.DataFrame]:
    prepare(con, materialize=True)
    return {name: compute(con, name) for name in metric_names()}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_v1_store_is_refused_with_the_migrate_command(tmp_path: Path) -> None:
    path = _v1_store(tmp_path)
    for read_only in (True, False):
        with pytest.raises(st.StoreOutdatedError, match=f"equipoise store migrate {path}$"):
            st.connect(path, read_only=read_only)
    r = CliRunner().invoke(app, ["metrics", "--store", str(path)])
    assert r.exit_code == 2
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(f"equipoise store migrate {path}"), r.output
    assert "Traceback" not in r.output
    # refusing to open it changed nothing
    con = duckdb.connect(str(path), read_only=True)
    assert st.store_version(con) == 1
    con.close()


def test_migrate_gives_identical_metrics_and_adds_parent_run_id(tmp_path: Path) -> None:
    path = _v1_store(tmp_path)
    con = duckdb.connect(str(path), read_only=True)  # the v1 tables, read as they are
    before = _all_metrics(con)
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in V1_TABLES}
    con.close()
    r = CliRunner().invoke(app, ["store", "migrate", str(path)])
    assert r.exit_code == 0, r.output
    assert "v1 -> v2" in r.output
    assert not path.with_name(path.name + ".migrating").exists()
    con = st.connect(path, read_only=True)
    assert st.store_version(con) == st.SCHEMA_VERSION == 2
    assert {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in V1_TABLES} == counts
    cols = [r[0] for r in con.execute("DESCRIBE runs").fetchall()]
    assert cols[-1] == "parent_run_id"
    assert con.execute("SELECT count(*) FROM runs WHERE parent_run_id IS NOT NULL").fetchone()[0] == 0
    after = _all_metrics(con)
    assert uses_facts(con)  # migrate wrote the fact tables: `after` was read from them
    con.close()
    assert before.keys() == after.keys() and len(before) == len(metric_names())
    assert sum(len(df) for df in before.values()) > 100  # the metrics saw data
    for name in before:
        pd.testing.assert_frame_equal(before[name], after[name], obj=name)
    # a second migrate is a no-op; a v2 store opens for writing and stays v2
    r = CliRunner().invoke(app, ["store", "migrate", str(path)])
    assert r.exit_code == 0 and "nothing to do" in r.output
    st.connect(path).close()


def test_failed_migration_leaves_the_store_untouched(tmp_path: Path, monkeypatch) -> None:
    path = _v1_store(tmp_path)
    sha = _sha(path)
    broken = [
        *st.MIGRATIONS[:1],
        (2, "ALTER TABLE runs ADD COLUMN parent_run_id VARCHAR; SELECT * FROM nope"),
    ]
    monkeypatch.setattr(st, "MIGRATIONS", broken)
    with pytest.raises(duckdb.CatalogException):
        st.migrate_store(path)
    assert _sha(path) == sha
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.duckdb", "v1.duckdb"]
    monkeypatch.undo()
    assert st.migrate_store(path) == (1, 2)


def test_migrate_errors_are_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["store", "migrate", str(tmp_path / "missing.duckdb")])
    assert r.exit_code == 2 and "no such store" in r.output and "Traceback" not in r.output


def test_report_into_an_uncreatable_folder_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=10))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = CliRunner().invoke(app, ["report", "--store", str(path), "--out", str(blocker / "report")])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot create the report folder" in lines[0], r.output
