"""Execute planned runs: one ``equipoise run``, or a whole sweep into a store or into Parquet parts.

The runner (:mod:`runner`) does one run resumably against a DuckDB connection. This module adds
what a sweep needs around it: building each backend once, a shard filter, one progress display for
all runs, and the *parts* mode, in which a worker keeps its rows in an in-memory store (loaded from
the parts already in the folder, so it resumes like a store) and writes every committed batch as a
Parquet part (:mod:`parts`). A shard process, a Ray task and a plain process all go through
:func:`execute_planned`, so they produce the same rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from equipoise.evaluators.ingest import LoadedConfig, register
from equipoise.evaluators.parts import ingest_parts, write_part
from equipoise.evaluators.planner import WHOLE, PlannedRun, RunSpec, Shard, make_backend
from equipoise.evaluators.runner import ParseFallback, RunSummary, run, run_self_eval
from equipoise.evaluators.store import TABLE_MODELS, OptionScoreRow, PredictionRow, connect_memory
from equipoise.schemas.features import to_table

ACCURACY_SQL = """SELECT avg(coalesce(p.parsed_label = i.target_label, false)::INT)
   FROM predictions p JOIN runs r USING (run_id)
   JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
   WHERE p.run_id = ?"""


# ---------------------------------------------------------------------------------------------
# one run (`equipoise run`)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunOutcome:
    """What ``equipoise run`` prints: the summary, plus accuracy or the self-evaluation verdicts."""

    summary: RunSummary
    accuracy: float | None = None
    verdicts: dict[str, int] = field(default_factory=dict)


def execute_run(
    con: duckdb.DuckDBPyConnection,
    spec: RunSpec,
    loaded: LoadedConfig,
    self_eval_of: str | None = None,
    other_judge: bool = False,
    progress: bool = True,
) -> RunOutcome:
    """Do one run (or one self-evaluation of ``self_eval_of``) into the store ``con``."""
    records = {loaded.item_id(r): r for r in loaded.records}
    backend = make_backend(spec, records)
    fallback = None
    if spec.parse_fallback_model is not None:
        fallback = ParseFallback(make_backend(spec, records, model=spec.parse_fallback_model))
    folder = Path(spec.folder)
    if self_eval_of is not None:
        summary = run_self_eval(
            con,
            folder,
            self_eval_of,
            backend,
            decoding=spec.decoding,
            limit=spec.limit,
            batch=spec.commit_every,
            loaded=loaded,
            parse_fallback=fallback,
            allow_other_model=other_judge,
            progress=progress,
        )
        verdicts = dict(
            con.execute(
                "SELECT coalesce(parsed_label, 'no verdict'), count(*) FROM predictions "
                "WHERE run_id = ? GROUP BY ALL ORDER BY ALL",
                [summary.run_id],
            ).fetchall()
        )
        return RunOutcome(summary, verdicts=verdicts)
    summary = run_spec(con, spec, loaded, backend, parse_fallback=fallback, progress=progress)
    acc = con.execute(ACCURACY_SQL, [summary.run_id]).fetchall()[0][0]
    return RunOutcome(summary, accuracy=acc)


# ---------------------------------------------------------------------------------------------
# a sweep
# ---------------------------------------------------------------------------------------------
class PartsSink:
    """Where a worker in parts mode writes: an in-memory store mirroring the parts in ``root``
    (so resume sees what earlier attempts committed) and one Parquet part per committed batch."""

    def __init__(self, root: Path, shard: Shard, load: bool = True) -> None:
        self.root = root
        self.shard = shard
        self.con = connect_memory()
        if load:  # a Ray Data replica is sent only missing items and needs no mirror
            ingest_parts(self.con, root)
        self._meta: set[str] = set()

    def write_meta_for(self, spec: RunSpec, loaded: LoadedConfig, backend: Any) -> str:
        """Insert the runs row of ``spec`` (as ``backend`` names it) and write its meta part once."""
        from equipoise.evaluators.runner import plan_run
        from equipoise.evaluators.store import RunRow, insert

        ident = plan_run(
            Path(spec.folder),
            loaded,
            backend.model,
            backend.name,
            spec.style,
            spec.decoding,
            pool_config=spec.pool,
            shots=spec.shots,
        )
        if ident.run_id not in self._meta:
            insert(self.con, RunRow, [ident.row])
            self._write_meta(ident.run_id, loaded)
            self._meta.add(ident.run_id)
        return ident.run_id

    def write_meta(self, planned: PlannedRun, loaded: LoadedConfig) -> None:
        """The run's ``runs`` row and its config's dataset, items and options, as one part (once
        per run and shard), so a folder of parts is a complete store on its own."""
        self._write_meta(planned.run_id, loaded)

    def _write_meta(self, rid: str, loaded: LoadedConfig) -> None:
        key = [loaded.dataset_id, loaded.config]
        tables: dict[str, pa.Table] = {
            "runs": self._rows("runs", "run_id = ?", [rid]),
            "datasets": self._rows("datasets", "dataset_id = ? AND config = ?", key),
            "items": self._rows("items", "dataset_id = ? AND config = ?", key),
            "options": self._rows("options", "dataset_id = ? AND config = ?", key),
        }
        write_part(self.root, f"{rid}-{self.shard.tag}-meta", tables)

    def _rows(self, table: str, where: str, params: list[Any]) -> pa.Table:
        want = to_table(TABLE_MODELS[table], []).schema
        got = self.con.sql(f"SELECT {', '.join(want.names)} FROM {table} WHERE {where}", params=params)
        return got.to_arrow_table().cast(want)

    def on_batch(self, preds: list[PredictionRow], scores: list[OptionScoreRow]) -> None:
        keys = "\n".join(f"{p.item_id}\x1f{p.sample_index}" for p in preds)
        digest = hashlib.sha256(keys.encode()).hexdigest()[:16]
        write_part(
            self.root,
            f"{preds[0].run_id}-{self.shard.tag}-{digest}",
            {"predictions": preds, "option_scores": scores},
        )


@dataclass(frozen=True)
class SweepResult:
    planned: PlannedRun
    summary: RunSummary | None  # None: nothing was left to do


ProgressHook = Callable[[PlannedRun, int], None]


def execute_planned(
    planned: list[PlannedRun],
    con: duckdb.DuckDBPyConnection,
    shard: Shard = WHOLE,
    sink: PartsSink | None = None,
    on_rows: ProgressHook | None = None,
    loaded_cache: dict[tuple[str, str], LoadedConfig] | None = None,
) -> list[SweepResult]:
    """Execute every planned run with rows left to do, in order, into ``con`` (a store, or the
    sink's in-memory mirror). Backends other than the reference policies are built once per model
    and endpoint and reused across configs (a vLLM model is loaded once per sweep)."""
    backends: dict[tuple[str, str, str | None, int], Any] = {}
    results: list[SweepResult] = []
    cache = loaded_cache if loaded_cache is not None else {}
    for p in planned:
        if p.remaining == 0:
            results.append(SweepResult(p, None))
            continue
        spec = p.spec
        loaded = register(con, Path(spec.folder), spec.config, location=spec.dataset)
        cache[(spec.folder, spec.config)] = loaded
        backend = backend_for(spec, loaded, backends)
        hook = (lambda n, _p=p: on_rows(_p, n)) if on_rows is not None else None
        if p.of_run is not None:
            results.append(SweepResult(p, _self_eval(p, con, loaded, backend, shard, sink, hook)))
            continue
        if sink is not None:
            sink.write_meta_for(spec, loaded, backend)
        summary = run_spec(
            con,
            spec,
            loaded,
            backend,
            keep=shard.keeps,
            on_rows=hook,
            on_batch=sink.on_batch if sink is not None else None,
        )
        results.append(SweepResult(p, summary))
    return results


def backend_for(spec: RunSpec, loaded: LoadedConfig, backends: dict[tuple, Any]) -> Any:
    """The backend of ``spec``: a reference policy is built per config (it reads the gold labels of
    exactly these records); any other backend is shared through ``backends`` by endpoint, so its
    client and concurrency cap serve every run of the same model."""
    if spec.backend == "reference":
        return make_backend(spec, {loaded.item_id(r): r for r in loaded.records})
    key = (spec.backend, spec.model, spec.base_url, spec.concurrency)
    if key not in backends:
        backends[key] = make_backend(spec, {})
    return backends[key]


def run_spec(
    con: duckdb.DuckDBPyConnection,
    spec: RunSpec,
    loaded: LoadedConfig,
    backend: Any,
    keep: Callable[[str], bool] | None = None,
    on_rows: Callable[[int], None] | None = None,
    on_batch: Callable[[list[PredictionRow], list[OptionScoreRow]], None] | None = None,
    parse_fallback: ParseFallback | None = None,
    progress: bool = False,
) -> RunSummary:
    """One decision run of ``spec`` (its style, decoding, limit, pool and shots), restricted to the
    items ``keep`` accepts: the single place a spec becomes a :func:`runner.run` call, for
    ``equipoise run``, the in-process sweep and the Ray replicas alike."""
    return run(
        con,
        Path(spec.folder),
        spec.config,
        backend,
        style=spec.style,
        decoding=spec.decoding,
        limit=spec.limit,
        batch=spec.commit_every,
        progress=progress,
        loaded=loaded,
        pool_config=spec.pool,
        shots=spec.shots,
        parse_fallback=parse_fallback,
        keep=keep,
        on_rows=on_rows,
        on_batch=on_batch,
    )


def _self_eval(
    p: PlannedRun,
    con: duckdb.DuckDBPyConnection,
    loaded: LoadedConfig,
    backend: Any,
    shard: Shard,
    sink: PartsSink | None,
    hook: Callable[[int], None] | None,
) -> RunSummary:
    """The self-evaluation pass of the decision run ``p.of_run`` (executed just before it)."""
    from equipoise.evaluators.runner import judged_run, plan_self_eval
    from equipoise.evaluators.store import RunRow, insert

    assert p.of_run is not None
    decoding = p.spec.decoding.model_copy(update={"n": 1})
    if sink is not None:
        row = plan_self_eval(
            judged_run(con, p.of_run), p.of_run, loaded, backend.name, backend.model, decoding
        )
        insert(con, RunRow, [row])
        sink.write_meta(p, loaded)
    return run_self_eval(
        con,
        Path(p.spec.folder),
        p.of_run,
        backend,
        decoding=decoding,
        limit=p.spec.limit,
        batch=p.spec.commit_every,
        progress=False,
        loaded=loaded,
        keep=shard.keeps,
        on_rows=hook,
        on_batch=sink.on_batch if sink is not None else None,
    )


SUMMARY_SQL = """
SELECT r.run_id,
       count(p.run_id)                                                      AS rows,
       count(*) FILTER (WHERE p.outcome = 'answered')                      AS answered,
       count(*) FILTER (WHERE p.outcome = 'abstained')                     AS abstained,
       count(*) FILTER (WHERE p.outcome IN ('unparsed', 'error'))          AS unparsed,
       avg(coalesce(p.parsed_label = i.target_label, false)::INT)
           FILTER (WHERE r.prompt_style NOT LIKE 'self_eval:%')           AS accuracy
FROM runs r
LEFT JOIN predictions p USING (run_id)
LEFT JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
WHERE r.run_id IN (SELECT unnest(?::VARCHAR[]))
GROUP BY r.run_id
"""


def sweep_summary(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, tuple]:
    """Per run: stored rows, answered, abstained, unparsed or error, accuracy (SQL over the store)."""
    rows = con.execute(SUMMARY_SQL, [run_ids]).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def run_sweep(
    planned: list[PlannedRun],
    con: duckdb.DuckDBPyConnection,
    shard: Shard = WHOLE,
    sink: PartsSink | None = None,
    console: Any = None,
    progress: bool = True,
) -> list[SweepResult]:
    """:func:`execute_planned` under one progress display for the whole sweep: a line with done /
    total predictions and the ETA, and one line per run that has work left."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("predictions"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        total = bar.add_task(
            "[bold]sweep",
            total=sum(p.total for p in planned),
            completed=sum(min(p.done, p.total) for p in planned),
        )
        rows = {
            p.run_id: bar.add_task(
                f"  {Path(p.spec.dataset).name}/{p.spec.config} {p.spec.model} {p.spec.style}",
                total=p.total,
                completed=min(p.done, p.total),
            )
            for p in planned
            if p.remaining
        }

        def advance(p: PlannedRun, n: int) -> None:
            bar.advance(total, n)
            bar.advance(rows[p.run_id], n)

        return execute_planned(planned, con, shard=shard, sink=sink, on_rows=advance)
