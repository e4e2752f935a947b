"""The optional LLM parse fallback, against a local OpenAI-compatible server serving two models: the
one under test and a helper that reads the replies no pattern could parse. The expected rows are
written down from the script, not from the runner."""

from __future__ import annotations

import json
import zlib

import duckdb
import pytest
from typer.testing import CliRunner

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from equipoise.evaluators.backends.openai_backend import OpenAIBackend
from equipoise.evaluators.ingest import read_config
from equipoise.evaluators.parsing import DECISION, VERDICTS, read_fallback_reply
from equipoise.evaluators.runner import ParseFallback, run, run_self_eval
from equipoise.evaluators.store import connect
from tests.fakeopenai import FakeOpenAI, completion

# main model reply per script slot, and what the helper answers when shown that reply
# (None: HTTP 400). Slot 0 parses by regex, so the helper must never see it.
MCQ_SCRIPT: list[tuple[str, str | None]] = [
    ("Answer: A", "never asked"),
    ("I would pick the second option.", "B"),
    ("Probably the last one on the list.", "**LAST**"),  # the item's last label, in markdown
    ("Hmm, hard to choose.", "NONE"),
    ("Something outside the list.", "Z"),
    ("No idea at all.", None),
]
# (parsed_label, parse_method, outcome) expected for each slot when the fallback is on
MCQ_EXPECTED = [
    ("A", "answer_line", "answered"),
    ("B", "llm_fallback", "answered"),
    ("LAST", "llm_fallback", "answered"),  # the NOTA option: a choice, not an abstention
    (None, "llm_fallback_failed", "unparsed"),
    (None, "llm_fallback_failed", "unparsed"),
    (None, "llm_fallback_failed", "unparsed"),
]


def _slot(text: str, n: int) -> int:
    return zlib.crc32(text.encode()) % n


class TwoModels:
    """Responder for 'main' (answers by slot of the question) and 'helper' (reads the quoted reply)."""

    def __init__(self, script: list[tuple[str, str | None]]) -> None:
        self.script = script
        self.helper_bodies: list[dict] = []

    def __call__(self, body: dict) -> tuple[int, object]:
        user = body["messages"][-1]["content"]
        if body["model"] == "helper":
            self.helper_bodies.append(body)
            quoted = user.split("<<<REPLY\n", 1)[1].split("\nREPLY>>>", 1)[0]
            answer = next(h for t, h in self.script if t == quoted)
            if answer is not None and "LAST" in answer:
                listed = user.split("exactly as listed (", 1)[1].split(")", 1)[0].split(", ")
                answer = answer.replace("LAST", listed[-1])
            return (400, {"error": {"message": "scripted"}}) if answer is None else (200, completion(answer))
        if "reviewing a colleague" in body["messages"][0]["content"]:
            return 200, completion("Hard to say." if "Answer: Met" in user else "Verdict: Correct")
        return 200, completion(self.script[_slot(body["messages"][-1]["content"].split("\n\n")[0], 6)][0])


@pytest.fixture(scope="module")
def nota(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pf") / "nota"
    build_mcq_suite("nota", folder, seed=3)
    return folder


def _be(server, model):
    return OpenAIBackend(model, base_url=server.base_url, concurrency=2, max_retries=0)


def _rows(con, rid):
    return {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT item_id, parsed_label, parse_method, outcome, raw_output "
            "FROM predictions WHERE run_id = ?",
            [rid],
        ).fetchall()
    }


def test_fallback_reads_only_unparsed_replies(nota, tmp_path):
    recs = read_config(nota, "plus_nota").records[:24]
    slots = {r.item_id: _slot(r.question, 6) for r in recs}
    assert set(slots.values()) == set(range(6))  # every scripted case occurs
    resp = TwoModels(MCQ_SCRIPT)
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(resp) as server:
        plain = run(con, nota, "plus_nota", _be(server, "main"), limit=24, progress=False, batch=5)
        assert resp.helper_bodies == []  # off by default
        fb = ParseFallback(_be(server, "helper"))
        with_fb = run(
            con, nota, "plus_nota", _be(server, "main"), limit=24, progress=False, batch=5, parse_fallback=fb
        )
        n_helper = len(resp.helper_bodies)
        again = run(con, nota, "plus_nota", _be(server, "main"), limit=24, progress=False, parse_fallback=fb)
        assert len(resp.helper_bodies) == n_helper and again.requested == 0 and again.run_id == with_fb.run_id
    assert plain.run_id != with_fb.run_id

    got_plain, got_fb = _rows(con, plain.run_id), _rows(con, with_fb.run_id)
    last = {r.item_id: r.options[-1].label for r in recs}
    for item, k in slots.items():
        label, method, outcome = MCQ_EXPECTED[k]
        assert got_fb[item][:3] == (last[item] if label == "LAST" else label, method, outcome), (item, k)
        assert got_fb[item][3] == MCQ_SCRIPT[k][0]  # the model's own text is kept
        assert got_plain[item][:3] == (
            ("A", "answer_line", "answered") if k == 0 else (None, "unparsed", "unparsed")
        )
    assert n_helper == sum(k != 0 for k in slots.values())

    # the helper gets a short greedy request showing the options and the reply, and no logprobs
    by_item = {r.item_id: r for r in recs}
    for body in resp.helper_bodies:
        assert body["temperature"] == 0 and body["max_tokens"] == 16 and "logprobs" not in body
        user = body["messages"][-1]["content"]
        rec = next(r for r in by_item.values() if all(f"{o.label}. {o.text}" in user for o in r.options))
        assert MCQ_SCRIPT[slots[rec.item_id]][0] in user

    dj = {r[0]: json.loads(r[1]) for r in con.execute("SELECT run_id, decoding_json FROM runs").fetchall()}
    con.close()
    assert "parse_fallback" not in dj[plain.run_id]
    assert dj[with_fb.run_id]["parse_fallback"]["model"] == "helper"


