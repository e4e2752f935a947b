"""Security and concurrency: a second writer fails cleanly; secrets never reach stored outputs;
no remote code is ever trusted."""

from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from equipoise.evaluators.store import StoreLockedError, connect
from tests.fakeopenai import FakeOpenAI, completion
from tests.store_holder import held_elsewhere

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-SECRET-0123456789abcdef"


def test_second_writer_fails_cleanly_and_store_survives(tmp_path):
    store = tmp_path / "s.duckdb"
    con = connect(store)
    con.execute("CREATE TABLE keep AS SELECT 42 AS answer")
    con.close()
    with held_elsewhere(store, "INSERT INTO keep VALUES (43)"):
        with pytest.raises(StoreLockedError, match="another process is writing"):
            connect(store)
        r = CliRunner().invoke(app, ["sql", "--store", str(store), "SELECT 1"])
        assert r.exit_code == 2 and "another process is writing" in " ".join(r.output.split())
    time.sleep(0.2)
    con = duckdb.connect(str(store), read_only=True)
    assert sorted(con.execute("SELECT * FROM keep").fetchall()) == [(42,), (43,)]
    con.close()


def test_secret_key_never_reaches_store_cards_or_output(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    folder = tmp_path / "nota"
    build_mcq_suite("nota", folder, seed=1)

    def responder(body):
        return 200, completion("Let me think.\nAnswer: A")

    store = tmp_path / "store.duckdb"
    with FakeOpenAI(responder) as server:
        r = CliRunner().invoke(
            app,
            [
                "run",
                "--dataset",
                str(folder),
                "--config",
                "plus_nota",
                "--backend",
                "openai",
                "--model",
                "fake",
                "--store",
                str(store),
                "--base-url",
                server.base_url,
                "--prompt",
                "cot",
                "--limit",
                "10",
            ],
        )
        assert r.exit_code == 0, r.output
        assert all(a == f"Bearer {SECRET}" for a in server.auth_seen)  # it was really used
    rep = tmp_path / "report"
    r2 = CliRunner().invoke(app, ["report", "--store", str(store), "--out", str(rep)])
    assert r2.exit_code == 0
    assert SECRET not in r.output + r2.output
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_no_remote_code_is_trusted():
    offenders = []
    for path in list((ROOT / "equipoise").rglob("*.py")) + list((ROOT / "benchmarks").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"trust_remote_code\s*=\s*True", line):
                offenders.append(f"{path}:{i}")
    assert not offenders, offenders
