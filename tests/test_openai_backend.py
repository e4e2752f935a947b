"""The ``openai`` backend against local fake servers: mapping, retries, timeouts, malformed payloads,
bounded concurrency, key hygiene, and reading option log-probabilities at the answer position."""

from __future__ import annotations

import logging
import math
import socket
import time

import pytest

from equipoise.evaluators.backends.base import Decoding, GenerationRequest, Sample, TokenLogprob
from equipoise.evaluators.backends.openai_backend import (
    OpenAIBackend,
    answer_option_logprobs,
    retry_after_seconds,
)
from tests.fakeopenai import FakeOpenAI, completion
from tests.fakeopenai_scenarios import (
    InFlight,
    Reply,
    ScriptedOpenAI,
    completion_body,
    sequence,
    simple_tokens,
    text_choice,
    token_choice,
)

KEY_ENV = "EQUIPOISE_TEST_OPENAI_KEY"
SECRET = "sk-test-DoNotLeak-1234567890abcdef"
FAST = {"backoff_base": 0.001, "backoff_max": 0.02}


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


@pytest.fixture(scope="module")
def _shared_fake():
    # one FakeOpenAI for the module: its shutdown waits out a 0.5 s poll, which would dominate each test
    with FakeOpenAI(lambda body: (500, "no responder set")) as f:
        yield f


@pytest.fixture
def fake(_shared_fake):
    _shared_fake.requests.clear()
    _shared_fake.auth_seen.clear()
    return _shared_fake


def backend(url: str, **kw) -> OpenAIBackend:
    opts = {"api_key_env": KEY_ENV, "timeout": 5.0, "max_retries": 2, **FAST, **kw}
    return OpenAIBackend("fake-model", base_url=url, **opts)


def req(rid: str = "r0", content: str = "Q?", **dec) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, messages=[{"role": "user", "content": content}], decoding=Decoding(**dec)
    )


def run(b: OpenAIBackend, *reqs: GenerationRequest):
    out = {r.request_id: r for r in b.generate(reqs)}
    assert len(out) == len(reqs)
    return out


def no_samples_error(res, prefix: str) -> str:
    assert res.samples == []
    assert res.error is not None and res.error.startswith(prefix), res.error
    return res.error


# -- happy path ------------------------------------------------------------------------------------------
COT = [
    ("Let", -0.5, [("Let", -0.5), ("The", -1.2)]),
    (" me", -0.01, []),
    (" check", -0.2, []),
    (" option", -0.3, []),
    (" B", -0.4, [(" B", -0.4), (" A", -1.5)]),
    (".", -0.1, []),
    ("\n", -0.1, []),
    ("Answer", -0.05, [("Answer", -0.05)]),
    (":", -0.01, [(":", -0.01)]),
    (" C", -0.3, [(" C", -0.3), (" B", -1.6), (" A", -3.2), ("C", -4.0), (" The", -6.0)]),
]


def test_happy_path_n3_with_logprobs(fake):
    choices = [
        token_choice(COT, index=2),
        token_choice([("B", -0.1, [("B", -0.1), ("A", -2.4)])], index=0, finish_reason="stop"),
        token_choice(simple_tokens(["x", "y", "z"]), index=1, finish_reason="length"),
    ]
    fake.responder = lambda body: (200, completion_body(choices, completion_tokens=14))
    f = fake
    res = run(backend(f.base_url), req(n=3, temperature=0.7, top_p=0.9, seed=7, top_logprobs=5))["r0"]
    sent = f.requests[0]["json"]
    assert sent["model"] == "fake-model" and sent["messages"] == [{"role": "user", "content": "Q?"}]
    params = (sent["n"], sent["temperature"], sent["top_p"], sent["seed"], sent["max_tokens"])
    assert params == (3, 0.7, 0.9, 7, 512)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5
    assert "chat_template_kwargs" not in sent
    assert res.error is None and res.attempts == 1 and res.latency_ms is not None and res.latency_ms > 0
    assert [s.index for s in res.samples] == [0, 1, 2]
    s0, s1, s2 = res.samples
    assert s0.text == "B" and s0.tokens == [TokenLogprob(token="B", logprob=-0.1, top={"B": -0.1, "A": -2.4})]
    assert s1.finish_reason == "length" and [t.token for t in s1.tokens] == ["x", "y", "z"]
    assert s2.text == "Let me check option B.\nAnswer: C"
    assert s2.tokens[-1].top == {" C": -0.3, " B": -1.6, " A": -3.2, "C": -4.0, " The": -6.0}
    # usage is a total over 3 choices: each sample gets its own token count, never a split guess
    assert [s.n_output_tokens for s in res.samples] == [1, 3, len(COT)]


