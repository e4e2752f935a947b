"""A metrics pass in lanes: many metrics written to their files over one store, ``jobs`` at a time.

Why: a pass over a store's fact tables (``equipoise metrics --out DIR``, ``equipoise report``)
leaves cores idle. DuckDB runs each query on every core, but a metric also has single-threaded
phases (a final sort or window, a Parquet write, numpy work on a small result), so one
metric after another keeps two cores busy about 1.5 of the time (at 1M predictions: 10.4 CPU s in
6.8 s). Two metrics at once, each on its own DuckDB connection to the same database (a
``cursor``; DuckDB releases the GIL while it works), fill those gaps.

What stays as in a sequential pass:

- the results. A metric reads only the store's fact tables (read-only, one snapshot) and caches
  named for everything their rows depend on (``registry.cached_table``), so what it writes does not
  depend on which lane runs it or what ran before; the resampling metrics draw from their own
  seeded generators, never a global one. ``tests/test_pass_runner.py`` checks the files are the
  same bytes as a sequential pass's.
- the memory bound. DuckDB's ``memory_limit`` belongs to the database instance, which the lanes
  share: the cap that ``registry.prepare`` sets for the pass (``cap_pass_memory``) bounds all
  lanes together, and the lanes do not set it again; what a second lane adds outside that limit
  is one more result being written. Should a metric still run out of memory beside another, it is
  run again alone after the lanes finish, on its own lane's connection (its group's caches).
- the BLAS threads, as far as a metric can tell. threadpoolctl's limit is process-wide and meant
  to be set from the main thread, so a pass in lanes sets one BLAS thread around all its lanes
  (the cores are busy with the other lane anyway), and unc_combiners, which limits its own fits
  when it runs in the main thread, leaves it alone in a lane. A sequential pass keeps the default
  BLAS threads for the other metrics: the robustness bootstraps' matrix-vector products were
  0.1 s slower each at 1M with one (benchmarks/RESULTS.md, stop 22). Those products (``counts @
  c``, 1,000-2,000 draws of up to 160k units) gave the same bits with one and two OpenBLAS
  threads, in both memory layouts, when checked this stop: each output is one row's dot product.
- DuckDB's threads. The ``threads`` setting belongs to the database, so the lanes share it: a
  pass in lanes sets it to the cores' share of one lane (``lane_threads``: one each for 2 lanes on
  2 cores) and restores it afterwards. Each lane then keeps its own core busy with one thread
  instead of two threads per lane competing for both, which spends less CPU on the parallel
  operators' bookkeeping (measured at 1M predictions: see ``DEFAULT_JOBS``). The results do not
  depend on it: facts and metrics are bit-identical across thread counts
  (``tests/test_store_facts.py``).
- the caches. TEMP tables are per connection, so metrics that share one run in the same lane, one
  after the other: the metrics of one module (e.g. the conformal ones share the calibration mask,
  aurc / prr their selective rows) form a group, unless a metric declares a group of its own
  (``Metric.lane_group``: the uncertainty metrics, which read the write-time fact and share only
  the normalisation bounds), and a lane takes whole groups.

Memory decides the schedule. The groups whose working set is most of the pass's cap
(``HEAVY_GROUPS``: the conformal metrics and their calibration mask) run in lane 0, one after the
other, never beside each other: when the uncertainty metrics still formed one such group with them,
the two evicted each other's store blocks and spilled (a 2-lane pass that ran them together was
slower than the sequential pass at 1M predictions under the cap, a helper's measurement on a
loaded box). The other lanes take the light groups (calibration, robustness, each uncertainty
metric, CLEAR, ...) from a shared queue, heaviest first (``GROUP_WEIGHTS``), and lane 0 helps with
what is left. The order only decides speed. ``jobs=1`` is the sequential pass, and so is every
pass whose base relations are not the store's fact tables: a lane would compute its own TEMP
copies of them, the store's size again per lane.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from equipoise.evaluators.metrics import registry
from equipoise.evaluators.metrics.registry import REGISTRY, _load_all, uses_facts

# the lanes of `equipoise metrics --out` (its --jobs), of `equipoise report` and of metrics_bench.py.
# Measured on 2 cores (benchmarks/RESULTS.md, issue 13): at stop 22, 1M predictions, 5.97-6.20 s in
# 2 lanes against 6.54-6.81 s in one, the same CPU and peak RSS; at stop 23, with the uncertainty
# metrics in lane groups of their own and one DuckDB thread per lane, the 1M pass took 5.12 / 5.32 s
# (9.59 / 9.87 CPU s) against 5.43 / 5.54 s (10.23 / 10.55 CPU s) with two DuckDB threads per lane
# (the same code, runs alternated). One lane (--jobs 1) is the sequential pass.
DEFAULT_JOBS = 2

# groups that run in lane 0 only, one at a time, in this order (see the module docstring): the
# conformal metrics, whose calibration mask needs most of the pass's memory cap.
HEAVY_GROUPS: tuple[str, ...] = ("conformal",)

# scheduling weight of each light group: its metrics' share of a sequential pass, in seconds at 1M
# predictions (each metric's registry.write_result, one after the other, on d38ff23, stop 22's code). Only
# the order lanes take groups in follows from it (heaviest first, so that no lane is left with a
# long group at the end); a group not listed weighs 0 and is taken last.
GROUP_WEIGHTS: dict[str, float] = {
    "calibration": 0.88,
    "robustness": 0.61,
    "unc_scores": 0.58,
    "unc_auroc": 0.53,
    "unc_bounds": 0.37,
    "unc_combiners": 0.29,
    "clear_metrics": 0.18,
    "unc_summary": 0.14,
    "determinability": 0.13,
}


@dataclass(frozen=True)
class MetricDone:
    """One metric written: its file, row count, its own wall time in its lane, and the lane.
    ``retried``: it ran out of memory beside other lanes and was run again alone after them; its
    seconds are the second attempt's (the first attempt's time is in the pass's, no metric's), so
    a caller timing the pass can say why a pass took longer."""

    name: str
    path: Path
    rows: int
    seconds: float
    lane: int
    retried: bool = False


class PassError(RuntimeError):
    """A metric of the pass failed: ``name`` says which, ``error`` (also the cause) is what it raised."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"{name}: {error}")
        self.name, self.error = name, error


