"""The ``openai`` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama).

Requests run on a thread pool with at most ``concurrency`` HTTP requests in flight. The SDK's own
retries are switched off (``max_retries=0``) so every attempt is counted here and recorded in
``GenerationResult.attempts``:

* retried: HTTP 408, 409, 429 (except ``insufficient_quota``, which waiting cannot fix) and any 5xx,
  connection errors and timeouts; the wait is exponential (``backoff_base * 2**k``, capped at
  ``backoff_max``) with jitter (uniform in [50 %, 100 %] of that), or the server's ``Retry-After`` /
  ``retry-after-ms`` when given, capped at ``backoff_max``;
* not retried: every other status (400, 401, 403, 404, 422, ...) and malformed 200 responses (a
  server that sends a broken payload once will usually do it again).

Concurrency is capped per backend object (``concurrency`` requests in flight) and, when
``endpoint_concurrency`` is given, per endpoint: at most that many HTTP calls in flight to one base
URL in this process, shared by every backend object that names the same endpoint and cap (a sweep's
models on one server, a model and its parse-fallback helper), so a sweep does not multiply the load
a server was sized for. Waiting out a backoff does not hold an endpoint slot.

A server that returns fewer choices than ``n`` (some ignore or clamp ``n``) is asked again for the
rest, ``n - received`` at a time, until the request has ``n`` samples; each follow-up gains at least
one sample, so there are at most ``n`` calls. With a decoding seed, a follow-up uses ``seed +
received`` so it does not return copies of the samples already received (still reproducible).
More choices than ``n`` is a malformed response.

After the last attempt the result carries ``error`` ("<Type>: <short message>") and no samples; a
single bad request never raises out of :meth:`OpenAIBackend.generate`.

The response body is parsed from the raw JSON here rather than through the SDK's typed models, which
are built without validation (a ``NaN`` log-probability or a missing ``choices`` would pass through
silently, and a non-JSON body raises a bare ``JSONDecodeError``). Anything malformed becomes an
``error`` naming what was wrong; nothing is imputed.

The API key is read only from the environment variable ``api_key_env`` (the placeholder ``"EMPTY"``
when unset, for local servers). It is sent only in the ``Authorization`` header, never logged, and
scrubbed from every error string.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import json
import math
import mimetypes
import os
import random
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from equipoise.evaluators.backends.base import GenerationRequest, GenerationResult, Sample, TokenLogprob

PLACEHOLDER_KEY = "EMPTY"
MAX_TOP_LOGPROBS = 20
_RETRY_STATUSES = frozenset({408, 409, 429})
_ERROR_CHARS = 300
_LOGPROB_TOLERANCE = 1e-3  # rounding can give log p slightly above 0; more than this is a broken value


class MalformedResponse(ValueError):
    """A 200 response whose payload does not have the chat-completions shape."""


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Fatal(Exception):
    pass


_ENDPOINT_SLOTS: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_ENDPOINT_LOCK = threading.Lock()


def endpoint_slots(base_url: str | None, cap: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of one endpoint and cap (created on first use)."""
    key = ((base_url or "https://api.openai.com/v1").rstrip("/"), cap)
    with _ENDPOINT_LOCK:
        if key not in _ENDPOINT_SLOTS:
            _ENDPOINT_SLOTS[key] = threading.BoundedSemaphore(cap)
        return _ENDPOINT_SLOTS[key]


