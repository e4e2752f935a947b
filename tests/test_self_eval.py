"""Self-evaluation runs (seed 003) against a local OpenAI-compatible server.

A scripted server answers decision prompts with a known choice per case and judges each given answer
with a known verdict, so the expected store rows and the expected ``self_eval_filtered_accuracy``
are computed here from the script alone (pandas), independently of the runner and the SQL.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from equipoise.evaluators.backends.base import Decoding
from equipoise.evaluators.backends.openai_backend import OpenAIBackend
from equipoise.evaluators.ingest import read_config
from equipoise.evaluators.metrics import compute
from equipoise.evaluators.parsing import Parsed, parse_verdict
from equipoise.evaluators.runner import run, run_self_eval
from equipoise.evaluators.store import connect
from tests.fakeopenai import FakeOpenAI, completion

# decision replies, by choice index: (reply text or None for an HTTP 500, the label it states)
DECISION_REPLIES: list[tuple[str | None, str | None]] = [
    ("Scoring the items.\nAnswer: Met", "Met"),
    ("Answer: Not met", "Not met"),
    ("The data are missing.\nAnswer: Unable to determine", "Unable to determine"),
    ("I am unsure about this one.", None),
    (None, None),
]
# the judge's reply to each decision reply (None: no verdict can be read)
VERDICT_REPLIES: dict[int, tuple[str, str | None]] = {
    0: ("Rechecked the total.\nVerdict: Correct", "Correct"),
    1: ("**Incorrect** - the threshold is not reached", "Incorrect"),
    2: ("Correct", "Correct"),
    3: ("Hard to say without more detail.", None),
}


class Script:
    """Responder: the decision choice depends on the case (via its vignette), the verdict on the
    answer shown. Records which kind of prompt each request was."""

    def __init__(self, vignettes: list[str], errors: bool = True) -> None:
        n = len(DECISION_REPLIES) if errors else len(DECISION_REPLIES) - 1
        self.choice: dict[str, int] = {}
        for v in vignettes:
            self.choice.setdefault(v, len(self.choice) % n)
        self.kinds: list[str] = []

    def choice_of(self, text: str) -> int:
        hits = {c for v, c in self.choice.items() if v in text}
        assert len(hits) == 1, "the prompt must contain exactly one known case"
        return hits.pop()

    def __call__(self, body: dict) -> tuple[int, object]:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "reviewing a colleague" in system:
            self.kinds.append("judge")
            answer = user.split("Given answer:\n", 1)[1]
            k = next(i for i, (t, _) in enumerate(DECISION_REPLIES) if t is not None and answer.startswith(t))
            return 200, completion(VERDICT_REPLIES[k][0])
        self.kinds.append("decide")
        text, _ = DECISION_REPLIES[self.choice_of(user)]
        if text is None:
            return 500, {"error": {"message": "scripted failure"}}
        return 200, completion(text)


@pytest.fixture(scope="module")
def clindet(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("se") / "ds"
    build_clindet(folder, per_system=3, seed=5, systems=["curb_65", "wells_pe"], progress=False)
    return folder


def _backend(server: FakeOpenAI, model: str = "fake-model") -> OpenAIBackend:
    return OpenAIBackend(model, base_url=server.base_url, concurrency=2, max_retries=0)


def _decide(con, folder, server, style="cot"):
    return run(con, folder, "all", _backend(server), style=style, progress=False)


def _expected(folder: Path, script: Script) -> pd.DataFrame:
    """One row per case: what the script makes the model decide and the judge say."""
    recs = read_config(folder, "all").records
    rows = []
    for r in recs:
        k = script.choice[r.vignette]
        label = DECISION_REPLIES[k][1]
        verdict = VERDICT_REPLIES[k][1] if k in VERDICT_REPLIES else None
        rows.append(
            {
                "item_id": r.case_id,
                "condition": r.condition,
                "label": label,
                "correct": label == r.label,
                "judged": k in VERDICT_REPLIES,  # errors get no verdict row
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


def test_self_eval_rows_and_metric_link(clindet, tmp_path):
    recs = read_config(clindet, "all").records
    script = Script([r.vignette for r in recs])
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(script) as server:
        dec = _decide(con, clindet, server)
        n_decide = len(script.kinds)
        sev = run_self_eval(con, clindet, dec.run_id, _backend(server), progress=False)
        judge_requests = server.requests[n_decide:]
    exp = _expected(clindet, script)
    assert len(exp) == len(recs) and exp.judged.sum() < len(exp)  # the script has errors to skip
    assert set(script.kinds[n_decide:]) == {"judge"}
    assert sev.requested == sev.written == exp.judged.sum()
    assert sev.skipped_no_answer == (~exp.judged).sum() > 0

    # each judge request is a new conversation: system + user, showing the case and the raw answer
    for req in judge_requests:
        msgs = req["json"]["messages"]
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert "Verdict: <your choice>" in msgs[1]["content"]
    shown = {script.choice_of(r["json"]["messages"][1]["content"]) for r in judge_requests}
    assert shown == set(VERDICT_REPLIES)

    run_row = con.execute(
        "SELECT model, backend, prompt_style, prompt_template_id, dataset_id, config, decoding_json "
        "FROM runs WHERE run_id = ?",
        [sev.run_id],
    ).fetchall()[0]
    dec_row = con.execute(
        "SELECT model, backend, dataset_id, config FROM runs WHERE run_id = ?", [dec.run_id]
    ).fetchall()[0]
    assert run_row[:2] == dec_row[:2] and run_row[4:6] == dec_row[2:]
    assert run_row[2:4] == ("self_eval:cot", "clindet_self_evaluation")
    link = json.loads(run_row[6])["self_eval"]
    assert link == {"of_run": dec.run_id, "judge_backend": "openai", "judge_model": "fake-model"}

    got = con.execute(
        "SELECT item_id, sample_index, parsed_label, outcome, raw_output FROM predictions WHERE run_id = ?",
        [sev.run_id],
    ).df()
    assert (got.sample_index == 0).all()
    want = exp[exp.judged].set_index("item_id")
    got = got.set_index("item_id").loc[want.index]
    assert got.parsed_label.tolist() == want.verdict.tolist()
    assert got.outcome.tolist() == ["answered" if pd.notna(v) else "unparsed" for v in want.verdict]
    assert (got.raw_output != "").all()
    assert con.execute("SELECT count(*) FROM option_scores WHERE run_id = ?", [sev.run_id]).fetchall() == [
        (0,)
    ]

    # the metric reads exactly this link: compare with a pandas computation from the script
    m = compute(con, "self_eval_filtered_accuracy").set_index("condition")
    m = m[m.prompt_style == "cot"]
    con.close()
    for cond, g in exp.groupby("condition"):
        row = m.loc[cond]
        v = g[g.judged]
        jc = v[v.verdict == "Correct"]
        assert row.n == len(g)
        assert row.accuracy == pytest.approx(g.correct.mean(), abs=1e-12)
        assert row.n_self_evaluated == len(v)
        assert row.n_judged_correct == len(jc)
        assert row.n_verdict_unparsed == v.verdict.isna().sum()
        if len(v):
            assert row.judged_correct_rate == pytest.approx(len(jc) / len(v), abs=1e-12)
            assert row.accuracy_self_evaluated == pytest.approx(v.correct.mean(), abs=1e-12)
        if len(jc):
            assert row.filtered_accuracy == pytest.approx(jc.correct.mean(), abs=1e-12)
        else:
            assert pd.isna(row.filtered_accuracy)


class _Crash(Exception):
    pass


class Crashing:
    """A backend that dies after ``after`` results, as a killed process would."""

    def __init__(self, inner: OpenAIBackend, after: int) -> None:
        self.inner, self.after = inner, after
        self.name, self.model = inner.name, inner.model

    def generate(self, requests):
        for i, res in enumerate(self.inner.generate(requests)):
            if i == self.after:
                raise _Crash
            yield res


def _wait_for_stray_requests(timeout: float = 30.0) -> None:
    """Let the crashed run's in-flight requests reach the server before counting requests.

    The backend's worker threads cannot be cancelled once a request is on the wire; after a crash
    they finish in the background. Counting the server's requests before they end made the count
    depend on machine load (one extra request seen on a busy 2-core machine).
    """
    deadline = time.monotonic() + timeout
    while any(t.name.startswith("equipoise-openai") for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise AssertionError("backend worker threads still running after the crash")
        time.sleep(0.01)


def test_resume_after_crash_and_idempotent_rerun(clindet, tmp_path):
    recs = read_config(clindet, "all").records
    script = Script([r.vignette for r in recs])
    exp = _expected(clindet, script)
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(script) as server:
        dec = _decide(con, clindet, server, style="base")
        with pytest.raises(_Crash):
            run_self_eval(con, clindet, dec.run_id, Crashing(_backend(server), 7), batch=3, progress=False)
        rid = con.execute("SELECT run_id FROM runs WHERE prompt_style = 'self_eval:base'").fetchall()[0][0]
        committed = con.execute("SELECT count(*) FROM predictions WHERE run_id = ?", [rid]).fetchall()[0][0]
        assert committed == 6
        _wait_for_stray_requests()
        before = len(server.requests)
        again = run_self_eval(con, clindet, dec.run_id, _backend(server), batch=3, progress=False)
        asked = len(server.requests) - before
        third = run_self_eval(con, clindet, dec.run_id, _backend(server), progress=False)
        assert len(server.requests) - before == asked  # nothing left to ask
    assert again.run_id == third.run_id == rid
    assert asked == again.requested == exp.judged.sum() - committed
    assert again.skipped_existing == committed
    assert third.requested == third.written == 0
    total, distinct = con.execute(
        "SELECT count(*), count(DISTINCT (item_id, sample_index)) FROM predictions WHERE run_id = ?", [rid]
    ).fetchall()[0]
    assert total == distinct == exp.judged.sum()
    con.close()


def test_run_id_names_the_judged_run_and_settings(clindet, tmp_path):
    recs = read_config(clindet, "all").records
    script = Script([r.vignette for r in recs])
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(script) as server:
        base = _decide(con, clindet, server, style="base")
        safe = _decide(con, clindet, server, style="safe")
        ids = {
            run_self_eval(con, clindet, base.run_id, _backend(server), progress=False, limit=2).run_id,
            run_self_eval(con, clindet, safe.run_id, _backend(server), progress=False, limit=2).run_id,
            run_self_eval(
                con,
                clindet,
                base.run_id,
                _backend(server),
                Decoding(temperature=0.7),
                progress=False,
                limit=2,
            ).run_id,
        }
    styles = sorted(x[0] for x in con.execute("SELECT prompt_style FROM runs").fetchall())
    con.close()
    assert len(ids) == 3 and not ids & {base.run_id, safe.run_id}
    assert styles == ["base", "safe", "self_eval:base", "self_eval:base", "self_eval:safe"]


def test_refusals(clindet, tmp_path):
    recs = read_config(clindet, "all").records
    script = Script([r.vignette for r in recs])
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(script) as server:
        dec = _decide(con, clindet, server, style="base")
        with pytest.raises(ValueError, match="same model"):
            run_self_eval(con, clindet, dec.run_id, _backend(server, "other-model"), progress=False)
        with pytest.raises(ValueError, match="one verdict"):
            run_self_eval(con, clindet, dec.run_id, _backend(server), Decoding(n=2), progress=False)
        with pytest.raises(ValueError, match="no run"):
            run_self_eval(con, clindet, "nope", _backend(server), progress=False)
        sev = run_self_eval(con, clindet, dec.run_id, _backend(server), progress=False, limit=1)
        with pytest.raises(ValueError, match="itself a self-evaluation"):
            run_self_eval(con, clindet, sev.run_id, _backend(server), progress=False)
        with pytest.raises(ValueError, match="used"):
            other = read_config(clindet, "complete")
            run_self_eval(con, clindet, dec.run_id, _backend(server), progress=False, loaded=other)
        # another judge, explicitly allowed: linked to the judged run, the judge recorded
        cross = run_self_eval(
            con,
            clindet,
            dec.run_id,
            _backend(server, "other-model"),
            progress=False,
            limit=1,
            allow_other_model=True,
        )
    model, dj = con.execute(
        "SELECT model, decoding_json FROM runs WHERE run_id = ?", [cross.run_id]
    ).fetchall()[0]
    con.close()
    assert model == "fake-model" and json.loads(dj)["self_eval"]["judge_model"] == "other-model"
    assert cross.run_id != sev.run_id


def test_mcq_self_eval(tmp_path):
    folder = tmp_path / "nota"
    build_mcq_suite("nota", folder, seed=3)
    seen: list[str] = []

    def responder(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "checking answers" in system:
            seen.append(user)
            return 200, completion("Verdict: Incorrect" if "Answer: B" in user else "Verdict: Correct")
        return 200, completion("Answer: B" if len(user) % 2 else "Answer: A")

    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(responder) as server:
        dec = run(con, folder, "plus_nota", _backend(server), limit=6, progress=False)
        sev = run_self_eval(con, folder, dec.run_id, _backend(server), progress=False)
    rows = con.execute(
        "SELECT d.raw_output, v.parsed_label FROM predictions d JOIN predictions v "
        "ON v.item_id = d.item_id AND v.sample_index = d.sample_index "
        "WHERE d.run_id = ? AND v.run_id = ?",
        [dec.run_id, sev.run_id],
    ).fetchall()
    style, tpl = con.execute(
        "SELECT prompt_style, prompt_template_id FROM runs WHERE run_id = ?", [sev.run_id]
    ).fetchall()[0]
    con.close()
    assert (style, tpl) == ("self_eval:base", "mcq_self_evaluation")
    assert len(rows) == 6 == len(seen)
    assert all(("Answer: B" in d) == (v == "Incorrect") for d, v in rows)
    # the judge sees the options, so a bare letter can be checked
    assert all(re.search(r"^A\. ", u, flags=re.MULTILINE) for u in seen)


@pytest.mark.parametrize(
    ("text", "label", "method"),
    [
        ("Verdict: Correct", "Correct", "answer_line"),
        ("Reasoning...\nVerdict: **Incorrect**.", "Incorrect", "answer_line"),
        ("Verdict: Incorrect - the total is 2, not 3", "Incorrect", "answer_line"),
        ("Verdict: not correct", None, "unparsed"),
        ("Verdict: the answer isn't correct", None, "unparsed"),
        ("The given answer is correct, though the reasoning is thin.", None, "unparsed"),
        ("[Correct]", "Correct", "bracket"),
        ("incorrect", "Incorrect", "whole_reply"),
        ("Incorrect.\n\nThe criterion needs two findings.", "Incorrect", "leading_word"),
        ("Correct at first sight.\nIncorrect after checking.", None, "unparsed"),
        ("", None, "unparsed"),
    ],
)
def test_parse_verdict(text, label, method):
    assert parse_verdict(text) == Parsed(label, method)


def test_cli_self_eval(clindet, tmp_path):
    recs = read_config(clindet, "all").records
    script = Script([r.vignette for r in recs], errors=False)  # the CLI retries 5xx with backoff
    exp = _expected(clindet, script)
    store = tmp_path / "s.duckdb"
    cli = CliRunner()
    common = ["--dataset", str(clindet), "--config", "all", "--store", str(store), "--model", "fake-model"]
    with FakeOpenAI(script) as server:
        remote = ["--backend", "openai", "--base-url", server.base_url, "--concurrency", "2"]
        r = cli.invoke(app, ["run", *common, *remote, "--prompt", "safe"], env={"OPENAI_API_KEY": "x"})
        assert r.exit_code == 0, r.output
        con = duckdb.connect(str(store), read_only=True)
        rid = con.execute("SELECT run_id FROM runs").fetchall()[0][0]
        con.close()
        r = cli.invoke(app, ["run", *common, *remote, "--self-eval-of", rid], env={"OPENAI_API_KEY": "x"})
        assert r.exit_code == 0, r.output
        assert "self-evaluation of" in r.output and f"Correct {(exp.verdict == 'Correct').sum()}" in r.output
        bad = cli.invoke(app, ["run", *common, "--backend", "reference", "--self-eval-of", rid])
        assert bad.exit_code == 2 and "--self-eval-of needs" in bad.output
        bad = cli.invoke(app, ["run", *common, *remote, "--self-eval-of", rid, "--prompt", "cot"])
        assert bad.exit_code == 2 and "--prompt is taken" in bad.output
    con = duckdb.connect(str(store), read_only=True)
    styles = dict(con.execute("SELECT prompt_style, count(*) FROM runs GROUP BY ALL").fetchall())
    con.close()
    assert styles == {"safe": 1, "self_eval:safe": 1}
