"""Evaluation plans: a whole sweep in one command, resumable; shards and Parquet parts merge into the
same rows as a single process; metrics over a folder of parts equal metrics over the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from equipoise.evaluators.parts import ingest_parts, part_dirs, write_part
from equipoise.evaluators.planner import PlanError, Shard
from equipoise.evaluators.store import PredictionRow, connect

cli = CliRunner()

PLAN = """\
store: sweep.duckdb
datasets:
  - path: clindet
  - path: nota
    configs: all
  - path: medabstain
    configs: [NA, AP]
models:
  - {name: chance, backend: reference}
  - {name: oracle, backend: reference}
prompts: [base, cot]
samples: 1
commit_every: 16
"""

# the same three suites, one config each and one prompt style: for the shard and parts tests
SMALL = (
    PLAN.replace("configs: all", "configs: [plus_nota]")
    .replace("configs: [NA, AP]", "configs: [AP]")
    .replace("prompts: [base, cot]", "prompts: [base]")
)

# the key and every stored column of the two fact tables (a row-for-row comparison)
PRED_SQL = "SELECT * FROM predictions ORDER BY run_id, item_id, sample_index"
SCORE_SQL = "SELECT * FROM option_scores ORDER BY run_id, item_id, sample_index, label"


@pytest.fixture(scope="module")
def suites(tmp_path_factory) -> Path:
    """Three suites, small: ClinDet (determinability), NOTA (3 configs), MedAbstain (2 of 4 used)."""
    root = tmp_path_factory.mktemp("suites")
    build_clindet(root / "clindet", per_system=2, seed=5, progress=False)
    build_mcq_suite("nota", root / "nota", seed=5)
    build_mcq_suite("medabstain", root / "medabstain", seed=5)
    return root


@pytest.fixture
def work(suites, tmp_path) -> Path:
    for name in ("clindet", "nota", "medabstain"):
        (tmp_path / name).symlink_to(suites / name)
    (tmp_path / "plan.yaml").write_text(PLAN)
    return tmp_path


def _rows(store: Path | duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    con = (
        store if isinstance(store, duckdb.DuckDBPyConnection) else duckdb.connect(str(store), read_only=True)
    )
    try:
        return con.execute(sql).fetchall()
    finally:
        if not isinstance(store, duckdb.DuckDBPyConnection):
            con.close()


def _expected_runs(work: Path) -> tuple[int, int]:
    """(runs, predictions) the plan means, counted from the manifests, not from the code under test."""
    runs = preds = 0
    for name, configs in (("clindet", ["all"]), ("nota", None), ("medabstain", ["NA", "AP"])):
        m = json.loads((work / name / "manifest.json").read_text())
        for c in configs or m["eval_configs"]:
            runs += 2 * 2
            preds += 2 * 2 * m["configs"][c]["rows"]
    return runs, preds


def test_plan_sweep_one_command_then_nothing_to_do(work):
    plan = work / "plan.yaml"
    dry = cli.invoke(app, ["eval", str(plan), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    n_runs, n_preds = _expected_runs(work)
    assert f"total: {n_preds:,} predictions, 0 stored, {n_preds:,} to do" in dry.output
    assert not (work / "sweep.duckdb").exists()  # a dry run writes nothing

    first = cli.invoke(app, ["eval", str(plan)])
    assert first.exit_code == 0, first.output
    assert "sweep summary" in first.output
    runs = _rows(work / "sweep.duckdb", "SELECT count(*), count(DISTINCT dataset_id) FROM runs")[0]
    assert runs == (n_runs, 3)
    total, distinct = _rows(
        work / "sweep.duckdb",
        "SELECT count(*), count(DISTINCT (run_id, item_id, sample_index)) FROM predictions",
    )[0]
    assert total == distinct == n_preds
    styles = _rows(work / "sweep.duckdb", "SELECT DISTINCT prompt_style FROM runs ORDER BY 1")
    assert styles == [("base",), ("cot",)]
    oracle_acc = _rows(
        work / "sweep.duckdb",
        "SELECT avg((p.parsed_label = i.target_label)::INT) FROM predictions p JOIN runs r USING (run_id) "
        "JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id "
        "WHERE r.model = 'reference:oracle'",
    )[0][0]
    assert oracle_acc == 1.0

    before = _rows(work / "sweep.duckdb", PRED_SQL)
    second = cli.invoke(app, ["eval", str(plan)])
    assert second.exit_code == 0, second.output
    assert f"nothing to do: all {n_runs} run(s) are complete" in second.output
    assert _rows(work / "sweep.duckdb", PRED_SQL) == before

    again = cli.invoke(app, ["eval", str(plan), "--dry-run"])
    assert f"total: {n_preds:,} predictions, {n_preds:,} stored, 0 to do" in again.output


def test_interrupted_sweep_resumes(work):
    """A sweep cut short (here: one run deleted half-way, as a kill between batches leaves it)
    finishes on the next invocation with exactly the missing rows."""
    plan = work / "plan.yaml"
    assert cli.invoke(app, ["eval", str(plan)]).exit_code == 0
    full = _rows(work / "sweep.duckdb", PRED_SQL)
    con = duckdb.connect(str(work / "sweep.duckdb"))
    rid = con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 1").fetchall()[0][0]
    con.execute(
        "DELETE FROM predictions WHERE run_id = ? AND item_id IN "
        "(SELECT item_id FROM predictions WHERE run_id = ? ORDER BY item_id LIMIT 7)",
        [rid, rid],
    )
    con.close()
    out = cli.invoke(app, ["eval", str(plan), "--dry-run"])
    assert ", 7 to do" in out.output
    assert cli.invoke(app, ["eval", str(plan)]).exit_code == 0
    assert _rows(work / "sweep.duckdb", PRED_SQL) == full


def test_two_shards_ingested_equal_single_process(work):
    plan = work / "small.yaml"
    plan.write_text(SMALL)
    assert cli.invoke(app, ["eval", str(plan)]).exit_code == 0
    parts = work / "parts"
    for i in (0, 1):
        r = cli.invoke(app, ["eval", str(plan), "--shard", f"{i}/2", "--parts", str(parts)])
        assert r.exit_code == 0, r.output
    assert {p.name.split("-")[1] for p in part_dirs(parts)} == {"s000of002", "s001of002"}
    # a shard rerun finds its parts and does nothing
    r = cli.invoke(app, ["eval", str(plan), "--shard", "1/2", "--parts", str(parts)])
    assert "nothing to do" in r.output
    merged = work / "merged.duckdb"
    first = cli.invoke(app, ["store", "ingest", str(parts), "--store", str(merged)])
    assert first.exit_code == 0 and "added" in first.output, first.output
    assert _rows(merged, PRED_SQL) == _rows(work / "sweep.duckdb", PRED_SQL)
    assert _rows(merged, SCORE_SQL) == _rows(work / "sweep.duckdb", SCORE_SQL)
    assert _rows(merged, "SELECT * FROM runs ORDER BY run_id") == _rows(
        work / "sweep.duckdb", "SELECT * FROM runs ORDER BY run_id"
    )
    again = cli.invoke(app, ["store", "ingest", str(parts), "--store", str(merged)])
    assert "nothing new (already ingested)" in again.output
    assert _rows(merged, "SELECT count(*) FROM predictions") == _rows(
        work / "sweep.duckdb", "SELECT count(*) FROM predictions"
    )


def test_metrics_and_sql_over_parts_equal_store(work):
    plan = work / "small.yaml"
    plan.write_text(SMALL)
    parts = work / "parts"
    assert cli.invoke(app, ["eval", str(plan), "--parts", str(parts)]).exit_code == 0
    assert cli.invoke(app, ["store", "ingest", str(parts), "--store", str(work / "m.duckdb")]).exit_code == 0
    args = ["--metric", "answer_rates", "--metric", "ece", "--metric", "determinability_accuracy"]
    args += ["--by", "model", "--format", "json"]
    over_parts = cli.invoke(app, ["metrics", "--store", str(parts), *args])
    over_store = cli.invoke(app, ["metrics", "--store", str(work / "m.duckdb"), *args])
    assert over_parts.exit_code == 0, over_parts.output
    got, want = json.loads(over_parts.stdout), json.loads(over_store.stdout)
    assert got == want and all(len(v) > 0 for v in got.values())
    q = "SELECT r.model, count(*) AS n FROM predictions p JOIN runs r USING (run_id) GROUP BY 1 ORDER BY 1"
    a = cli.invoke(app, ["sql", q, "--store", str(parts), "--format", "json"])
    b = cli.invoke(app, ["sql", q, "--store", str(work / "m.duckdb"), "--format", "json"])
    assert a.exit_code == 0 and json.loads(a.stdout) == json.loads(b.stdout)


def test_partial_part_ignored_and_error_rows_replaced(work, tmp_path):
    plan = work / "plan.yaml"
    parts = work / "parts"
    assert cli.invoke(app, ["eval", str(plan), "--shard", "0/3", "--parts", str(parts)]).exit_code == 0
    store = tmp_path / "s.duckdb"
    con = connect(store)
    ingest_parts(con, parts)
    n = con.execute("SELECT count(*) FROM predictions").fetchall()[0][0]
    row = con.execute("SELECT run_id, item_id FROM predictions LIMIT 1").fetchall()[0]
    # a killed worker's half-written part: a hidden folder, with a row that would be a duplicate key
    crashed = parts / ".tmp-crashed-0001"
    shutil.copytree(part_dirs(parts)[-1], crashed)
    # an error row for a stored answer: ignored; an answer for a stored error row: replaces it
    con.execute("UPDATE predictions SET outcome = 'error', error = 'x' WHERE run_id = ? AND item_id = ?", row)
    err = PredictionRow(
        run_id=row[0],
        item_id="nope",
        sample_index=0,
        raw_output="",
        parsed_label=None,
        parse_method="error",
        outcome="error",
        error="timeout",
    )
    write_part(parts, "zz-extra", {"predictions": [err]})
    res = ingest_parts(con, parts)
    assert res.replaced_errors == 1
    assert res.added == {
        "datasets": 0,
        "items": 0,
        "options": 0,
        "runs": 0,
        "predictions": 1,
        "option_scores": 0,
    }
    assert con.execute("SELECT count(*) FROM predictions").fetchall()[0][0] == n + 1
    assert con.execute("SELECT count(*) FROM predictions WHERE outcome = 'error'").fetchall()[0][0] == 1
    assert ingest_parts(con, parts).predictions_added == 0
    con.close()


def test_shards_partition_items():
    ids = [f"item-{i}" for i in range(500)]
    shards = [Shard(i, 3) for i in range(3)]
    owners = [[s.index for s in shards if s.keeps(x)] for x in ids]
    assert all(len(o) == 1 for o in owners)
    assert all(sum(1 for o in owners if o == [k]) > 100 for k in range(3))
    assert Shard.parse("2/3") == Shard(2, 3)
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(PlanError):
            Shard.parse(bad)


def test_plan_errors_are_one_line(work):
    plan = work / "bad.yaml"
    plan.write_text(PLAN.replace("backend: reference}", "backend: refrence}", 1))
    r = cli.invoke(app, ["eval", str(plan)])
    assert r.exit_code == 2
    assert "bad.yaml: field 'models.0.backend'" in r.output and "Traceback" not in r.output
    plan.write_text(PLAN.replace("configs: [NA, AP]", "configs: [NA, XX]"))
    r = cli.invoke(app, ["eval", str(plan), "--dry-run"])
    assert r.exit_code == 2 and "no config 'XX'" in r.output
    plan.write_text(PLAN.replace("name: oracle", "name: orcale"))
    r = cli.invoke(app, ["eval", str(plan), "--dry-run"])
    assert r.exit_code == 2 and "unknown reference policy 'orcale'" in r.output
    r = cli.invoke(app, ["eval", str(work / "plan.yaml"), "--workers", "2"])
    assert r.exit_code == 2 and "--workers only applies with --ray" in r.output
    r = cli.invoke(app, ["eval", str(work / "plan.yaml"), "--shard", "2/2"])
    assert r.exit_code == 2 and "0 <= I < N" in r.output
    r = cli.invoke(app, ["store", "ingest", str(work / "nothing-here"), "--store", str(work / "x.duckdb")])
    assert r.exit_code == 2 and "no such folder of parts" in r.output


def test_schema_plan_is_published():
    r = cli.invoke(app, ["schema", "plan"])
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    assert {"store", "datasets", "models", "prompts", "samples"} <= set(schema["properties"])
    assert set(schema["required"]) == {"datasets", "models"}


def test_readme_plan_is_valid():
    """The plan shown in the README validates against the published model (names as in the issue)."""
    import re

    import yaml

    from equipoise.evaluators.planner import Plan

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"## Sweeps.*?```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    plan = Plan.model_validate(yaml.safe_load(block.group(1)))
    assert [d.configs for d in plan.datasets] == ["all", ["NA", "A", "NAP", "AP"]]
    assert [m.backend for m in plan.models] == ["reference", "vllm", "openai"]
    assert plan.prompts == ["base", "cot"] and plan.samples == 1


def _judge_or_answer(body):
    """Fake server: a verdict for self-evaluation prompts, else an answer that depends on the item."""
    from tests.fakeopenai import completion

    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if "checking answers" in system:
        return 200, completion("Verdict: Incorrect" if "Answer: B" in user else "Verdict: Correct")
    return 200, completion("Answer: B" if len(user) % 2 else "Answer: A")


def test_self_evaluation_pass_in_a_plan_single_and_sharded(work, monkeypatch):
    from tests.fakeopenai import FakeOpenAI

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    with FakeOpenAI(_judge_or_answer) as server:
        plan = work / "judge.yaml"
        plan.write_text(
            "store: judge.duckdb\n"
            "datasets:\n  - path: nota\n    configs: [plus_nota]\n"
            "models:\n"
            f"  - {{name: fake-model, backend: openai, base_url: '{server.base_url}', concurrency: 4}}\n"
            "prompts: [base]\nself_eval: true\ncommit_every: 8\n"
        )
        dry = cli.invoke(app, ["eval", str(plan), "--dry-run"])
        assert dry.exit_code == 0 and "self_eval:base" in dry.output, dry.output
        r = cli.invoke(app, ["eval", str(plan)])
        assert r.exit_code == 0, r.output
        assert "nothing to do" in cli.invoke(app, ["eval", str(plan)]).output
        for i in (0, 1):
            r = cli.invoke(app, ["eval", str(plan), "--shard", f"{i}/2", "--parts", str(work / "jp")])
            assert r.exit_code == 0, r.output
    store = work / "judge.duckdb"
    n_items = json.loads((work / "nota" / "manifest.json").read_text())["configs"]["plus_nota"]["rows"]
    styles = _rows(
        store, "SELECT prompt_style, count(*) FROM predictions JOIN runs USING (run_id) GROUP BY 1 ORDER BY 1"
    )
    assert styles == [("base", n_items), ("self_eval:base", n_items)]
    # every verdict judges the decision it is linked to
    wrong = _rows(
        store,
        "SELECT count(*) FROM predictions d JOIN runs rd USING (run_id) JOIN predictions v USING (item_id) "
        "JOIN runs rv ON rv.run_id = v.run_id "
        "WHERE rd.prompt_style = 'base' AND rv.prompt_style = 'self_eval:base' "
        "AND (v.parsed_label = 'Incorrect') <> (d.raw_output LIKE '%Answer: B%')",
    )
    assert wrong == [(0,)]
    merged = work / "judge-merged.duckdb"
    assert cli.invoke(app, ["store", "ingest", str(work / "jp"), "--store", str(merged)]).exit_code == 0
    q = "SELECT * EXCLUDE (latency_ms) FROM predictions ORDER BY run_id, item_id, sample_index"
    assert _rows(merged, q) == _rows(store, q)


def _slow_answer(body):
    import time

    from tests.fakeopenai import completion

    time.sleep(0.02)
    user = body["messages"][-1]["content"]
    return 200, completion(f"Answer: {'B' if 'B.' in user else 'A'}")


def test_sigkill_of_a_parts_worker_then_resume(work):
    """A real `equipoise eval --parts` process killed with SIGKILL mid-sweep: its committed parts
    stay, anything half-written is never read, and the rerun completes with no loss or duplicate."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.fakeopenai import FakeOpenAI

    parts = work / "kp"
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-not-a-secret", "PYTHONUNBUFFERED": "1"}
    with FakeOpenAI(_slow_answer) as server:
        plan = work / "kill.yaml"
        plan.write_text(
            "datasets:\n  - path: nota\n    configs: [plus_nota, original]\n"
            "models:\n"
            f"  - {{name: fake-model, backend: openai, base_url: '{server.base_url}', concurrency: 2}}\n"
            "commit_every: 5\n"
        )
        cmd = [sys.executable, "-m", "equipoise.cli", "eval", str(plan), "--parts", str(parts)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while len(part_dirs(parts)) < 6 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert proc.poll() is None, "finished before it could be killed: " + proc.stdout.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        first = len(server.requests)
        store = work / "k.duckdb"
        con = connect(store)
        committed = ingest_parts(con, parts).predictions_added
        con.close()
        assert 0 < committed < 200
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        asked_again = len(server.requests) - first
    r = cli.invoke(app, ["store", "ingest", str(parts), "--store", str(store)])
    assert r.exit_code == 0, r.output
    total, distinct = _rows(
        store, "SELECT count(*), count(DISTINCT (run_id, item_id, sample_index)) FROM predictions"
    )[0]
    assert total == distinct == 200
    assert asked_again == 200 - committed  # only what no committed part held was asked again
