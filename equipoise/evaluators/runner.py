"""Run a backend over a dataset config into the store, resumably.

The run id is a hash of everything that defines the run (model, backend, prompt template hash,
decoding, dataset version, config), so the same command always names the same run. Before asking the
backend anything the runner reads which (item, sample) rows already exist and requests only the rest
(rows stored as ``error``, requests that got no answer, are dropped and asked again); results are
written in batches, each one transaction (predictions with their option scores). A run killed at any
point and started again with the same arguments therefore continues where it stopped, with nothing
lost or duplicated.

Two additions share that machinery:

* **Self-evaluation** (seed 003, :func:`run_self_eval`): each sample-0 answer of an existing decision
  run is shown, with its question, to a judge in a new conversation that replies 'Correct' or
  'Incorrect'. The result is an ordinary run whose ``prompt_style`` is ``self_eval:<decision style>``
  and whose ``model``, ``backend``, ``dataset_id`` and ``config`` are the decision run's, with each
  verdict under the decision's ``item_id`` and ``sample_index`` 0: exactly the link the metric
  ``self_eval_filtered_accuracy`` (``det_self_eval.sql``) reads. The store has no column for the
  judged run or the judge, so ``decoding_json`` carries them under the key ``self_eval``; the run id
  hashes the decision run id, the judge and its decoding, so the same command resumes the same run.
* **LLM parse fallback** (:class:`ParseFallback`): when every regex fails on a reply, a helper model
  is asked which option the reply chose. A valid label is stored with ``parse_method='llm_fallback'``;
  anything else leaves the row unparsed with ``parse_method='llm_fallback_failed'``. The fallback is
  applied to each batch before it is committed, so it cannot break resume; when used it is part of
  the run id and of ``decoding_json`` (key ``parse_fallback``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from rich.progress import Progress

from equipoise import __version__
from equipoise.builders.prompts import answer_space_note, decision_template, get_template
from equipoise.evaluators.backends.base import Backend, Decoding, GenerationRequest, GenerationResult, Sample
from equipoise.evaluators.fewshot import POOL_FOR_VARIANT, FewShotSelector, format_examples
from equipoise.evaluators.ingest import LoadedConfig, read_config, register
from equipoise.evaluators.parsing import (
    DECISION,
    FALLBACK_FAILED,
    FALLBACK_METHOD,
    FALLBACK_SHA256,
    VERDICTS,
    Parsed,
    fallback_messages,
    parse_answer,
    parse_verdict,
    read_fallback_reply,
)
from equipoise.evaluators.store import OptionScoreRow, PredictionRow, RunRow, insert, insert_batch, scalar
from equipoise.schemas.clindet import DeterminabilityCase, canonical_json
from equipoise.schemas.items import MCQItem

SELF_EVAL_PREFIX = "self_eval:"


@dataclass(frozen=True)
class RunSummary:
    """What one invocation did, so a resumed run can say how much was already stored."""

    run_id: str
    requested: int
    written: int
    skipped_existing: int
    outcomes: dict[str, int]
    # self-evaluation only: judged-run samples with no answer to judge (outcome 'error'); they stay
    # in the decision metrics' denominators with no verdict
    skipped_no_answer: int = 0


FALLBACK_DECODING = Decoding(temperature=0.0, max_tokens=16, n=1, logprobs=False, top_logprobs=0)


@dataclass(frozen=True)
class ParseFallback:
    """A helper model that reads replies the regexes could not parse.

    Greedy and short by default: the helper only names a label. ``thinking=False`` is not forced,
    because some servers reject the chat-template switch; pick a non-reasoning helper model.
    """

    backend: Backend
    decoding: Decoding = FALLBACK_DECODING

    def identity(self) -> dict[str, object]:
        """What the run id and ``decoding_json`` record about the fallback."""
        return {
            "backend": self.backend.name,
            "model": self.backend.model,
            "prompt": FALLBACK_SHA256,
            "decoding": self.decoding.model_dump(),
        }


@dataclass(frozen=True)
class _Labels:
    """The answer space of one item: labels, option texts (for the fallback prompt), roles."""

    labels: tuple[str, ...]
    texts: dict[str, str] | None
    roles: dict[str, str]

    def outcome(self, p: Parsed) -> str:
        if p.label is None:
            return "abstained" if p.method == "refusal" else "unparsed"
        return "abstained" if self.roles.get(p.label) == "abstain" else "answered"


def _labels_of(rec: MCQItem | DeterminabilityCase) -> _Labels:
    if isinstance(rec, DeterminabilityCase):
        return _Labels(DECISION, None, {"Unable to determine": "abstain"})
    return _Labels(
        tuple(o.label for o in rec.options),
        {o.label: o.text for o in rec.options},
        {o.label: o.role for o in rec.options},
    )


_VERDICT_SPACE = _Labels(VERDICTS, None, {})


def _messages(
    rec: MCQItem | DeterminabilityCase, style: str, fewshot: FewShotSelector | None = None
) -> tuple[list[dict[str, str]], str, str]:
    if isinstance(rec, DeterminabilityCase):
        if style not in ("base", "cot", "safe"):
            raise ValueError(f"prompt style '{style}' is for MCQ items; determinability uses base/cot/safe")
        tpl = decision_template(style, "determinability")
        return tpl.render(vignette=rec.vignette, question=rec.question), tpl.id, tpl.sha256
    tpl = decision_template(style, "mcq")
    framings = [o.framing or "" for o in rec.options if o.role == "abstain"]
    framings += ["nota"] if any(o.role == "nota" for o in rec.options) else []
    opts = "\n".join(f"{o.label}. {o.text}" for o in rec.options)
    values = {"question": rec.question, "options": opts, "answer_space": answer_space_note(framings)}
    if style == "fewshot":
        if fewshot is None:
            raise ValueError("prompt style 'fewshot' needs a few-shot pool")
        values["examples"] = format_examples(fewshot.neighbours(rec))
    return tpl.render(**values), tpl.id, tpl.sha256


def run_id_for(
    model: str,
    backend: str,
    style: str,
    template_sha: str,
    decoding: Decoding,
    dataset_id: str,
    config: str,
    extra: dict[str, object] | None = None,
) -> str:
    """Deterministic run id. ``extra`` (self-evaluation link, parse fallback) enters the hash only
    when given, so runs without it keep the ids they always had."""
    fields: dict[str, object] = {
        "model": model,
        "backend": backend,
        "style": style,
        "template": template_sha,
        "decoding": decoding.model_dump(),
        "dataset": dataset_id,
        "config": config,
    }
    if extra:
        fields["extra"] = extra
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:16]


def _rows_for(
    run_id: str,
    item_id: str,
    space: _Labels,
    res: GenerationResult,
    verdict: bool = False,
) -> tuple[list[PredictionRow], list[OptionScoreRow]]:
    """Rows for one result. ``verdict``: a self-evaluation reply, parsed as Correct / Incorrect, with
    no option scores (the verdict labels are not options of the item)."""
    preds: list[PredictionRow] = []
    scores: list[OptionScoreRow] = []
    if res.error is not None or not res.samples:
        preds.append(
            PredictionRow(
                run_id=run_id,
                item_id=item_id,
                sample_index=0,
                raw_output="",
                parsed_label=None,
                parse_method="error",
                outcome="error",
                latency_ms=res.latency_ms,
                error=res.error or "no samples returned",
            )
        )
        return preds, scores
    for s in res.samples:
        p = parse_verdict(s.text) if verdict else parse_answer(s.text, space.labels, space.texts)
        lps = [t.logprob for t in s.tokens] if s.tokens else []
        preds.append(
            PredictionRow(
                run_id=run_id,
                item_id=item_id,
                sample_index=s.index,
                raw_output=s.text,
                parsed_label=p.label,
                parse_method=p.method,
                outcome=space.outcome(p),
                token_logprob_sum=sum(lps) if lps else None,
                token_logprob_mean=(sum(lps) / len(lps)) if lps else None,
                token_logprob_min=min(lps) if lps else None,
                n_output_tokens=s.n_output_tokens if s.n_output_tokens is not None else (len(lps) or None),
                latency_ms=res.latency_ms,
            )
        )
        if verdict:
            continue
        for lab, lp in (_option_logprobs(s, list(space.labels)) or {}).items():
            if lab in space.labels and math.isfinite(lp):
                scores.append(
                    OptionScoreRow(
                        run_id=run_id, item_id=item_id, sample_index=s.index, label=lab, logprob=lp
                    )
                )
    return preds, scores


def apply_parse_fallback(
    rows: list[PredictionRow], spaces: dict[str, _Labels], fallback: ParseFallback
) -> list[PredictionRow]:
    """Ask the helper about every row the regexes left unparsed (refusals and errors are not
    parse failures and are left alone); returns the rows with the helper's reading applied."""
    todo = {
        f"{r.item_id}\x1f{r.sample_index}": r for r in rows if r.parse_method == "unparsed" and r.raw_output
    }
    if not todo:
        return rows
    requests = [
        GenerationRequest(
            request_id=key,
            messages=fallback_messages(r.raw_output, spaces[r.item_id].labels, spaces[r.item_id].texts),
            decoding=fallback.decoding,
        )
        for key, r in todo.items()
    ]
    fixed: dict[str, PredictionRow] = {}
    for res in fallback.backend.generate(requests):
        r = todo[res.request_id]
        space = spaces[r.item_id]
        label = None
        if res.error is None and res.samples:
            label = read_fallback_reply(res.samples[0].text, space.labels)
        if label is None:
            fixed[res.request_id] = r.model_copy(update={"parse_method": FALLBACK_FAILED})
        else:
            p = Parsed(label, FALLBACK_METHOD)
            fixed[res.request_id] = r.model_copy(
                update={"parsed_label": label, "parse_method": FALLBACK_METHOD, "outcome": space.outcome(p)}
            )
    # a helper that dropped a request leaves that row as it was: still unparsed, still stored
    return [fixed.get(f"{r.item_id}\x1f{r.sample_index}", r) for r in rows]


