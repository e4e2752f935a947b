"""Reference policies through the parser into a real DuckDB file; metrics by SQL match Python."""

from __future__ import annotations

import shutil
from collections import defaultdict

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from equipoise.builders.clindet_suite import read_cases
from equipoise.cli import app
from equipoise.evaluators.parsing import DECISION, parse_answer
from equipoise.evaluators.policies import POLICIES, policies_for
from equipoise.evaluators.reference_run import DETERMINABILITY_SQL, SAMPLES, run_reference_policies
from equipoise.evaluators.store import connect, scalar


@pytest.fixture(scope="module")
def store(small_clindet, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "store.duckdb"
    con = connect(path)
    run_reference_policies(con, small_clindet, progress=False)
    con.close()
    return path


def _summary(path):
    con = connect(path, read_only=True)
    try:
        cur = con.execute(DETERMINABILITY_SQL)
        rows = cur.fetchall()
        cols = [d[0] for d in cur.description]
    finally:
        con.close()
    return {(r[0], r[1]): dict(zip(cols, r, strict=True)) for r in rows}


def test_floor_and_ceiling(store):
    s = _summary(store)
    conds = ("complete", "incomplete_determinable", "incomplete_undeterminable")
    for c in conds:
        assert s[("reference:oracle", c)]["accuracy"] == 1.0
        assert s[("reference:oracle", c)]["unparsed"] == 0.0
    assert s[("reference:always_abstain", "incomplete_undeterminable")]["accuracy"] == 1.0
    assert s[("reference:always_abstain", "complete")]["accuracy"] == 0.0
    assert s[("reference:always_abstain", "complete")]["excessive_abstention"] == 1.0
    assert s[("reference:always_answer", "incomplete_undeterminable")]["premature_judgment"] == 1.0
    # imputing normal values is always right when the label is determinable, never otherwise
    assert s[("reference:impute_normal", "complete")]["accuracy"] == 1.0
    assert s[("reference:impute_normal", "incomplete_determinable")]["accuracy"] == 1.0
    assert s[("reference:impute_normal", "incomplete_undeterminable")]["accuracy"] == 0.0
    chance = s[("reference:chance", "complete")]["accuracy"]
    assert 0.2 < chance < 0.47


def test_sql_metrics_equal_a_python_recount(store, small_clindet):
    cases = read_cases(small_clindet, "all")
    acc: dict = defaultdict(lambda: [0, 0])
    for name in policies_for("determinability"):
        for c in cases:
            for sample in range(SAMPLES.get(name, 1)):
                parsed = parse_answer(POLICIES[name](c, 0, sample).text, DECISION)
                k = (f"reference:{name}", c.condition)
                acc[k][0] += parsed.label == c.label
                acc[k][1] += 1
    s = _summary(store)
    for k, (hit, n) in acc.items():
        assert s[k]["n"] == n
        assert s[k]["accuracy"] == pytest.approx(hit / n, abs=1e-12)


def test_rerun_is_idempotent(store, small_clindet):
    con = connect(store)
    before = scalar(con, "SELECT count(*) FROM predictions")
    scores_before = scalar(con, "SELECT count(*) FROM option_scores")
    summaries = run_reference_policies(con, small_clindet, progress=False)
    after = scalar(con, "SELECT count(*) FROM predictions")
    runs = scalar(con, "SELECT count(*) FROM runs")
    dup = scalar(
        con,
        "SELECT count(*) FROM (SELECT run_id, item_id, sample_index, count(*) n "
        "FROM predictions GROUP BY ALL HAVING n > 1)",
    )
    assert scalar(con, "SELECT count(*) FROM option_scores") == scores_before
    con.close()
    assert before == after and runs == len(policies_for("determinability")) and dup == 0
    assert all(s.requested == 0 and s.written == 0 for s in summaries)


def test_resume_fills_only_missing_rows(store, small_clindet, tmp_path):
    copy = tmp_path / "s.duckdb"
    shutil.copy(store, copy)
    con = connect(copy)
    total = scalar(con, "SELECT count(*) FROM predictions")
    scores = scalar(con, "SELECT count(*) FROM option_scores")
    # the samples' option scores go with them (store schema v3: they are on the prediction rows)
    con.execute("DELETE FROM predictions WHERE item_id IN (SELECT item_id FROM items LIMIT 17)")
    assert scalar(con, "SELECT count(*) FROM predictions") < total
    run_reference_policies(con, small_clindet, progress=False)
    assert scalar(con, "SELECT count(*) FROM predictions") == total
    assert scalar(con, "SELECT count(*) FROM option_scores") == scores
    con.close()


def test_every_prediction_names_run_model_prompt_and_dataset(store):
    con = connect(store, read_only=True)
    rows = con.execute("""
        SELECT count(*) FROM predictions p JOIN runs r USING (run_id)
        JOIN datasets d ON d.dataset_id = r.dataset_id AND d.config = r.config
        WHERE r.model <> '' AND length(r.prompt_sha256) = 64 AND length(d.dataset_id) = 64""").fetchall()
    total = con.execute("SELECT count(*) FROM predictions").fetchall()
    con.close()
    assert rows == total


def test_sql_command_is_read_only(store):
    runner = CliRunner()
    ok = runner.invoke(
        app, ["sql", "--store", str(store), "--format", "json", "SELECT count(*) AS n FROM runs"]
    )
    n_runs = len(policies_for("determinability"))
    assert ok.exit_code == 0 and f'"n": {n_runs}' in ok.output, ok.output
    for q in (
        "DELETE FROM predictions",
        "CREATE TABLE x (a INT)",
        "COPY runs TO '/tmp/equipoise-leak.csv'",
        "ATTACH '/tmp/other.duckdb' AS o",
    ):
        res = runner.invoke(app, ["sql", "--store", str(store), q])
        assert res.exit_code == 2, q
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchall()[0][0] == len(policies_for("determinability"))
    con.close()


def test_calibrated_policy_is_calibrated_by_construction(small_clindet):
    """The target is drawn from the policy's own probabilities, so in every confidence bin the greedy
    answer's accuracy matches its mean confidence up to sampling error (a binomial z-test per bin)."""
    cases = read_cases(small_clindet, "all")
    conf, hit = [], []
    for seed in range(40):
        for c in cases:
            r = POLICIES["calibrated"](c, seed, 0)
            label = parse_answer(r.text, DECISION).label
            assert label == max(r.probs, key=r.probs.get)  # sample 0 is the greedy answer
            assert sum(r.probs.values()) == pytest.approx(1.0, abs=1e-12)
            conf.append(r.probs[label])
            hit.append(label == c.label)
    conf_a, hit_a = np.array(conf), np.array(hit, dtype=float)
    assert len(conf_a) > 2000 and 0.4 < conf_a.mean() < 0.9
    for lo in np.arange(0.3, 1.0, 0.1):
        m = (conf_a >= lo) & (conf_a < lo + 0.1)
        if m.sum() < 100:
            continue
        p = conf_a[m].mean()
        z = (hit_a[m].mean() - p) / np.sqrt(p * (1 - p) / m.sum())
        assert abs(z) < 4.5, (lo, m.sum(), hit_a[m].mean(), p)
    # further samples are draws from the same probabilities, so they disagree with sample 0 sometimes
    spreads = [
        len({parse_answer(POLICIES["calibrated"](c, 0, s).text, DECISION).label for s in range(40)})
        for c in cases[:10]
    ]
    assert max(spreads) > 1
