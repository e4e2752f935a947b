"""The OpenAI path under a server that drops connections: retried, or stored as clear errors that a
rerun of the same command replaces, ending with exactly the rows of an uninterrupted run.

The server (``tests.fakeopenai_scenarios.ScriptedOpenAI``) answers deterministically from the prompt,
with token log-probabilities so option scores are written too. Faults are connections closed without
any response (``before_response``) or halfway through the body (``mid_body``):

* intermittent drops (the first one or two attempts of some items): the backend's retries absorb
  them and the run equals the reference run row for row, option scores included;
* an outage (every request after the first few dropped until the server is "healed"): the first run
  ends normally, but the items it could not get are stored as ``error`` rows whose message names the
  connection failure and the attempts made; running the same call again once the server is back asks
  only for those items and leaves exactly the reference rows: none lost, none duplicated.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.evaluators.backends.openai_backend import OpenAIBackend
from equipoise.evaluators.runner import run
from equipoise.evaluators.store import connect
from tests.fakeopenai_scenarios import Reply, ScriptedOpenAI, completion_body, token_choice

CONFIG = "plus_nota"
LIMIT = 24
PRED_COLS = (
    "run_id, item_id, sample_index, raw_output, parsed_label, parse_method, outcome, "
    "token_logprob_sum, token_logprob_mean, token_logprob_min, n_output_tokens, error"
)  # everything but latency_ms, which differs between any two runs


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fault-test-key")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "nota"
    build_mcq_suite("nota", out, seed=3)
    return out


def _prompt(body: dict[str, Any]) -> str:
    user = body["messages"][-1]["content"]
    if isinstance(user, list):  # content parts
        user = " ".join(p.get("text", "") for p in user)
    return user


def _digest(body: dict[str, Any]) -> int:
    return int(hashlib.sha256(_prompt(body).encode()).hexdigest(), 16)


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """A reply that depends only on the prompt, so every run of the same item gets the same row."""
    letter = "ABC"[_digest(body) % 3]
    alts = [(" A", -2.0), (" B", -1.0), (" C", -3.0)]
    alts = [(t, -0.25 if t.strip() == letter else lp) for t, lp in alts]
    tokens = [("Thinking", -0.5, []), (".\n", -0.1, []), ("Answer", -0.01, []), (":", -0.01, [])]
    tokens.append((f" {letter}", -0.25, alts))
    return completion_body([token_choice(tokens)])


class FaultyServer:
    """Handler for ScriptedOpenAI.

    ``flaky``: by a hash of the prompt, a third of the items lose their first attempt (closed before
    any response) and another third their first two (closed halfway through the body), so with three
    retries every item gets through, whatever order the concurrent requests arrive in.
    ``outage_from``: every request from that call number on is dropped until ``heal()``.
    """

    def __init__(self, flaky: bool = False, outage_from: int | None = None, drop: str = "before_response"):
        self.flaky = flaky
        self.outage_from = outage_from
        self.drop = drop
        self.dropped = 0
        self.healed = False
        self.attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def heal(self) -> None:
        self.healed = True

    def __call__(self, body: dict[str, Any], call: int) -> Reply:
        with self._lock:
            key = _prompt(body)
            self.attempts[key] = attempt = self.attempts.get(key, 0) + 1
            kind: str | None = None
            if self.outage_from is not None and call >= self.outage_from and not self.healed:
                kind = self.drop
            elif self.flaky:
                bucket = (_digest(body) // 3) % 3
                if bucket == 0 and attempt == 1:
                    kind = "before_response"
                elif bucket == 1 and attempt <= 2:
                    kind = "mid_body"
            self.dropped += kind is not None
        return Reply(body=_answer(body), drop=kind)  # type: ignore[arg-type]


def _backend(url: str, max_retries: int) -> OpenAIBackend:
    return OpenAIBackend(
        "fake-model", base_url=url, concurrency=4, timeout=5.0, max_retries=max_retries,
        backoff_base=0.005, backoff_max=0.02,
    )  # fmt: skip


def _run(folder: Path, store: Path, url: str, max_retries: int = 3, limit: int = LIMIT):
    """One invocation, as the CLI makes it: open the store, run, close."""
    con = connect(store)
    backend = _backend(url, max_retries)
    try:
        return run(con, folder, CONFIG, backend, limit=limit, batch=5, progress=False)
    finally:
        backend.close()
        con.close()


def _contents(store: Path) -> tuple[list[tuple], list[tuple], int]:
    con = connect(store, read_only=True)
    try:
        preds = con.execute(f"SELECT {PRED_COLS} FROM predictions ORDER BY ALL").fetchall()
        scores = con.execute("SELECT * FROM option_scores ORDER BY ALL").fetchall()
        runs = con.execute("SELECT count(*) FROM runs").fetchall()[0][0]
    finally:
        con.close()
    return preds, scores, runs


@pytest.fixture(scope="module")
def reference(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple], list[tuple], int]:
    """An uninterrupted run against a healthy server: what every faulty run must end up with."""
    store = tmp_path_factory.mktemp("ref") / "ref.duckdb"
    with ScriptedOpenAI(lambda body, call: Reply(body=_answer(body))) as srv:
        summary = _run(folder, store, srv.base_url)
        assert len(srv.requests) == LIMIT
    assert summary.outcomes.get("error", 0) == 0 and summary.written == LIMIT
    preds, scores, runs = _contents(store)
    assert len(preds) == LIMIT and runs == 1 and len(scores) == 3 * LIMIT
    return preds, scores, runs


def test_intermittent_drops_are_retried_and_match_the_uninterrupted_run(folder, tmp_path, reference):
    store = tmp_path / "flaky.duckdb"
    handler = FaultyServer(flaky=True)
    with ScriptedOpenAI(handler) as srv:
        summary = _run(folder, store, srv.base_url)
        first = len(srv.requests)
        again = _run(folder, store, srv.base_url)
        assert len(srv.requests) == first  # the rerun had nothing to ask
    # both kinds of drop happened, each cost one more request, and none ended as an error
    assert handler.dropped >= LIMIT // 4 and first == LIMIT + handler.dropped
    assert max(handler.attempts.values()) == 3
    assert summary.outcomes.get("error", 0) == 0
    assert again.requested == 0 and again.skipped_existing == LIMIT
    assert _contents(store) == reference


@pytest.mark.parametrize("drop", ["before_response", "mid_body"])
def test_outage_leaves_clear_errors_and_a_rerun_completes_without_duplicates(
    folder, tmp_path, reference, drop
):
    store = tmp_path / "outage.duckdb"
    handler = FaultyServer(outage_from=10, drop=drop)
    with ScriptedOpenAI(handler) as srv:
        first = _run(folder, store, srv.base_url, max_retries=2)
        n_err = first.outcomes.get("error", 0)
        assert 0 < n_err < LIMIT and first.written == LIMIT
        con = connect(store, read_only=True)
        errors = [
            r[0] for r in con.execute("SELECT error FROM predictions WHERE outcome = 'error'").fetchall()
        ]
        con.close()
        for e in errors:  # the stored reason says what happened and how often it was tried
            assert e.startswith("APIConnectionError") and "gave up after 3 attempts" in e, e
            assert "sk-fault-test-key" not in e
        # a rerun over the first few items only (answered before the outage) asks nothing and keeps
        # the error rows of the items it does not cover: they are not results, but they are counted
        partial = _run(folder, store, srv.base_url, max_retries=2, limit=4)
        assert partial.requested == 0 and sum(partial.outcomes.values()) == LIMIT
        assert partial.outcomes.get("error", 0) == n_err
        handler.heal()
        asked_before = len(srv.requests)
        second = _run(folder, store, srv.base_url, max_retries=2)
        asked = len(srv.requests) - asked_before
    # the rerun asked exactly for the failed items, and the store now equals the uninterrupted run
    assert second.requested == asked == n_err
    assert second.skipped_existing == LIMIT - n_err
    assert second.outcomes.get("error", 0) == 0
    assert _contents(store) == reference