def _option_logprobs(sample: Sample, labels: list[str]) -> dict[str, float] | None:
    if sample.option_logprobs is not None:
        return sample.option_logprobs
    if sample.tokens:
        from equipoise.evaluators.backends.openai_backend import answer_option_logprobs

        return answer_option_logprobs(sample, labels)
    return None


def _decoding_json(decoding: Decoding, extra: dict[str, object]) -> str:
    """The decoding parameters, plus run-defining extras (self-evaluation link, parse fallback) that
    the store has no column for. Plain decision runs without a fallback get exactly the decoding."""
    return canonical_json({**decoding.model_dump(), **extra})


def _image_of(record: object, folder: Path) -> str | None:
    """An item's image as the backend must open it: a dataset stores images relative to its own
    folder (``images/<sha256>.<ext>``), so a relative path resolves there, never against the
    working directory; URLs and data URIs pass through."""
    image = getattr(record, "image", None)
    if image is None or image.startswith(("data:", "http://", "https://")) or Path(image).is_absolute():
        return image
    return str(Path(folder) / image)


@dataclass(frozen=True)
class RunIdentity:
    """Everything that names a decision run, computed without asking a backend anything: the
    planner uses it to list runs and count what is stored (``--dry-run``), the runner to write."""

    row: RunRow
    selector: FewShotSelector | None

    @property
    def run_id(self) -> str:
        return self.row.run_id