def test_fallback_abstain_label_and_self_eval_verdicts(tmp_path):
    folder = tmp_path / "cd"
    build_clindet(folder, per_system=2, seed=2, systems=["curb_65"], progress=False)
    script = [
        ("Answer: Met", "never asked"),
        ("It can't be settled from what is written.", "Unable to determine"),
        ("Leaning towards the criterion being satisfied.", "Met"),
    ]

    class Resp(TwoModels):
        def __call__(self, body):
            if body["model"] == "main" and "reviewing a colleague" not in body["messages"][0]["content"]:
                return 200, completion(self.script[_slot(body["messages"][-1]["content"], 3)][0])
            if body["model"] == "helper" and "Hard to say." in body["messages"][-1]["content"]:
                self.helper_bodies.append(body)
                return 200, completion("Incorrect")
            return super().__call__(body)

    resp = Resp(script)
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(resp) as server:
        fb = ParseFallback(_be(server, "helper"))
        dec = run(con, folder, "all", _be(server, "main"), progress=False, parse_fallback=fb)
        n_dec_helper = len(resp.helper_bodies)
        sev = run_self_eval(con, folder, dec.run_id, _be(server, "main"), progress=False, parse_fallback=fb)
    d, v = _rows(con, dec.run_id), _rows(con, sev.run_id)
    con.close()
    want = {
        script[0][0]: ("Met", "answer_line", "answered"),
        script[1][0]: ("Unable to determine", "llm_fallback", "abstained"),
        script[2][0]: ("Met", "llm_fallback", "answered"),
    }
    assert {x[3] for x in d.values()} == set(want)
    for row in d.values():
        assert row[:3] == want[row[3]]
    assert n_dec_helper == sum(row[3] != script[0][0] for row in d.values())
    # verdicts: 'Hard to say.' follows the decisions stated as 'Answer: Met'; the helper reads it
    assert len(v) == len(d)
    for item, row in v.items():
        if d[item][3] == "Answer: Met":
            assert row[:3] == ("Incorrect", "llm_fallback", "answered")
        else:
            assert row[:3] == ("Correct", "answer_line", "answered")


@pytest.mark.parametrize(
    ("reply", "labels", "want"),
    [
        ("B", ("A", "B", "C"), "B"),
        ("**B**", ("A", "B", "C"), "B"),
        ("(C).", ("A", "B", "C"), "C"),
        ("Answer: A", ("A", "B", "C"), "A"),
        ("NONE", ("A", "B", "C"), None),
        ("D", ("A", "B", "C"), None),
        ("b", ("A", "B", "C"), None),
        ("The reply seems to pick B, maybe C", ("A", "B", "C"), None),
        ("Not met", DECISION, "Not met"),
        ("unable to determine", DECISION, "Unable to determine"),
        ("Met or Not met", DECISION, None),
        ("Incorrect", VERDICTS, "Incorrect"),
        ("NONE", VERDICTS, None),
    ],
)
def test_read_fallback_reply_is_strict(reply, labels, want):
    assert read_fallback_reply(reply, labels) == want


def test_cli_parse_fallback_model(nota, tmp_path):
    store = tmp_path / "s.duckdb"
    resp = TwoModels(MCQ_SCRIPT)
    with FakeOpenAI(resp) as server:
        args = [
            "run",
            "--dataset",
            str(nota),
            "--config",
            "plus_nota",
            "--backend",
            "openai",
            "--model",
            "main",
        ]
        args += ["--store", str(store), "--base-url", server.base_url, "--limit", "12"]
        r = CliRunner().invoke(app, [*args, "--parse-fallback-model", "helper"], env={"OPENAI_API_KEY": "x"})
        assert r.exit_code == 0, r.output
        bad = CliRunner().invoke(
            app,
            [
                *args[:6],
                "reference",
                "--model",
                "oracle",
                "--store",
                str(store),
                "--parse-fallback-model",
                "x",
            ],
        )
        assert bad.exit_code == 2 and "--parse-fallback-model needs" in bad.output
    con = duckdb.connect(str(store), read_only=True)
    methods = dict(con.execute("SELECT parse_method, count(*) FROM predictions GROUP BY ALL").fetchall())
    con.close()
    assert methods.get("llm_fallback", 0) > 0 and "unparsed" not in methods
    assert sum(methods.values()) == 12