class OpenAIBackend:
    """Chat completions over an OpenAI-compatible HTTP API; see the module docstring for the policy."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        endpoint_concurrency: int | None = None,
    ) -> None:
        if concurrency < 1 or (endpoint_concurrency is not None and endpoint_concurrency < 1):
            raise ValueError("concurrency must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if timeout <= 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError("timeout must be > 0 and backoff_base/backoff_max >= 0")
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.endpoint_concurrency = endpoint_concurrency
        self._slots: Any = (
            endpoint_slots(base_url, endpoint_concurrency)
            if endpoint_concurrency is not None
            else contextlib.nullcontext()
        )
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()
        self._rng = random.Random()

    def __repr__(self) -> str:  # never shows the key
        return (
            f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, concurrency={self.concurrency})"
        )

    # -- client -------------------------------------------------------------------------------------
    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                from openai import OpenAI

                key = os.environ.get(self.api_key_env) or PLACEHOLDER_KEY
                self._secrets = (key,) if key != PLACEHOLDER_KEY else ()
                self._client = OpenAI(
                    api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
                )
            return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- public -------------------------------------------------------------------------------------
    def generate(self, requests: Iterable[GenerationRequest]) -> Iterator[GenerationResult]:
        """Yield one result per request, in completion order, with at most ``concurrency`` in flight."""
        it = iter(requests)
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="equipoise-openai")
        pending: set[Future[GenerationResult]] = set()
        try:
            exhausted = False
            while True:
                while not exhausted and len(pending) < self.concurrency:
                    req = next(it, None)
                    if req is None:
                        exhausted = True
                    else:
                        pending.add(pool.submit(self._run_one, req))
                if not pending:
                    return
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()  # _run_one never raises
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    # -- one request --------------------------------------------------------------------------------
    def _run_one(self, req: GenerationRequest) -> GenerationResult:
        """All ``n`` samples of one request: the first call, then follow-ups for missing choices."""
        samples: list[Sample] = []
        attempts = 0
        latency_ms = 0.0
        n = req.decoding.n
        while len(samples) < n:
            part, used, ms, error = self._call(req, n - len(samples), len(samples))
            attempts += used
            latency_ms += ms
            if error is not None:
                message, gave_up = error
                return self._error(req, message, attempts, final=gave_up)
            # re-index the follow-up's choices after those already received
            samples += [s.model_copy(update={"index": len(samples) + i}) for i, s in enumerate(part)]
        return GenerationResult(
            request_id=req.request_id, samples=samples, latency_ms=latency_ms, attempts=attempts
        )

    def _call(
        self, req: GenerationRequest, n: int, received: int
    ) -> tuple[list[Sample], int, float, tuple[str, bool] | None]:
        """One chat-completions request for ``n`` choices, retried per the policy; returns
        (samples, attempts, latency of the successful attempt in ms, error or None); an error is
        (message, whether retries were exhausted)."""
        attempts = 0
        try:
            kwargs = self._request_kwargs(req)
            kwargs["n"] = n
            if received and req.decoding.seed is not None:
                kwargs["seed"] = req.decoding.seed + received
            client = self._get_client()
            while True:
                attempts += 1
                try:
                    t0 = time.perf_counter()
                    with self._slots:
                        body = self._attempt(client, kwargs)
                    latency_ms = (time.perf_counter() - t0) * 1000.0
                except _Retryable as exc:
                    if attempts > self.max_retries:
                        return [], attempts, 0.0, (str(exc), True)
                    time.sleep(self._delay(attempts, exc.retry_after))
                    continue
                try:
                    return parse_completion(body, n), attempts, latency_ms, None
                except MalformedResponse as exc:
                    return [], attempts, 0.0, (f"MalformedResponse: {exc}", False)
        except _Fatal as exc:
            return [], max(attempts, 1), 0.0, (str(exc), False)
        except Exception as exc:  # a bug or an unforeseen SDK exception must not end the run
            return [], max(attempts, 1), 0.0, (f"{type(exc).__name__}: {exc}", False)

    def _attempt(self, client: Any, kwargs: dict[str, Any]) -> Any:
        """One HTTP call; returns the decoded JSON body or raises _Retryable / _Fatal / MalformedResponse."""
        import openai

        try:
            raw = client.chat.completions.with_raw_response.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise _Retryable(f"APITimeoutError: request timed out after {self.timeout:g}s") from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__
            detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            raise _Retryable(f"APIConnectionError: {exc.message}{detail}") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            msg = f"{type(exc).__name__}: HTTP {status}: {_status_detail(exc)}"
            no_quota = "insufficient_quota" in (exc.code, exc.type)
            if (status in _RETRY_STATUSES or status >= 500) and not no_quota:
                raise _Retryable(msg, retry_after_seconds(exc.response.headers)) from exc
            raise _Fatal(msg) from exc
        content = raw.http_response.content
        try:
            return json.loads(content)
        except (ValueError, UnicodeDecodeError) as exc:
            snippet = content[:60].decode("utf-8", "replace")
            raise _Fatal(f"MalformedResponse: body is not JSON ({exc}); starts with {snippet!r}") from exc

    def _request_kwargs(self, req: GenerationRequest) -> dict[str, Any]:
        d = req.decoding
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": _messages(req),
            "temperature": d.temperature,
            "top_p": d.top_p,
            "max_tokens": d.max_tokens,
            "n": d.n,
        }
        if d.seed is not None:
            kwargs["seed"] = d.seed
        if d.logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = min(d.top_logprobs, MAX_TOP_LOGPROBS)
        if d.thinking is not None:  # vLLM / SGLang chat-template switch (Qwen3 and similar)
            kwargs["extra_body"] = {"chat_template_kwargs": {"enable_thinking": d.thinking}}
        return kwargs

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max)
        cap = min(self.backoff_base * (2.0 ** (attempt - 1)), self.backoff_max)
        return cap * (0.5 + 0.5 * self._rng.random())

    def _error(
        self, req: GenerationRequest, message: str, attempts: int, final: bool = False
    ) -> GenerationResult:
        if final and attempts > 1:
            message = f"{message} (gave up after {attempts} attempts)"
        return GenerationResult(request_id=req.request_id, error=self._scrub(message), attempts=attempts)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        text = re.sub(r"(?i)bearer\s+\S+", "Bearer ***", text)
        text = re.sub(r"\bsk-[A-Za-z0-9_\-*.]{4,}", "sk-***", text)
        if len(text) > _ERROR_CHARS:
            text = text[: _ERROR_CHARS - 3] + "..."
        return text


# -- helpers: request ---------------------------------------------------------------------------------
def _messages(req: GenerationRequest) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [dict(m) for m in req.messages]
    if req.image is None:
        return msgs
    url = _image_url(req.image)
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = [
                {"type": "text", "text": m.get("content", "")},
                {"type": "image_url", "image_url": {"url": url}},
            ]
            return msgs
    raise _Fatal("BadRequest: request has an image but no user message to attach it to")


def _image_url(image: str) -> str:
    if image.startswith(("data:", "http://", "https://")):
        return image
    path = Path(image)
    if not path.is_file():
        raise _Fatal(f"BadRequest: image file not found: {image}")
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds requested by ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date), else None."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            secs = float(value) / divisor
        except ValueError:
            if divisor == 1.0:
                try:
                    when = email.utils.parsedate_to_datetime(value)
                except (TypeError, ValueError, IndexError):
                    return None
                if when is None:
                    return None
                return max(0.0, when.timestamp() - time.time())
            continue
        return secs if math.isfinite(secs) and secs >= 0 else None
    return None


def _status_detail(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        msg = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(msg, str) and msg:
            return msg[:200]
    if isinstance(body, str) and body.strip():
        return body.strip()[:200]
    return str(exc.message)[:200]


# -- helpers: response --------------------------------------------------------------------------------
def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _logprob(x: Any, where: str) -> float:
    if x is None:
        raise MalformedResponse(f"{where}: logprob is null")
    if not _is_num(x):
        raise MalformedResponse(f"{where}: logprob has type {type(x).__name__}, expected a number")
    v = float(x)
    if math.isnan(v):
        raise MalformedResponse(f"{where}: logprob is NaN")
    if v > _LOGPROB_TOLERANCE:
        raise MalformedResponse(f"{where}: logprob {v!r} is positive")
    return v


def _tokens(logprobs: Any, where: str) -> list[TokenLogprob] | None:
    if logprobs is None:
        return None
    if not isinstance(logprobs, dict):
        raise MalformedResponse(f"{where}.logprobs has type {type(logprobs).__name__}, expected an object")
    content = logprobs.get("content")
    if content is None:
        return None
    if not isinstance(content, list):
        raise MalformedResponse(
            f"{where}.logprobs.content has type {type(content).__name__}, expected a list"
        )
    out: list[TokenLogprob] = []
    for i, entry in enumerate(content):
        w = f"{where}.logprobs.content[{i}]"
        if not isinstance(entry, dict):
            raise MalformedResponse(f"{w} is not an object")
        token = entry.get("token")
        if not isinstance(token, str):
            raise MalformedResponse(f"{w}.token has type {type(token).__name__}, expected a string")
        lp = _logprob(entry.get("logprob"), w)
        top_raw = entry.get("top_logprobs") or []
        if not isinstance(top_raw, list):
            raise MalformedResponse(f"{w}.top_logprobs is not a list")
        top: dict[str, float] = {}
        for j, alt in enumerate(top_raw):
            wa = f"{w}.top_logprobs[{j}]"
            if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                raise MalformedResponse(f"{wa} is not an object with a string token")
            alp = _logprob(alt.get("logprob"), wa)
            # distinct token ids can decode to the same string (e.g. partial UTF-8 as U+FFFD): keep the max
            if alt["token"] not in top or alp > top[alt["token"]]:
                top[alt["token"]] = alp
        try:
            out.append(TokenLogprob(token=token, logprob=lp, top=top))
        except ValidationError as exc:
            raise MalformedResponse(f"{w}: {exc.errors()[0].get('msg', 'invalid')}") from exc
    return out


def parse_completion(body: Any, n: int) -> list[Sample]:
    """Samples from a decoded chat-completion body; raises MalformedResponse naming the problem.

    Between 1 and ``n`` choices are accepted (the backend asks again for missing ones).

    ``n_output_tokens``: with one choice, ``usage.completion_tokens`` when present, else the number of
    logprob tokens; with several choices (usage is a total), each choice's logprob token count, else
    None (a total is never split by guesswork). A ``null`` message content (e.g. a reasoning model that
    spent ``max_tokens`` before answering) is recorded as the empty text with its ``finish_reason``.
    """
    if not isinstance(body, dict):
        raise MalformedResponse(f"body is a JSON {type(body).__name__}, expected an object")
    if "choices" not in body:
        if isinstance(body.get("error"), dict | str):
            err = body["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise MalformedResponse(f"200 response carries an error: {str(msg)[:200]}")
        raise MalformedResponse("missing 'choices'")
    choices = body["choices"]
    if not isinstance(choices, list):
        raise MalformedResponse(f"'choices' has type {type(choices).__name__}, expected a list")
    if not choices:
        raise MalformedResponse("'choices' is empty")
    if len(choices) > n:
        raise MalformedResponse(f"{len(choices)} choice(s) returned for n={n}")
    completion_tokens = None
    usage = body.get("usage")
    if isinstance(usage, dict) and _is_num(usage.get("completion_tokens")):
        completion_tokens = int(usage["completion_tokens"])
    samples: list[Sample] = []
    seen: set[int] = set()
    for pos, ch in enumerate(choices):
        where = f"choices[{pos}]"
        if not isinstance(ch, dict):
            raise MalformedResponse(f"{where} is not an object")
        index = ch.get("index", pos)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise MalformedResponse(f"{where}.index is {index!r}, expected a non-negative integer")
        if index in seen:
            raise MalformedResponse(f"duplicate choice index {index}")
        seen.add(index)
        msg = ch.get("message")
        if not isinstance(msg, dict):
            raise MalformedResponse(f"{where}.message is missing or not an object")
        text = msg.get("content")
        if text is None:
            text = ""
        elif not isinstance(text, str):
            raise MalformedResponse(
                f"{where}.message.content has type {type(text).__name__}, expected a string"
            )
        finish = ch.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise MalformedResponse(f"{where}.finish_reason has type {type(finish).__name__}")
        tokens = _tokens(ch.get("logprobs"), where)
        if len(choices) == 1 and completion_tokens is not None:
            n_out: int | None = completion_tokens
        else:
            n_out = len(tokens) if tokens is not None else None
        samples.append(
            Sample(index=index, text=text, finish_reason=finish, tokens=tokens, n_output_tokens=n_out)
        )
    return sorted(samples, key=lambda s: s.index)


# -- answer-position option log-probabilities ---------------------------------------------------------
_MARKER = re.compile(
    r"(?:\b(?:answer|final\s+choice|decision|verdict|(?:correct|best)\s+(?:option|choice))"
    r"(?![A-Za-z])\s*(?:is\s*)?[:：\-]?\s*(?:(?:option|choice)\s+)?)"
    r"|\\boxed\{\s*",
    re.IGNORECASE,
)
_WRAP_CHARS = " \t\r\n\u0120\u2581*_`\"'“”‘’()[]{}:.,;!-"


def _label_for(token: str, labels: list[str]) -> str | None:
    core = token.strip(_WRAP_CHARS)
    if core.startswith("\\text{"):  # \boxed{\text{B}}
        core = core[len("\\text{") :].strip(_WRAP_CHARS)
    return core if core in labels else None


def _letter_after(text: str, start: int, labels: list[str]) -> int | None:
    """Char index of a label right after ``start`` (after wrappers), followed by a non-word char."""
    i = start
    while i < len(text):
        if text[i].isspace() or text[i] in "*_`\"'([{“‘":
            i += 1
        elif text.startswith("\\text{", i):
            i += len("\\text{")
        else:
            break
    for lab in sorted(labels, key=len, reverse=True):
        if text.startswith(lab, i):
            end = i + len(lab)
            if end == len(text) or not (text[end].isalnum() or text[end] == "_"):
                return i
    return None


def _answer_char(text: str, labels: list[str]) -> int | None:
    # 1. the last "Answer:"-like marker (or \boxed{) followed by a label
    for m in reversed(list(_MARKER.finditer(text))):
        pos = _letter_after(text, m.end(), labels)
        if pos is not None:
            return pos
    # 2. the last "[X]"
    for m in reversed(list(re.finditer(r"\[\s*([^\[\]\s]{1,8})\s*\]", text))):
        if m.group(1) in labels:
            return m.start(1)
    # 3. a direct reply: the text is the label, or starts with it followed by . ) ] : or **
    pos = _letter_after(text, 0, labels)
    if pos is not None:
        end = pos + next(
            len(lab) for lab in sorted(labels, key=len, reverse=True) if text.startswith(lab, pos)
        )
        rest = text[end:]
        if not rest.strip(_WRAP_CHARS) or re.match(r"\s*(?:[.)\]:]|\*\*)", rest):
            return pos
    return None


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


def answer_option_logprobs(sample: Sample, labels: list[str]) -> dict[str, float] | None:
    """Log-probabilities of the option labels at the position where the final answer was generated.

    Finding the position (on the text re-assembled from ``sample.tokens``, so char offsets map to tokens):

    1. the LAST marker ``Answer:`` / ``Final answer:`` / ``The answer is (option)`` / ``Decision:`` /
       ``Verdict:`` / ``The correct option is`` (case-insensitive; ``:``, ``：`` or ``-`` optional) or
       ``\\boxed{`` that is followed, after optional whitespace, ``*``, ``_``, backticks, quotes, ``(``,
       ``[``, ``{`` or ``\\text{``, by a label that is not followed by a letter, digit or ``_`` (so
       "Answer: Because" is not "B"); earlier markers in the reasoning are ignored unless the last one
       is not followed by a label;
    2. otherwise the last bracketed label ``[X]``;
    3. otherwise a direct reply: the whole text is the label (modulo spaces/markdown/punctuation), or it
       starts with the label followed by ``.``, ``)``, ``]``, ``:`` or ``**`` ("B. Pneumonia", "(B) ...").

    The answer position is the token whose character span contains the label's first character.

    Normalising a token to a label: strip, from both ends, whitespace (including the byte-level BPE
    ``Ġ`` and SentencePiece ``▁`` markers), markdown ``*``/``_``/backticks, quotes and the punctuation
    ``()[]{}:.,;!-``, and a leading ``\\text{``; the remainder must equal a label exactly and
    case-sensitively (so " B", "B", "(B", "B)", "**B" and ": B" are all "B", but "b" is not, since a
    lowercase "a" is usually the article). Several alternatives that normalise to the same label (" B" and
    "B") are combined by log-sum-exp, i.e. their probabilities are added; the chosen token is included
    unless it already appears among the alternatives.

    Returns ``{label: logprob}`` for the labels found at that position only: labels absent from the
    top-k stay absent (nothing is imputed). Returns None when the sample has no token log-probabilities,
    no answer position can be identified, or the token at that position does not itself normalise to
    a label (the tokenisation does not isolate the answer).
    """
    if not sample.tokens or not labels:
        return None
    starts: list[int] = []
    pieces: list[str] = []
    offset = 0
    for t in sample.tokens:
        starts.append(offset)
        pieces.append(t.token)
        offset += len(t.token)
    text = "".join(pieces)
    char = _answer_char(text, labels)
    if char is None:
        return None
    idx = next(i for i, (s, p) in enumerate(zip(starts, pieces, strict=True)) if s <= char < s + len(p))
    tok = sample.tokens[idx]
    if _label_for(tok.token, labels) is None:
        return None
    alts = dict(tok.top)
    alts.setdefault(tok.token, tok.logprob)
    out: dict[str, float] = {}
    for token, lp in alts.items():
        lab = _label_for(token, labels)
        if lab is not None:
            out[lab] = _logaddexp(out[lab], lp) if lab in out else lp
    return out