def test_single_choice_uses_usage_and_no_logprobs_when_not_asked(fake):
    fake.responder = lambda body: (200, completion("C"))
    f = fake
    res = run(backend(f.base_url), req(logprobs=False, thinking=False))["r0"]
    sent = f.requests[0]["json"]
    assert "logprobs" not in sent and "top_logprobs" not in sent
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    (s,) = res.samples
    assert s.text == "C" and s.tokens is None and s.n_output_tokens == 1 and s.finish_reason == "stop"


def test_many_requests_each_get_one_result(fake):
    def responder(body):
        return 200, completion(body["messages"][0]["content"].upper())

    fake.responder = responder
    f = fake
    out = run(backend(f.base_url, concurrency=3), *[req(f"r{i}", f"q{i}") for i in range(10)])
    assert {rid: r.samples[0].text for rid, r in out.items()} == {f"r{i}": f"Q{i}" for i in range(10)}


def test_image_is_sent_as_content_part_and_missing_file_is_an_error(tmp_path, fake):
    img = tmp_path / "x.png"
    img.write_bytes(b"\x89PNG fake")
    fake.responder = lambda body: (200, completion("A"))
    f = fake
    b = backend(f.base_url)
    ok = GenerationRequest(
        request_id="ok", messages=[{"role": "user", "content": "Q"}], decoding=Decoding(), image=str(img)
    )
    bad = GenerationRequest(
        request_id="bad",
        messages=[{"role": "user", "content": "Q"}],
        decoding=Decoding(),
        image=str(tmp_path / "nope.png"),
    )
    out = run(b, ok, bad)
    parts = f.requests[0]["json"]["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "Q"}
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert out["ok"].error is None
    assert "image file not found" in no_samples_error(out["bad"], "BadRequest")
    assert len(f.requests) == 1


# -- retries ---------------------------------------------------------------------------------------------
RATE = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}


def test_429_twice_then_success_honours_capped_retry_after():
    ok = Reply(body=completion("A"))
    limited = Reply(429, RATE, headers={"Retry-After": "30"})  # capped at backoff_max
    with ScriptedOpenAI(sequence(limited, limited, ok)) as srv:
        t0 = time.monotonic()
        res = run(backend(srv.base_url, backoff_base=0.001, backoff_max=0.15), req())["r0"]
        elapsed = time.monotonic() - t0
    assert res.error is None and res.attempts == 3 and res.samples[0].text == "A"
    gaps = [b - a for a, b in zip(srv.call_times, srv.call_times[1:], strict=False)]
    assert all(g >= 0.14 for g in gaps), gaps  # waited the (capped) Retry-After, not the 1 ms backoff
    assert elapsed < 2.0


def test_retry_after_ms_is_honoured_when_below_cap():
    limited = Reply(429, RATE, headers={"retry-after-ms": "250"})
    with ScriptedOpenAI(sequence(limited, Reply(body=completion("A")))) as srv:
        res = run(backend(srv.base_url, backoff_base=0.001, backoff_max=5.0), req())["r0"]
    assert res.attempts == 2 and res.error is None
    assert srv.call_times[1] - srv.call_times[0] >= 0.24


def test_retry_after_parsing():
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "1.5"}) == 1.5
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "-3"}) is None
    assert retry_after_seconds({}) is None


