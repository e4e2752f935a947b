"""`equipoise run --thinking/--no-thinking`: the request carries the chat-template switch, and the
switch is part of what names the run (so on, off and unset are three runs, each resumable)."""

from __future__ import annotations

import json

import duckdb
from typer.testing import CliRunner

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from tests.fakeopenai import FakeOpenAI, completion


def test_thinking_switch_reaches_the_server_and_names_the_run(tmp_path):
    folder = tmp_path / "nota"
    build_mcq_suite("nota", folder, seed=3)
    store = tmp_path / "s.duckdb"
    cli = CliRunner()
    with FakeOpenAI(lambda body: (200, completion("<think>short</think>\nAnswer: A"))) as server:
        base = ["run", "--dataset", str(folder), "--config", "plus_nota", "--backend", "openai"]
        base += [
            "--model",
            "fake-model",
            "--store",
            str(store),
            "--base-url",
            server.base_url,
            "--limit",
            "3",
        ]
        sent: dict[str, list[dict]] = {}
        for flag in ("--thinking", "--no-thinking", None):
            before = len(server.requests)
            r = cli.invoke(app, base + ([flag] if flag else []), env={"OPENAI_API_KEY": "x"})
            assert r.exit_code == 0, r.output
            sent[str(flag)] = [q["json"] for q in server.requests[before:]]
        before = len(server.requests)
        again = cli.invoke(app, [*base, "--thinking"], env={"OPENAI_API_KEY": "x"})
        assert again.exit_code == 0 and len(server.requests) == before  # resumed: nothing left to ask
    assert all(len(v) == 3 for v in sent.values())
    assert all(b["chat_template_kwargs"] == {"enable_thinking": True} for b in sent["--thinking"])
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in sent["--no-thinking"])
    assert all("chat_template_kwargs" not in b for b in sent["None"])
    con = duckdb.connect(str(store), read_only=True)
    runs = con.execute("SELECT run_id, decoding_json FROM runs").fetchall()
    counts = con.execute("SELECT count(*), count(DISTINCT run_id) FROM predictions").fetchall()[0]
    con.close()
    thinking = [json.loads(d)["thinking"] for _, d in runs]
    assert len(thinking) == 3 and set(thinking) == {True, False, None}
    assert len({rid for rid, _ in runs}) == 3 and counts == (9, 3)
