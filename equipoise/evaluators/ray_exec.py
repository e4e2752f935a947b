"""Run a sweep on a Ray cluster: the same shards as ``--shard I/N``, scheduled by Ray.

Nothing here schedules work itself. The sweep is cut into N shards by item key (the planner's
:class:`Shard`), and each shard is one Ray task that runs :func:`executor.execute_planned` in parts
mode, exactly what ``equipoise eval --shard I/N --parts DIR`` does in a process of its own. So a
Ray run, a SLURM array of shards and a single process produce the same rows, and Ray's own
machinery does the rest:

* placement: ``ray.init()`` finds the cluster (``RAY_ADDRESS``, or a local one); shards of API and
  reference runs take one CPU each; a self-evaluation pass of a vLLM model asks one GPU per shard;
* vLLM decision runs instead stream their missing items through Ray Data (:func:`run_sweep_ray_data`)
  to a pool of :class:`Replica` actors, one per GPU, each loading the model once and answering
  batches through the same runner, writing the same parts;
* failure: a worker that dies (OOM, preemption, a kill) is retried by Ray (``max_retries``); the
  retry starts from the parts its predecessor committed, so nothing is asked twice or lost, and a
  half-written part is a hidden folder that nobody reads.

The driver ingests parts into the store as they arrive (every ``poll`` seconds and once at the
end), so the store fills while the cluster works and a killed driver loses nothing: a rerun
ingests what the workers wrote and asks only for what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from equipoise.evaluators.executor import PartsSink, execute_planned
from equipoise.evaluators.parts import ingest_parts, part_dirs
from equipoise.evaluators.planner import PlannedRun, RunSpec, Shard, plan_status

MAX_RETRIES = 3


class RayUnavailable(RuntimeError):
    """``--ray`` without Ray installed."""


class ShardFailed(RuntimeError):
    """A shard failed after Ray's retries; the message names it and how to resume."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'equipoise[ray]'") from None
    return ray


def run_shard(specs: list[RunSpec], index: int, count: int, root: str) -> int:
    """One shard of the sweep in parts mode (the body of a Ray task; also callable directly).
    Returns the prediction rows it wrote."""
    shard = Shard(index, count)
    sink = PartsSink(Path(root), shard)
    try:
        planned = plan_status(specs, sink.con, shard)
        results = execute_planned(planned, sink.con, shard=shard, sink=sink)
    finally:
        sink.con.close()
    return sum(r.summary.written for r in results if r.summary is not None)


def run_sweep_ray(
    planned: list[PlannedRun],
    con: duckdb.DuckDBPyConnection,
    root: Path,
    workers: int | None = None,
    console: Any = None,
    progress: bool = True,
    poll: float = 0.5,
) -> int:
    """Run the runs of ``planned`` that have work left on Ray, ingesting parts from ``root`` into
    the store ``con`` as they arrive: vLLM decision runs stream through Ray Data to one model
    replica per GPU (:func:`run_sweep_ray_data`), everything else (reference policies, API models,
    self-evaluation passes) runs as shard tasks (:func:`run_sweep_ray_tasks`). Returns the
    prediction rows added to the store."""
    streamed = [p for p in planned if p.spec.backend == "vllm" and p.of_run is None and p.remaining]
    rest = [p for p in planned if p not in streamed]
    added = 0
    if streamed:
        added += run_sweep_ray_data(streamed, con, root, replicas=workers, console=console, progress=progress)
    if any(p.remaining for p in rest):
        # a self-evaluation judges stored decisions: plan its counts again after they ran
        if streamed:
            rest = plan_status([p.spec for p in rest], con)
        added += run_sweep_ray_tasks(rest, con, root, workers, console=console, progress=progress, poll=poll)
    return added


def run_sweep_ray_tasks(
    planned: list[PlannedRun],
    con: duckdb.DuckDBPyConnection,
    root: Path,
    workers: int | None = None,
    console: Any = None,
    progress: bool = True,
    poll: float = 0.5,
) -> int:
    """The shard-task path: N Ray tasks, each one shard of every run (see the module docstring)."""
    ray = _ray()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    specs = [p.spec for p in planned if p.remaining]
    gpu = any(s.backend == "vllm" for s in specs)
    res = ray.cluster_resources()
    if gpu and not res.get("GPU"):
        raise ShardFailed("the plan has vLLM models but the Ray cluster has no GPU")
    count = workers or max(int(res.get("GPU" if gpu else "CPU", 1)), 1)
    root.mkdir(parents=True, exist_ok=True)
    _seed_parts(con, root, [p for p in planned if p.done > 0 and p.remaining])
    task = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0, max_retries=MAX_RETRIES)(run_shard)
    refs = {task.remote(specs, i, count, str(root)): i for i in range(count)}
    added = 0
    seen: set[Path] = set()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not progress) as bar:
        t = bar.add_task(
            f"[bold]sweep on Ray ({count} shards)",
            total=sum(p.total for p in planned),
            completed=sum(min(p.done, p.total) for p in planned),
        )
        failures: list[str] = []
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=poll)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as exc:  # a shard that failed after Ray's retries
                    failures.append(f"shard {refs[ref]}/{count}: {type(exc).__name__}: {str(exc)[:200]}")
            new = [p for p in part_dirs(root) if p not in seen]
            if new:
                n = ingest_parts(con, root, only=new).predictions_added
                seen.update(new)
                added += n
                bar.advance(t, n)
        new = [p for p in part_dirs(root) if p not in seen]
        added += ingest_parts(con, root, only=new).predictions_added
    if failures:
        raise ShardFailed(
            "; ".join(failures) + " (what the other shards wrote is stored; run the same command to resume)"
        )
    return added