def test_500_forever_gives_error_after_max_retries(fake):
    fake.responder = lambda body: (500, {"error": {"message": "upstream exploded"}})
    f = fake
    res = run(backend(f.base_url, max_retries=3), req())["r0"]
    err = no_samples_error(res, "InternalServerError: HTTP 500")
    assert "upstream exploded" in err and "gave up after 4 attempts" in err
    assert res.attempts == 4 and len(f.requests) == 4


@pytest.mark.parametrize("status", [408, 409, 429, 502, 503])
def test_retryable_statuses(status, fake):
    fake.responder = lambda body: (status, {"error": {"message": "try again"}})
    f = fake
    res = run(backend(f.base_url, max_retries=2), req())["r0"]
    assert res.attempts == 3 and len(f.requests) == 3 and f"HTTP {status}" in res.error


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_4xx_are_not_retried(status, fake):
    fake.responder = lambda body: (status, {"error": {"message": "no"}})
    f = fake
    res = run(backend(f.base_url, max_retries=3), req())["r0"]
    assert res.attempts == 1 and len(f.requests) == 1
    assert f"HTTP {status}" in no_samples_error(res, "")


def test_insufficient_quota_429_is_not_retried(fake):
    quota = {"message": "You exceeded your quota", "type": "insufficient_quota", "code": "insufficient_quota"}
    body = {"error": quota}
    fake.responder = lambda b: (429, body)
    f = fake
    res = run(backend(f.base_url, max_retries=3), req())["r0"]
    assert res.attempts == 1 and "RateLimitError" in res.error


def test_timeout_is_retried_then_reported():
    with ScriptedOpenAI(sequence(Reply(body=completion("A"), delay=3.0))) as srv:
        t0 = time.monotonic()
        res = run(backend(srv.base_url, timeout=0.2, max_retries=2), req())["r0"]
        elapsed = time.monotonic() - t0
    assert res.attempts == 3 and len(srv.requests) == 3
    assert "timed out" in no_samples_error(res, "APITimeoutError")
    assert elapsed < 2.0


def test_slow_first_attempt_then_success_latency_is_of_the_successful_attempt():
    with ScriptedOpenAI(sequence(Reply(body=completion("A"), delay=3.0), Reply(body=completion("B")))) as srv:
        res = run(backend(srv.base_url, timeout=0.5), req())["r0"]
    assert res.error is None and res.attempts == 2 and res.samples[0].text == "B"
    assert res.latency_ms < 450  # the timed-out attempt (500 ms) is not counted


@pytest.mark.parametrize("drop", ["before_response", "mid_body"])
def test_dropped_connection_is_retried(drop):
    with ScriptedOpenAI(sequence(Reply(body=completion("A"), drop=drop), Reply(body=completion("B")))) as srv:
        res = run(backend(srv.base_url), req())["r0"]
    assert res.error is None and res.attempts == 2 and res.samples[0].text == "B"


def test_connection_refused_forever():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run(backend(f"http://127.0.0.1:{port}/v1", max_retries=1), req())["r0"]
    assert res.attempts == 2 and "gave up after 2 attempts" in no_samples_error(res, "APIConnectionError")


# -- malformed payloads ----------------------------------------------------------------------------------
def _lp_body(logprob_json: str) -> str:
    return (
        '{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"A"},'
        '"logprobs":{"content":[{"token":"A","logprob":' + logprob_json + ',"top_logprobs":[]}]}}]}'
    )


def _top_lp_body(logprob_json: str) -> str:
    return (
        '{"choices":[{"index":0,"message":{"content":"A"},"logprobs":{"content":[{"token":"A","logprob":-0.1,'
        '"top_logprobs":[{"token":"B","logprob":' + logprob_json + "}]}]}}]}"
    )