def plan_run(
    folder: Path,
    loaded: LoadedConfig,
    model: str,
    backend_name: str,
    style: str = "base",
    decoding: Decoding | None = None,
    pool_config: str | None = None,
    shots: int = 4,
    parse_fallback: ParseFallback | None = None,
) -> RunIdentity:
    """The run id and ``runs`` row of one decision run of ``model`` on ``loaded``."""
    decoding = decoding or Decoding()
    config = loaded.config
    if not loaded.records:
        raise ValueError(f"{folder}: config '{config}' has no items")
    if style not in ("base", "cot", "safe") and loaded.suite == "clindet":
        raise ValueError(f"prompt style '{style}' is for MCQ items; determinability uses base/cot/safe")
    selector = None
    if style == "fewshot":
        pool_name = pool_config or POOL_FOR_VARIANT.get(config)
        if pool_name is None:
            raise ValueError(f"no few-shot pool known for config '{config}'; name one (--pool / pool_config)")
        selector = FewShotSelector(read_config(folder, pool_name).records, k=shots)
    _, tpl_id, tpl_sha = _messages(loaded.records[0], style, selector)
    if selector is not None:  # the pool and k are part of what defines the run
        tpl_sha = hashlib.sha256(f"{tpl_sha}|{pool_name}|{shots}".encode()).hexdigest()
    extra: dict[str, object] = {"parse_fallback": parse_fallback.identity()} if parse_fallback else {}
    rid = run_id_for(model, backend_name, style, tpl_sha, decoding, loaded.dataset_id, config, extra)
    row = RunRow(
        run_id=rid,
        model=model,
        backend=backend_name,
        prompt_style=style,
        prompt_template_id=tpl_id,
        prompt_sha256=tpl_sha,
        decoding_json=_decoding_json(decoding, extra),
        dataset_id=loaded.dataset_id,
        config=config,
        package_version=__version__,
    )
    return RunIdentity(row, selector)


