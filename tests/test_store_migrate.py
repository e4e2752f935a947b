"""Schemas v2 / v3 / v4 and `equipoise store migrate`: an older store is refused with the one command that
upgrades it, the upgrade is atomic, and every metric is identical before and after it."""

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


def _v1_store(tmp_path: Path, version: int = 1) -> Path:
    """A store written with the DDL of schema ``version`` (its migrations only), filled with a
    synthetic store's rows (the option scores as the long table of v1 / v2, as the predictions'
    score lists from v3, where ``option_scores`` is a view over them)."""
    src = tmp_path / "src.duckdb"
    spec = SyntheticSpec(n_items=60, models=("m1", "m2"), samples=2, unparsed_rate=0.1, seed=3)
    make_store(src, spec)
    path = tmp_path / f"v{version}.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for v, sql in st.MIGRATIONS[:version]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?)", [v])
    con.execute(f"ATTACH '{src}' AS src (READ_ONLY)")
    views = {
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database()"
        ).fetchall()
    }
    for t in V1_TABLES:
        if t in views:
            continue
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
    assert f"v1 -> v{st.SCHEMA_VERSION}" in r.output
    assert not path.with_name(path.name + ".migrating").exists()
    con = st.connect(path, read_only=True)
    assert st.store_version(con) == st.SCHEMA_VERSION == 4
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
    # a second migrate is a no-op; a current store opens for writing and stays current
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
    assert st.migrate_store(path) == (1, st.SCHEMA_VERSION)


def test_v2_store_migrates_its_option_scores_onto_the_prediction_rows(tmp_path: Path) -> None:
    """v2 -> v3: each sample's long score rows become its two sorted lists (NULL where it had none),
    ``option_scores`` reads the same rows back as a view, and every metric is identical."""
    path = _v1_store(tmp_path, version=2)
    con = duckdb.connect(str(path))
    # a sample without any score and one with a single score, beside the full ones
    con.execute("DELETE FROM option_scores WHERE hash(item_id || run_id) % 11 = 0")
    con.execute("DELETE FROM option_scores WHERE hash(item_id || run_id) % 13 = 0 AND label <> 'B'")
    before = _all_metrics(con)
    scores = con.execute("SELECT * FROM option_scores ORDER BY ALL").fetchall()
    con.close()
    assert st.migrate_store(path) == (2, st.SCHEMA_VERSION)
    con = st.connect(path, read_only=True)
    assert con.execute("SELECT * FROM option_scores ORDER BY ALL").fetchall() == scores
    kinds = dict(
        con.execute(
            "SELECT coalesce(len(score_labels), 0) AS n, count(*) FROM predictions GROUP BY ALL"
        ).fetchall()
    )
    assert kinds.get(0) and kinds.get(1) and kinds.get(4)  # none, one and all four scored
    assert (
        con.execute(
            "SELECT count(*) FROM predictions WHERE score_labels <> list_sort(score_labels) "
            "OR len(score_labels) <> len(score_logprobs)"
        ).fetchone()[0]
        == 0
    )
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "option_scores" not in tables  # a view now
    after = _all_metrics(con)
    con.close()
    for name in before:
        pd.testing.assert_frame_equal(before[name], after[name], obj=name)


def test_scores_without_their_prediction_stop_the_v3_migration(tmp_path: Path) -> None:
    """A v2 store whose option scores name a sample that has no prediction row cannot be moved to
    v3 (the scores would have nowhere to go): the migration says so and leaves the file as it was."""
    path = _v1_store(tmp_path, version=2)
    con = duckdb.connect(str(path))
    con.execute(
        "INSERT INTO option_scores "
        "SELECT * REPLACE (item_id || ':gone' AS item_id) FROM option_scores LIMIT 3"
    )
    con.close()
    sha = _sha(path)
    r = CliRunner().invoke(app, ["store", "migrate", str(path)])
    assert r.exit_code != 0 and "no prediction row" in r.output and "Traceback" not in r.output
    assert _sha(path) == sha and not path.with_name(path.name + ".migrating").exists()


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