MALFORMED = {
    "non_json": ("this is not json {", "body is not JSON"),
    "html": ("<html>502 Bad Gateway</html>", "body is not JSON"),
    "json_list": ("[1, 2]", "expected an object"),
    "missing_choices": ({"id": "x", "object": "chat.completion"}, "missing 'choices'"),
    "error_in_200": ({"error": {"message": "model overloaded"}}, "carries an error: model overloaded"),
    "choices_not_list": ({"choices": {"0": {}}}, "'choices' has type dict"),
    "empty_choices": ({"choices": []}, "'choices' is empty"),
    "message_missing": ({"choices": [{"index": 0, "finish_reason": "stop"}]}, "message is missing"),
    "content_wrong_type": ({"choices": [{"index": 0, "message": {"content": 5}}]}, "content has type int"),
    "index_wrong_type": ({"choices": [{"index": "0", "message": {"content": "A"}}]}, "index is '0'"),
    "nan_logprob": (_lp_body("NaN"), "logprob is NaN"),
    "null_logprob": (_lp_body("null"), "logprob is null"),
    "string_logprob": (_lp_body('"-0.1"'), "logprob has type str"),
    "bool_logprob": (_lp_body("true"), "logprob has type bool"),
    "positive_logprob": (_lp_body("3.5"), "is positive"),
    "nan_top_logprob": (_top_lp_body("NaN"), "top_logprobs[0]: logprob is NaN"),
    "token_not_string": (
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "A"},
                    "logprobs": {"content": [{"token": 1, "logprob": -0.1}]},
                }
            ]
        },
        "token has type int",
    ),
    "logprobs_content_not_list": (
        {"choices": [{"index": 0, "message": {"content": "A"}, "logprobs": {"content": "A"}}]},
        "logprobs.content has type str",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_payload_is_an_error_result(case, fake):
    payload, fragment = MALFORMED[case]
    fake.responder = lambda body: (200, payload)
    f = fake
    res = run(backend(f.base_url), req(top_logprobs=3))["r0"]
    err = no_samples_error(res, "MalformedResponse: ")
    assert fragment in err, err
    assert res.attempts == 1 and len(f.requests) == 1


def test_fewer_choices_than_n_asks_again_for_the_rest(fake):
    # a server that clamps n: one choice per call, its text naming the call
    fake.responder = lambda body: (200, completion_body([text_choice(f"seed {body['seed']} n {body['n']}")]))
    f = fake
    res = run(backend(f.base_url), req(n=4, seed=7, temperature=0.8))["r0"]
    assert res.error is None
    assert [s.index for s in res.samples] == [0, 1, 2, 3]
    assert [s.text for s in res.samples] == ["seed 7 n 4", "seed 8 n 3", "seed 9 n 2", "seed 10 n 1"]
    assert [r["json"]["n"] for r in f.requests] == [4, 3, 2, 1]
    assert res.attempts == 4


def test_more_choices_than_n_is_malformed_and_a_failed_follow_up_stores_no_short_result(fake):
    fake.responder = lambda body: (200, completion_body([text_choice("A"), text_choice("B")]))
    f = fake
    res = run(backend(f.base_url), req(n=1))["r0"]
    assert "2 choice(s) returned for n=1" in no_samples_error(res, "MalformedResponse")
    calls = iter([(200, completion_body([text_choice("A")])), (400, {"error": {"message": "bad"}})])
    fake.responder = lambda body: next(calls)
    res = run(backend(f.base_url), req(n=3))["r0"]
    assert "HTTP 400" in no_samples_error(res, "BadRequestError")


def test_endpoint_cap_is_shared_by_backends_on_one_server(fake):
    import threading

    probe = InFlight(lambda body: (200, completion("A")), delay=0.05)
    fake.responder = probe
    f = fake
    a = backend(f.base_url, concurrency=4, endpoint_concurrency=3)
    b = backend(f.base_url, concurrency=4, endpoint_concurrency=3)
    out: dict[str, dict] = {}
    threads = [
        threading.Thread(
            target=lambda n=n, be=be: out.update({n: run(be, *[req(f"{n}{i}") for i in range(12)])})
        )
        for n, be in (("a", a), ("b", b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert probe.total == 24 and all(r.error is None for d in out.values() for r in d.values())
    assert 2 <= probe.max_seen <= 3  # parallel, but never more than the endpoint's cap


def test_null_content_is_empty_text_and_minus_infinity_is_kept(fake):
    body = completion_body([text_choice(None, finish_reason="length")], completion_tokens=512)
    body2 = _lp_body("-Infinity")
    fake.responder = lambda b: (200, body if b["messages"][0]["content"] == "1" else body2)
    f = fake
    out = run(backend(f.base_url), req("a", "1"), req("b", "2"))
    assert out["a"].samples[0].text == "" and out["a"].samples[0].finish_reason == "length"
    assert out["a"].samples[0].n_output_tokens == 512
    assert out["b"].samples[0].tokens[0].logprob == -math.inf


# -- concurrency -----------------------------------------------------------------------------------------
def test_bounded_concurrency(fake):
    probe = InFlight(lambda body: (200, completion("A")), delay=0.05)
    fake.responder = probe
    f = fake
    t0 = time.monotonic()
    out = run(backend(f.base_url, concurrency=4), *[req(f"r{i}") for i in range(20)])
    elapsed = time.monotonic() - t0
    assert len(out) == 20 and all(r.error is None for r in out.values())
    assert probe.total == 20 and len(f.requests) == 20
    assert probe.max_seen <= 4
    assert probe.max_seen >= 2  # it does run in parallel
    assert elapsed >= 20 / 4 * 0.05 * 0.9


def test_requests_are_pulled_lazily(fake):
    pulled = []

    def gen():
        for i in range(50):
            pulled.append(i)
            yield req(f"r{i}")

    fake.responder = InFlight(lambda body: (200, completion("A")), delay=0.02)
    f = fake
    it = backend(f.base_url, concurrency=3).generate(gen())
    first = next(it)
    assert first.error is None
    assert len(pulled) <= 3 + 1
    rest = list(it)
    assert len(rest) == 49


# -- the key ---------------------------------------------------------------------------------------------
def test_key_only_in_authorization_header(caplog, fake):
    def responder(body):
        if body["messages"][0]["content"] == "bad":
            return 401, {"error": {"message": f"Incorrect API key provided: {SECRET}. Bearer {SECRET}"}}
        if body["messages"][0]["content"] == "flaky":
            return 500, {"error": {"message": f"echo {SECRET}"}}
        return 200, completion("A")

    caplog.set_level(logging.DEBUG)
    fake.responder = responder
    f = fake
    b = backend(f.base_url, max_retries=1)
    out = run(b, req("ok", "hi"), req("bad", "bad"), req("flaky", "flaky"))
    assert f.auth_seen and all(a == f"Bearer {SECRET}" for a in f.auth_seen)
    assert all(SECRET not in str(r["json"]) for r in f.requests)
    for res in out.values():
        assert SECRET not in res.model_dump_json()
    assert out["bad"].attempts == 1 and "***" in out["bad"].error and "Incorrect API key" in out["bad"].error
    assert out["flaky"].attempts == 2
    assert SECRET not in repr(b)
    assert SECRET not in caplog.text


def test_missing_key_uses_placeholder(monkeypatch, fake):
    monkeypatch.delenv(KEY_ENV)
    fake.responder = lambda body: (200, completion("A"))
    f = fake
    res = run(backend(f.base_url), req())["r0"]
    assert res.error is None and f.auth_seen == ["Bearer EMPTY"]


# -- answer-position option log-probabilities ------------------------------------------------------------
def sample(tokens, text=None) -> Sample:
    toks = [TokenLogprob(token=t, logprob=lp, top=dict(alts)) for t, lp, alts in tokens]
    return Sample(index=0, text=text if text is not None else "".join(t.token for t in toks), tokens=toks)


LABELS = ["A", "B", "C", "D"]


def test_cot_reads_alternatives_at_the_final_answer_not_the_first_token():
    got = answer_option_logprobs(sample(COT), LABELS)
    assert set(got) == {"A", "B", "C"}  # D is not in the top-k: absent, not imputed
    assert got["B"] == -1.6 and got["A"] == -3.2
    assert got["C"] == pytest.approx(math.log(math.exp(-0.3) + math.exp(-4.0)))  # " C" and "C" combined


def test_last_marker_wins_and_markdown_is_skipped():
    toks = [
        ("I", -0.1, []),
        (" could", -0.1, []),
        (" answer", -0.1, []),
        (":", -0.1, []),
        (" A", -0.5, [(" A", -0.5), (" D", -0.9)]),
        (" but", -0.1, []),
        (" no", -0.1, []),
        (".\n", -0.1, []),
        ("**", -0.1, []),
        ("Final", -0.1, []),
        (" Answer", -0.1, []),
        (":**", -0.1, []),
        (" (", -0.1, []),
        ("D", -0.2, [("D", -0.2), ("B", -1.7), ("b", -2.0)]),
        (")", -0.1, []),
    ]
    assert answer_option_logprobs(sample(toks), LABELS) == {"D": -0.2, "B": -1.7}  # lowercase b is not B


def test_direct_lone_letter_reply():
    toks = [("B", -0.05, [("B", -0.05), ("A", -3.1), (" C", -4.0), ("The", -5.0)])]
    assert answer_option_logprobs(sample(toks), LABELS) == {"B": -0.05, "A": -3.1, "C": -4.0}


def test_direct_reply_with_option_text_and_paren_tokens():
    toks = [("(B", -0.3, [("(B", -0.3), ("(A", -1.4)]), (")", -0.01, []), (" Pneumonia", -0.2, [])]
    assert answer_option_logprobs(sample(toks), LABELS) == {"B": -0.3, "A": -1.4}


def test_bracket_style():
    toks = [
        ("I", -0.1, []),
        (" pick", -0.1, []),
        (" [", -0.1, []),
        ("B", -0.4, [("B", -0.4), ("C", -1.2)]),
        ("].", -0.1, []),
    ]
    assert answer_option_logprobs(sample(toks), LABELS) == {"B": -0.4, "C": -1.2}


def test_boxed_answer_and_sampled_token_outside_top_k():
    toks = [
        ("So", -0.1, []),
        (" \\boxed", -0.1, []),
        ("{", -0.1, []),
        ("A", -3.5, [("C", -0.1), ("B", -2.6)]),
        ("}", -0.1, []),
    ]
    assert answer_option_logprobs(sample(toks), LABELS) == {"C": -0.1, "B": -2.6, "A": -3.5}


@pytest.mark.parametrize(
    "pieces",
    [
        ["I", " am", " not", " sure", "."],
        ["Answer", ":", " Because", " of", " the", " fever"],  # "B" of "Because" is not an answer
        ["A", " patient", " with", " fever"],  # leading "A" article is not a direct reply
        ["Answer: C"],  # one token spans marker and letter: the position does not isolate the answer
    ],
)
def test_unparseable_returns_none(pieces):
    assert answer_option_logprobs(sample(simple_tokens(pieces, alts=[("A", -1.0)])), LABELS) is None


def test_no_logprobs_returns_none():
    assert answer_option_logprobs(Sample(index=0, text="Answer: C", tokens=None), LABELS) is None


def test_answer_is_option_phrase_and_boxed_text():
    toks = [*simple_tokens(["The", " answer", " is", " option"]), (" A", -0.7, [(" A", -0.7), (" C", -0.8)])]
    assert answer_option_logprobs(sample(toks), LABELS) == {"A": -0.7, "C": -0.8}
    toks = [*simple_tokens(["\\boxed", "{\\text{"]), ("D", -0.1, [("D", -0.1)]), *simple_tokens(["}}"])]
    assert answer_option_logprobs(sample(toks), LABELS) == {"D": -0.1}