BatchHook = Callable[[list[PredictionRow], list[OptionScoreRow]], None]


def run(
    con: duckdb.DuckDBPyConnection,
    folder: Path,
    config: str,
    backend: Backend,
    style: str = "base",
    decoding: Decoding | None = None,
    limit: int | None = None,
    batch: int = 64,
    progress: bool = True,
    loaded: LoadedConfig | None = None,
    pool_config: str | None = None,
    shots: int = 4,
    parse_fallback: ParseFallback | None = None,
    keep: Callable[[str], bool] | None = None,
    on_rows: Callable[[int], None] | None = None,
    on_batch: BatchHook | None = None,
) -> RunSummary:
    """Run ``backend`` on every item of ``config`` (``decoding.n`` samples each), resumably.

    ``keep`` selects items by id (a shard of the sweep); ``on_rows`` is told how many prediction
    rows each result produced (the sweep's overall progress); ``on_batch`` sees each batch just
    before it is committed (a Parquet part writer keeps its own durable copy there)."""
    decoding = decoding or Decoding()
    loaded = loaded or register(con, folder, config)
    records = loaded.records[:limit] if limit else loaded.records
    if not records:
        raise ValueError(f"{folder}: config '{config}' has no items")
    ident = plan_run(
        folder,
        loaded,
        backend.model,
        backend.name,
        style,
        decoding,
        pool_config=pool_config,
        shots=shots,
        parse_fallback=parse_fallback,
    )
    if keep is not None:
        records = [r for r in records if keep(loaded.item_id(r))]
    selector, rid = ident.selector, ident.run_id
    insert(con, RunRow, [ident.row])
    _forget_errors(con, rid, [loaded.item_id(r) for r in records])
    have = dict(
        con.execute(
            "SELECT item_id, count(*) FROM predictions WHERE run_id = ? GROUP BY item_id", [rid]
        ).fetchall()
    )
    spaces = {loaded.item_id(r): _labels_of(r) for r in records}
    todo = [r for r in records if have.get(loaded.item_id(r), 0) < decoding.n]
    requests = (
        GenerationRequest(
            request_id=loaded.item_id(r),
            messages=_messages(r, style, selector)[0],
            decoding=decoding,
            image=_image_of(r, folder),
        )
        for r in todo
    )
    written = _drain(
        con,
        rid,
        backend,
        requests,
        spaces,
        total=len(todo),
        desc=f"{backend.model} on {config}",
        batch=batch,
        progress=progress,
        parse_fallback=parse_fallback,
        verdict=False,
        on_rows=on_rows,
        on_batch=on_batch,
    )
    return RunSummary(rid, len(todo), written, len(records) - len(todo), _outcomes(con, rid))


def _forget_errors(con: duckdb.DuckDBPyConnection, rid: str, item_ids: list[str]) -> None:
    """Drop the run's ``error`` rows for the items about to be considered, so they are asked again.

    An error row records a request that got no answer (server down, connection dropped, retries
    exhausted); it is not a result, and keeping it would make every later rerun skip the item, so an
    outage would stay in the store for good. The new result, or a new error row if it fails again,
    takes its place; a kill before then leaves the item missing, which the next rerun also requests.
    Only ``item_ids`` are touched (a rerun with ``limit`` keeps the error rows it will not redo).
    Error rows carry no option scores."""
    con.execute(
        "DELETE FROM predictions WHERE run_id = ? AND outcome = 'error' "
        "AND item_id IN (SELECT unnest(?::VARCHAR[]))",
        [rid, item_ids],
    )