def cache_group(name: str) -> str:
    """The group of metric ``name``: its ``lane_group`` where it declares one, else the module of
    its Python code (metrics of one module share TEMP caches), or its own name for a metric that
    is plain SQL (it caches nothing)."""
    metric = REGISTRY[name]
    if metric.lane_group is not None:
        return metric.lane_group
    fn = metric.sql_fn or metric.compute_fn or metric.post
    module = getattr(fn, "__module__", None)
    return module.rsplit(".", 1)[-1] if module else name


def schedule(names: Sequence[str]) -> tuple[list[list[str]], list[list[str]]]:
    """``names`` as groups (``cache_group``): the heavy ones (``HEAVY_GROUPS``, in that order) and
    the light ones, heaviest first (``GROUP_WEIGHTS``, then by name); within a group the metrics
    keep their order in ``names``."""
    _load_all()
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(cache_group(name), []).append(name)
    heavy = [groups[g] for g in HEAVY_GROUPS if g in groups]
    light = sorted(
        (g for g in groups if g not in HEAVY_GROUPS), key=lambda g: (-GROUP_WEIGHTS.get(g, 0.0), g)
    )
    return heavy, [groups[g] for g in light]


def run_pass(
    con: duckdb.DuckDBPyConnection,
    targets: Mapping[str, Path],
    *,
    by: Sequence[str] | None = None,
    params: Mapping[str, dict] | None = None,
    jobs: int = DEFAULT_JOBS,
    on_done: Callable[[MetricDone], None] | None = None,
    on_error: Callable[[str, Exception], bool] | None = None,
    sums: Mapping[str, str] | None = None,
) -> list[MetricDone]:
    """Write every metric of ``targets`` (name -> file, ``registry.write_result``) over the store of
    ``con``, in up to ``jobs`` lanes (see the module docstring), grouped by ``by`` (default: each
    metric's own) with ``params[name]``. Prepares ``con`` for a pass (``prepare(materialize=True)``,
    with the store's source ``sums`` where the caller has them) and a cursor per further lane,
    closed at the end. ``on_done`` is called after each metric, one call at a time (progress,
    caching the file). A failure stops the lanes from taking further
    metrics and raises ``PassError`` for the first failed metric in ``targets`` order, unless
    ``on_error(name, error)`` returns True: the failure is then the caller's record and the pass
    goes on (a report skips a metric the store cannot give, a benchmark reports it). Like
    ``on_done`` it runs in a lane's thread, one call at a time; should it raise, that error is the
    metric's failure (``PassError``), never lost with its lane. A metric out of memory beside
    others is run again alone at the end, and reaches ``on_error`` only if it fails again then; a
    query stopped because the caller was interrupted never does. Returns the metrics in the order
    done."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    registry.prepare(con, materialize=True, sums=sums)
    heavy, light = schedule(list(targets))
    if not uses_facts(con):
        jobs = 1
    jobs = max(1, min(jobs, len(light) + min(1, len(heavy))))
    if jobs == 1:  # the sequential pass: the metrics in the caller's order
        heavy, light = [list(targets)], []
    lanes = [con]
    done: list[MetricDone] = []
    failed: dict[str, BaseException] = {}
    retry: list[tuple[str, int]] = []  # (metric, its lane): run again alone, on that lane's connection
    stop = threading.Event()  # set when the caller is interrupted: lanes take no further metric
    ended: dict[int, threading.Event] = {}  # per lane thread started: set when its work returns
    lock = threading.Lock()
    todo: queue.SimpleQueue[list[str]] = queue.SimpleQueue()
    for group in light:
        todo.put(group)

    def run_one(lane: int, c: duckdb.DuckDBPyConnection, name: str, retried: bool = False) -> None:
        t0 = time.perf_counter()
        rows = registry.write_result(c, name, targets[name], by=by, params=(params or {}).get(name))
        record = MetricDone(name, Path(targets[name]), rows, time.perf_counter() - t0, lane, retried)
        with lock:
            done.append(record)
            if on_done is not None:
                on_done(record)

    def run_group(lane: int, c: duckdb.DuckDBPyConnection, group: list[str]) -> None:
        for name in group:
            if failed or stop.is_set():
                return
            try:
                run_one(lane, c, name)
            except Exception as exc:  # stops every lane (raised below), unless on_error keeps it
                with lock:
                    if stop.is_set():  # interrupted by the caller: not the metric's failure
                        failed[name] = exc
                    elif jobs > 1 and isinstance(exc, duckdb.OutOfMemoryException):
                        retry.append((name, lane))  # beside other lanes: run again alone at the end
                    elif (error := _failure(on_error, name, exc)) is not None:
                        failed[name] = error

    def work(lane: int, c: duckdb.DuckDBPyConnection) -> None:
        try:
            for group in heavy if lane == 0 else []:
                run_group(lane, c, group)
            while not failed and not stop.is_set():
                try:
                    group = todo.get_nowait()
                except queue.Empty:
                    return
                run_group(lane, c, group)
        finally:
            ended[lane].set()

    try:
        with _lane_settings(con, jobs):
            try:
                for _ in range(jobs - 1):
                    cur = con.cursor()
                    lanes.append(cur)
                    # the facts con's prepare found current (the same database, so the same
                    # snapshot), and not its memory cap: the pass's memory_limit is the database's,
                    # set once by that prepare
                    registry.read_facts(cur)
                if jobs == 1:
                    ended[0] = threading.Event()
                    work(0, con)
                else:
                    threads: list[threading.Thread] = [
                        threading.Thread(target=work, args=(i, c), name=f"metrics-lane-{i}")
                        for i, c in enumerate(lanes)
                    ]
                    for i, t in enumerate(threads):
                        ended[i] = threading.Event()
                        try:
                            t.start()
                        except BaseException:
                            ended[i].set()  # never ran: nothing to wait for
                            raise
                    for t in threads:
                        t.join()
            finally:
                # the caller was interrupted (e.g. Ctrl-C) while a lane works. Its `ended`, not
                # is_alive(): a join that Ctrl-C interrupted can mark a thread stopped that still runs
                if not all(e.is_set() for e in ended.values()):
                    stop.set()
                    for c in lanes:
                        c.interrupt()  # the running queries end with an error; the lanes then stop
                    for e in ended.values():
                        e.wait()
        if failed:
            name = next(n for n in targets if n in failed)
            raise PassError(name, failed[name]) from failed[name]
        order = list(targets)
        for name, lane in sorted(retry, key=lambda r: order.index(r[0])):  # alone, every thread
            try:
                run_one(lane, lanes[lane], name, retried=True)
            except Exception as exc:
                if (error := _failure(on_error, name, exc)) is not None:
                    raise PassError(name, error) from error
    finally:
        for cur in lanes[1:]:
            cur.close()
    return done


def _failure(
    on_error: Callable[[str, Exception], bool] | None, name: str, exc: Exception
) -> Exception | None:
    """The error that stops the pass for metric ``name``'s failure ``exc``: None where ``on_error``
    keeps it (returns True) and the pass goes on; else ``exc``, or the error ``on_error`` itself
    raised (in a lane's thread it would otherwise end that lane unseen)."""
    if on_error is None:
        return exc
    try:
        return None if on_error(name, exc) else exc
    except Exception as raised:
        return raised


@contextlib.contextmanager
def _lane_settings(con: duckdb.DuckDBPyConnection, jobs: int) -> Iterator[None]:
    """The process-wide settings while ``jobs`` lanes run (module docstring): one BLAS thread
    (threadpoolctl, entered here in the caller's thread) and DuckDB's threads shared out between
    the lanes (``lane_threads``); both are the caller's again on exit, however the lanes ended. One
    lane (the sequential pass) changes nothing."""
    if jobs == 1:
        yield
        return
    from threadpoolctl import threadpool_limits  # only lanes need it: not at import time

    before = int(con.execute("SELECT current_setting('threads')").fetchone()[0])
    with threadpool_limits(limits=1, user_api="blas"):
        con.execute(f"SET threads = {lane_threads(before, jobs)}")
        try:
            yield
        finally:
            # a database a lane's error invalidated refuses every statement: that error, already on
            # its way to the caller, says more than this one would
            with contextlib.suppress(duckdb.Error):
                con.execute(f"SET threads = {before}")


def lane_threads(threads: int, jobs: int) -> int:
    """DuckDB's threads while ``jobs`` lanes run on a database set to ``threads``: its cores shared
    out between the lanes, at least one each (module docstring)."""
    return max(1, threads // jobs)