def _seed_parts(con: duckdb.DuckDBPyConnection, root: Path, partial: list[PlannedRun]) -> None:
    """Copy what the store already holds of partly done runs into a part, so workers (which read
    only parts: the store file is the driver's) do not ask for it again."""
    from equipoise.evaluators.parts import write_part
    from equipoise.evaluators.store import TABLE_MODELS
    from equipoise.schemas.features import to_table

    for p in partial:
        tables = {}
        for table, where in (("runs", "run_id = ?"), ("predictions", "run_id = ? AND outcome <> 'error'")):
            want = to_table(TABLE_MODELS[table], []).schema
            cur = con.sql(f"SELECT {', '.join(want.names)} FROM {table} WHERE {where}", params=[p.run_id])
            tables[table] = cur.to_arrow_table().cast(want)
        # the predictions' option scores travel on their rows (store schema v3: two list columns)
        write_part(root, f"store-{p.run_id}-{p.done}", tables)


# ---------------------------------------------------------------------------------------------
# Ray Data: items streamed through a pool of model replicas (vLLM: one per GPU)
# ---------------------------------------------------------------------------------------------
class Replica:
    """A Ray Data actor: one model replica per backend (a vLLM model is loaded once per actor, so
    once per GPU), answering batches of (run, item) rows through :func:`runner.run` and writing
    each committed batch as a part. Returns one row per (run, item) it was given."""

    def __init__(self, specs: list[RunSpec], root: str) -> None:
        self.specs = specs
        self.root = Path(root)
        self.sink = PartsSink(self.root, Shard(), load=False)
        self.loaded: dict[int, Any] = {}
        self.backends: dict[tuple, Any] = {}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from equipoise.evaluators.executor import backend_for, run_spec
        from equipoise.evaluators.ingest import register

        runs = [int(x) for x in batch["run"]]
        items = [str(x) for x in batch["item_id"]]
        for k in sorted(set(runs)):
            spec = self.specs[k]
            if k not in self.loaded:
                self.loaded[k] = register(
                    self.sink.con, Path(spec.folder), spec.config, location=spec.dataset
                )
            loaded = self.loaded[k]
            backend = backend_for(spec, loaded, self.backends)
            mine = {i for r, i in zip(runs, items, strict=True) if r == k}
            self.sink.write_meta_for(spec, loaded, backend)
            run_spec(
                self.sink.con, spec, loaded, backend, keep=mine.__contains__, on_batch=self.sink.on_batch
            )
        return {"run": runs, "item_id": items}


def run_sweep_ray_data(
    planned: list[PlannedRun],
    con: duckdb.DuckDBPyConnection,
    root: Path,
    replicas: int | None = None,
    batch_size: int = 64,
    console: Any = None,
    progress: bool = True,
) -> int:
    """Stream the missing items of ``planned`` through Ray Data to a pool of :class:`Replica`
    actors (one GPU each when the plan has vLLM models), ingesting their parts into ``con`` as
    batches complete. Self-evaluation specs are not supported here (use the task path)."""
    ray = _ray()
    import logging

    from ray import data as ray_data
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from equipoise.evaluators.ingest import read_config

    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the sweep shows its own progress
    ray_data.DataContext.get_current().enable_progress_bars = False
    if any(p.of_run for p in planned):
        raise ShardFailed("self-evaluation passes run on the task path (leave out the Ray Data engine)")
    root.mkdir(parents=True, exist_ok=True)
    ingest_parts(con, root)  # what earlier attempts committed counts as done
    specs = [p.spec for p in planned]
    rows: list[dict[str, Any]] = []
    for k, p in enumerate(planned):
        spec = p.spec
        loaded = read_config(Path(spec.folder), spec.config)
        records = loaded.records[: spec.limit] if spec.limit else loaded.records
        have = dict(
            con.execute(
                "SELECT item_id, count(*) FROM predictions WHERE run_id = ? AND outcome <> 'error' "
                "GROUP BY item_id",
                [p.run_id],
            ).fetchall()
        )
        rows += [
            {"run": k, "item_id": i}
            for i in (loaded.item_id(r) for r in records)
            if have.get(i, 0) < spec.decoding.n
        ]
    if not rows:
        return 0
    gpu = any(s.backend == "vllm" for s in specs)
    res = ray.cluster_resources()
    if gpu and not res.get("GPU"):
        raise ShardFailed("the plan has vLLM models but the Ray cluster has no GPU")
    count = replicas or max(int(res.get("GPU" if gpu else "CPU", 1)), 1)
    ds = ray_data.from_items(rows).map_batches(
        Replica,
        fn_constructor_args=(specs, str(root)),
        batch_size=batch_size,
        batch_format="numpy",
        concurrency=count,
        num_cpus=1,
        num_gpus=1 if gpu else 0,
    )
    added = 0
    seen = set(part_dirs(root))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not progress) as bar:
        t = bar.add_task(f"[bold]Ray Data ({count} replicas)", total=len(rows))
        for out in ds.iter_batches(batch_size=None):
            bar.advance(t, len(out["item_id"]))
            new = [p for p in part_dirs(root) if p not in seen]
            if new:
                added += ingest_parts(con, root, only=new).predictions_added
                seen.update(new)
    new = [p for p in part_dirs(root) if p not in seen]
    return added + ingest_parts(con, root, only=new).predictions_added