def _drain(
    con: duckdb.DuckDBPyConnection,
    rid: str,
    backend: Backend,
    requests: Iterator[GenerationRequest],
    spaces: dict[str, _Labels],
    total: int,
    desc: str,
    batch: int,
    progress: bool,
    parse_fallback: ParseFallback | None,
    verdict: bool,
    on_rows: Callable[[int], None] | None = None,
    on_batch: BatchHook | None = None,
) -> int:
    """Turn results into rows and commit them ``batch`` rows at a time (each batch one transaction,
    after the parse fallback, if any, has read its unparsed replies). Returns rows written."""
    written = 0
    buf_p: list[PredictionRow] = []
    buf_s: list[OptionScoreRow] = []

    def flush() -> None:
        nonlocal written, buf_p, buf_s
        if parse_fallback is not None:
            buf_p = apply_parse_fallback(buf_p, spaces, parse_fallback)
        if on_batch is not None and buf_p:
            on_batch(buf_p, buf_s)
        insert_batch(con, [(PredictionRow, buf_p), (OptionScoreRow, buf_s)])
        written += len(buf_p)
        buf_p, buf_s = [], []

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(desc, total=total)
        for res in _iter(backend, requests):
            p, s = _rows_for(rid, res.request_id, spaces[res.request_id], res, verdict=verdict)
            buf_p.extend(p)
            buf_s.extend(s)
            bar.advance(task)
            if on_rows is not None:
                on_rows(len(p))
            if len(buf_p) >= batch:
                flush()
        flush()
    return written


def _outcomes(con: duckdb.DuckDBPyConnection, rid: str) -> dict[str, int]:
    return dict(
        con.execute(
            "SELECT outcome, count(*) FROM predictions WHERE run_id = ? GROUP BY outcome ORDER BY outcome",
            [rid],
        ).fetchall()
    )


# ---------------------------------------------------------------------------------------------
# self-evaluation (seed 003)
# ---------------------------------------------------------------------------------------------
def _question_block(rec: MCQItem | DeterminabilityCase) -> str:
    """What the judge is shown as the question: the case (or stem) and the options, without the
    decision prompt's formatting instructions, which were addressed to the answering model."""
    if isinstance(rec, DeterminabilityCase):
        return f"Case:\n{rec.vignette}\n\n{rec.question}\nPossible answers: {', '.join(DECISION)}."
    opts = "\n".join(f"{o.label}. {o.text}" for o in rec.options)
    return f"{rec.question}\n\n{opts}"


def judged_run(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str]:
    """The decision run a self-evaluation judges (model, backend, style, dataset, config)."""
    rows = con.execute(
        "SELECT model, backend, prompt_style, dataset_id, config FROM runs WHERE run_id = ?", [run_id]
    ).fetchall()
    if not rows:
        raise ValueError(f"no run '{run_id}' in the store; list runs with: SELECT run_id FROM runs")
    model, be, style, did, cfg = rows[0]
    if style.startswith(SELF_EVAL_PREFIX):
        raise ValueError(f"run '{run_id}' is itself a self-evaluation ({style}); judge a decision run")
    return {"model": model, "backend": be, "style": style, "dataset_id": did, "config": cfg}


def _self_eval_template(loaded: LoadedConfig) -> Any:
    return get_template("clindet_self_evaluation" if loaded.suite == "clindet" else "mcq_self_evaluation")


def plan_self_eval(
    judged: dict[str, str],
    decision_run_id: str,
    loaded: LoadedConfig,
    judge_backend: str,
    judge_model: str,
    decoding: Decoding,
    parse_fallback: ParseFallback | None = None,
) -> RunRow:
    """The ``runs`` row of the self-evaluation of ``decision_run_id`` (whose model, backend,
    style, dataset and config are ``judged``) by ``judge_model``; needs no store, so a sweep can
    plan it before the decision run exists."""
    tpl = _self_eval_template(loaded)
    style = SELF_EVAL_PREFIX + judged["style"]
    link = {"of_run": decision_run_id, "judge_backend": judge_backend, "judge_model": judge_model}
    extra: dict[str, object] = {"self_eval": link}
    if parse_fallback is not None:
        extra["parse_fallback"] = parse_fallback.identity()
    rid = run_id_for(
        judge_model, judge_backend, style, tpl.sha256, decoding, loaded.dataset_id, loaded.config, extra
    )
    return RunRow(
        run_id=rid,
        model=judged["model"],  # the judged run's identity: this is how the metric links them
        backend=judged["backend"],
        prompt_style=style,
        prompt_template_id=tpl.id,
        prompt_sha256=tpl.sha256,
        decoding_json=_decoding_json(decoding, extra),
        dataset_id=loaded.dataset_id,
        config=loaded.config,
        package_version=__version__,
    )


def run_self_eval(
    con: duckdb.DuckDBPyConnection,
    folder: Path,
    decision_run_id: str,
    backend: Backend,
    decoding: Decoding | None = None,
    limit: int | None = None,
    batch: int = 64,
    progress: bool = True,
    loaded: LoadedConfig | None = None,
    parse_fallback: ParseFallback | None = None,
    allow_other_model: bool = False,
    keep: Callable[[str], bool] | None = None,
    on_rows: Callable[[int], None] | None = None,
    on_batch: BatchHook | None = None,
) -> RunSummary:
    """Ask ``backend`` to judge each sample-0 answer of ``decision_run_id`` in a fresh conversation.

    ``folder`` must hold the dataset version the decision run used (its text is needed to show the
    question; the store keeps only what metrics join on). The judge should be the model that
    answered (seed 003); a different model is refused unless ``allow_other_model``, because the
    metric counts every linked verdict as the model's own. Decision samples that are errors have no
    answer to judge and are counted in ``skipped_no_answer``; every other sample, unparsed ones
    included, is judged on its raw text.
    """
    decoding = decoding or Decoding()
    if decoding.n != 1:
        raise ValueError("self-evaluation takes one verdict per answer (samples must be 1)")
    d = judged_run(con, decision_run_id)
    if backend.model != d["model"] and not allow_other_model:
        raise ValueError(
            f"run '{decision_run_id}' was answered by '{d['model']}', not '{backend.model}'; a "
            "self-evaluation uses the same model (allow another judge explicitly to override)"
        )
    loaded = loaded or read_config(folder, d["config"], expect_dataset_id=d["dataset_id"])
    if loaded.dataset_id != d["dataset_id"] or loaded.config != d["config"]:
        raise ValueError(
            f"run '{decision_run_id}' used {d['dataset_id'][:12]}/{d['config']}, "
            f"not {loaded.dataset_id[:12]}/{loaded.config}"
        )
    tpl = _self_eval_template(loaded)
    answers = dict(
        con.execute(
            "SELECT item_id, CASE WHEN outcome = 'error' THEN NULL ELSE raw_output END FROM predictions "
            "WHERE run_id = ? AND sample_index = 0",
            [decision_run_id],
        ).fetchall()
    )
    judged = [r for r in loaded.records if loaded.item_id(r) in answers]
    unknown = len(answers) - len(judged)
    if unknown:
        raise ValueError(f"run '{decision_run_id}' has {unknown} item(s) not in {folder}/{d['config']}")
    judged = judged[:limit] if limit else judged
    if not judged:
        raise ValueError(f"run '{decision_run_id}' has no sample-0 predictions to judge")
    if keep is not None:
        judged = [r for r in judged if keep(loaded.item_id(r))]
    row = plan_self_eval(d, decision_run_id, loaded, backend.name, backend.model, decoding, parse_fallback)
    rid = row.run_id
    insert(con, RunRow, [row])
    _forget_errors(con, rid, [loaded.item_id(r) for r in judged])
    have = {
        x[0]
        for x in con.execute(
            "SELECT item_id FROM predictions WHERE run_id = ? AND sample_index = 0", [rid]
        ).fetchall()
    }
    no_answer = [r for r in judged if answers[loaded.item_id(r)] is None]
    todo = [r for r in judged if answers[loaded.item_id(r)] is not None and loaded.item_id(r) not in have]
    requests = (
        GenerationRequest(
            request_id=loaded.item_id(r),
            messages=tpl.render(question_block=_question_block(r), answer=answers[loaded.item_id(r)]),
            decoding=decoding,
            image=_image_of(r, folder),
        )
        for r in todo
    )
    spaces = {loaded.item_id(r): _VERDICT_SPACE for r in todo}
    written = _drain(
        con,
        rid,
        backend,
        requests,
        spaces,
        total=len(todo),
        desc=f"self-evaluation of {decision_run_id}",
        batch=batch,
        progress=progress,
        parse_fallback=parse_fallback,
        verdict=True,
        on_rows=on_rows,
        on_batch=on_batch,
    )
    skipped = len(judged) - len(no_answer) - len(todo)
    return RunSummary(rid, len(todo), written, skipped, _outcomes(con, rid), skipped_no_answer=len(no_answer))


def _iter(backend: Backend, requests: Iterator[GenerationRequest]) -> Iterator[GenerationResult]:
    yield from backend.generate(requests)


def count_predictions(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    return int(scalar(con, "SELECT count(*) FROM predictions WHERE run_id = ?", [run_id]))
