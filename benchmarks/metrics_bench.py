"""Every registered metric over a synthetic store: the DuckDB path vs a plain pandas / scikit-learn
reference computing the same numbers, in one run, each path in its own process.

    python benchmarks/metrics_bench.py --rows 1000000

1. Builds a synthetic store of about ``--rows`` predictions (not timed; ``--store`` keeps or reuses
   one). Layout ``mixed`` (default) joins four blocks so that every metric has data, each built with
   ``equipoise.evaluators.synthetic.make_store`` and then relabelled in SQL:

   - ``mcq``        (40% of rows) suite 'synthetic', variants k3_gold / k3_na: the plain synthetic store;
   - ``robustness`` (20%) variants 'original' / 'plus_nota' sharing base_id (flips, McNemar, bootstrap);
   - ``clear``      (25%) suite 'clear', variants k3_gold, k3_na, k3_idk, k3_ina, k3_na_idk, k3_na_ina
     with their abstain framings (humility deficit, IDK shift, chance baseline);
   - ``clindet``    (15%) determinability items (3 options, conditions complete /
     incomplete_determinable / incomplete_undeterminable) plus a self-evaluation run per decision
     run with 'Correct' / 'Incorrect' / unparsed verdicts on sample 0.

   ``--models`` models (default 3) x variants x ``--samples`` samples (default 2); every decision
   output gets reasoning-like text (hedges, 'wait', '?', stated confidence) so the text features
   and elicited confidence have something to parse. Layout ``plain`` is the unmodified
   ``make_store`` store (suite 'synthetic', MCQ only): most of the CLEAR, ClinDet and robustness
   metrics are then empty, and the table says so.
2. DuckDB path, in a child process: exactly what ``equipoise metrics --out DIR --jobs N`` does:
   open the store read-only, ``registry.prepare(con, materialize=True)``, then
   ``pass_runner.run_pass``, which writes ``DIR/<name>.parquet`` for every registered metric
   (default grouping and parameters) in ``--jobs`` lanes (default 2; 1: one metric at a time).
3. Reference path, in another child process: ``benchmarks/metrics_reference.py``: read the raw
   tables into pandas (timed), join and aggregate with pandas / numpy, scikit-learn, scipy and
   statsmodels (see its docstring for what it shares: nothing but the definitions and the
   documented random streams of the resampling metrics).
4. Compares the two outputs cell by cell (numbers to 1e-6 absolute plus 1e-9 relative, NaN = NaN),
   prints per-metric times, rows and mismatches, both totals, the ratio, peak RSS (VmHWM) of each
   process and the store size, and writes JSON (default ``benchmarks/results/metrics_<rows>.json``)
   with the machine.

Both paths deliver every metric as a Parquet file, and each metric's time and the peak RSS include
writing it: the DuckDB path is ``equipoise metrics --out DIR`` (``registry.write_result``: a metric
that is one query is copied by DuckDB straight to the file, and the others' numpy columns are
written by DuckDB too, so no pandas frame is ever built), the reference writes its pandas frame.
``--memory-limit 2GB`` gives the DuckDB path the same cap as ``equipoise metrics --memory-limit``
(DuckDB spills the rest to ``<store>.tmp``): the way to keep its memory below the store's size on a
large store.

Times exclude Python imports (both paths) and store creation. ``--paths duckdb`` runs the DuckDB
path alone (e.g. at 10M rows, where the reference is impractical). Exit status 0 when every compared
cell agrees, 1 on any mismatch or a failed metric.

``--repeat N`` runs both paths N times over the same store (the first run is the one the table
shows; the order of the two paths alternates from run to run, so neither always runs on a machine
the other just warmed or heated) and prints each run's load average before it, totals, ratio and
mismatches, then the median, the range and how many runs reached the goal. Why: one ratio on a
shared 2-core machine moves by a fifth between runs minutes apart (benchmarks/RESULTS.md, issue
13), so whether a goal holds is a question about the spread, which one command should answer. The
load averages (1, 5 and 15 minutes) include this benchmark's own earlier runs (the reference keeps
a core busy for a minute or more), so on an otherwise idle machine they sit near 1: they show
other work only where they rise above that. Each run's line also shows, from /proc/stat, the
host's steal time and the CPU time of every other process while the DuckDB child ran: a run that
is slow for either reason says so, where a load average only says that something was busy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from procstats import children_cpu_s, cpu_s, machine_cpu_s, machine_delta, peak_mib, status_kib

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_RATIO = 20.0
TARGET_SECONDS_10M = 60.0

# (block, configs as (name, gold present), options per item, share of the rows, self-evaluation runs)
BLOCKS: dict[str, tuple[tuple[tuple[str, bool], ...], int, float, bool]] = {
    "mcq": ((("k3_gold", True), ("k3_na", False)), 4, 0.40, False),
    "robustness": ((("original", True), ("plus_nota", False)), 4, 0.20, False),
    "clear": (
        (
            ("k3_gold", True),
            ("k3_na", False),
            ("k3_idk", False),
            ("k3_ina", False),
            ("k3_na_idk", False),
            ("k3_na_ina", False),
        ),
        4,
        0.25,
        False,
    ),
    "clindet": (
        (("complete", True), ("incomplete_determinable", True), ("incomplete_undeterminable", False)),
        3,
        0.15,
        True,
    ),
}


# ---------------------------------------------------------------------------------------------
# store (not timed)
# ---------------------------------------------------------------------------------------------
def _sql_clear(d: str) -> str:
    return f"""
    UPDATE datasets SET suite = 'clear' WHERE dataset_id = '{d}';
    UPDATE items SET suite = 'clear',
        framing = CASE variant WHEN 'k3_na' THEN 'NA' WHEN 'k3_idk' THEN 'IDK' WHEN 'k3_ina' THEN 'INA'
                               WHEN 'k3_na_idk' THEN 'IDK+NA' WHEN 'k3_na_ina' THEN 'INA+NA' END
    WHERE dataset_id = '{d}';
    UPDATE options SET framing = CASE config WHEN 'k3_idk' THEN 'IDK' WHEN 'k3_ina' THEN 'INA' ELSE 'NA' END
    WHERE dataset_id = '{d}' AND role = 'abstain';
    -- the second abstain option of k3_na_idk / k3_na_ina replaces one distractor
    UPDATE options
    SET role = 'abstain', framing = CASE options.config WHEN 'k3_na_idk' THEN 'IDK' ELSE 'INA' END
    FROM items i
    WHERE options.dataset_id = '{d}' AND options.config IN ('k3_na_idk', 'k3_na_ina')
      AND i.dataset_id = options.dataset_id AND i.config = options.config AND i.item_id = options.item_id
      AND options.label = CASE WHEN i.target_label = 'A' THEN 'B' ELSE 'A' END;
    """


def _sql_clindet(d: str) -> str:
    return f"""
    UPDATE datasets SET suite = 'clindet' WHERE dataset_id = '{d}';
    UPDATE items SET task = 'determinability', suite = 'clindet', condition = config, k = NULL,
        framing = NULL, system_id = 'sys' || (hash(base_id) % 6)::VARCHAR,
        criterion_id = 'crit' || (hash(base_id || 'c') % 4)::VARCHAR
    WHERE dataset_id = '{d}';
    -- determinable cases: gold, 'Unable to determine' (abstain) and one wrong decision
    UPDATE options SET role = 'abstain'
    FROM items i
    WHERE options.dataset_id = '{d}' AND options.config <> 'incomplete_undeterminable'
      AND i.dataset_id = options.dataset_id AND i.config = options.config AND i.item_id = options.item_id
      AND options.label = CASE WHEN i.target_label = 'A' THEN 'B' ELSE 'A' END;
    UPDATE options SET framing = 'UTD' WHERE dataset_id = '{d}' AND role = 'abstain';
    -- a self-evaluation run per decision run: a verdict on every sample-0 decision
    INSERT INTO runs
    SELECT 'se-' || run_id, model, backend, 'self_eval:' || prompt_style, 'self-eval', prompt_sha256,
           decoding_json, dataset_id, config, package_version, run_id
    FROM runs WHERE dataset_id = '{d}';
    INSERT INTO predictions (run_id, item_id, sample_index, raw_output, parsed_label, parse_method,
                             outcome, n_output_tokens)
    SELECT 'se-' || run_id, item_id, sample_index, 'Verdict: ' || coalesce(v, 'not sure'), v,
           CASE WHEN v IS NULL THEN 'unparsed' ELSE 'answer_line' END,
           CASE WHEN v IS NULL THEN 'unparsed' ELSE 'answered' END, 4
    FROM (
        SELECT p.run_id, p.item_id, p.sample_index,
               CASE WHEN hash(p.run_id || p.item_id || 'v') % 25 = 0 THEN NULL
                    WHEN coalesce(p.parsed_label = i.target_label, false)
                         = (hash(p.run_id || p.item_id || 'w') % 100 < 75) THEN 'Correct'
                    ELSE 'Incorrect' END AS v
        FROM predictions p
        JOIN runs r USING (run_id)
        JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
        WHERE r.dataset_id = '{d}' AND p.sample_index = 0
    );
    """


_SQL_ABSTAINED = """
UPDATE predictions SET outcome = 'abstained'
FROM runs r, options o
WHERE predictions.run_id = r.run_id AND o.dataset_id = r.dataset_id AND o.config = r.config
  AND o.item_id = predictions.item_id AND o.label = predictions.parsed_label AND o.role = 'abstain'
  AND predictions.outcome = 'answered';
"""

# reasoning-like text around every decision output: hedges, 'wait', questions, stated confidence
_SQL_TEXT = """
UPDATE predictions SET raw_output =
    CASE hash(run_id || item_id || sample_index::VARCHAR) % 5
        WHEN 0 THEN 'Wait, is this the classic presentation? '
        WHEN 1 THEN 'The findings seem consistent, but I am not sure about the rest. '
        WHEN 2 THEN 'Let me think step by step. The most likely answer follows. '
        WHEN 3 THEN 'Hmm?? Maybe. '
        ELSE '' END
    || raw_output
    || CASE hash(item_id || run_id || sample_index::VARCHAR) % 4
        WHEN 0 THEN ' Confidence: ' || (hash(item_id || sample_index::VARCHAR) % 101)::VARCHAR || '%'
        WHEN 1 THEN ' My confidence is 0.' || (hash(run_id || item_id) % 10)::VARCHAR
        ELSE '' END
WHERE NOT starts_with(run_id, 'se-');
"""


def build_store(path: Path, rows: int, models: int, samples: int, seed: int, layout: str) -> dict[str, Any]:
    """Write the benchmark store at ``path``; returns its composition."""
    from equipoise.evaluators.store import connect
    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    names = tuple(f"model-{chr(97 + i)}" for i in range(models))
    blocks = {"mcq": (*BLOCKS["mcq"][:2], 1.0, False)} if layout == "plain" else BLOCKS
    info: dict[str, Any] = {"layout": layout, "models": list(names), "samples": samples, "blocks": {}}
    for bi, (block, (configs, n_options, share, self_eval)) in enumerate(blocks.items()):
        per_item = len(configs) * models * samples + (len(configs) * models if self_eval else 0)
        n_items = max(4, round(share * rows / per_item))
        con = connect(path)
        before = {r[0] for r in con.execute("SELECT DISTINCT dataset_id FROM datasets").fetchall()}
        con.close()
        spec = SyntheticSpec(
            n_items=n_items,
            models=names,
            configs=configs,
            samples=samples,
            n_options=n_options,
            seed=seed * 100 + bi,
        )
        make_store(path, spec)
        con = connect(path)
        (did,) = {r[0] for r in con.execute("SELECT DISTINCT dataset_id FROM datasets").fetchall()} - before
        if layout == "mixed" and block == "clear":
            con.execute(_sql_clear(did))
        if layout == "mixed" and block == "clindet":
            con.execute(_sql_clindet(did))
        con.close()
        info["blocks"][block] = {
            "configs": [c for c, _ in configs],
            "n_items": n_items,
            "n_options": n_options,
        }
    con = connect(path)
    if layout == "mixed":
        con.execute(_SQL_ABSTAINED)
        con.execute(_SQL_TEXT)
    con.execute("CHECKPOINT")
    for t in ("runs", "items", "options", "predictions", "option_scores"):
        info[f"{t}_rows"] = con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
    info["self_eval_predictions"] = con.execute(
        "SELECT count(*) FROM predictions p JOIN runs r USING (run_id) "
        "WHERE starts_with(r.prompt_style, 'self_eval:')"
    ).fetchall()[0][0]
    con.close()
    info["file_bytes"] = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return info


def write_facts(path: Path, memory_limit: str | None = None) -> dict[str, float]:
    """Bring the store's fact tables up to date, as a writer (``equipoise import`` / ``run``) does
    after writing; returns the refresh time and the time of one fingerprint (a full scan)."""
    from equipoise.evaluators.metrics import facts
    from equipoise.evaluators.store import connect

    con = connect(path, memory_limit=memory_limit)
    try:
        t0 = time.perf_counter()
        facts.refresh(con)
        con.execute("CHECKPOINT")
        refresh_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        facts.fingerprint(con)
        scan_s = time.perf_counter() - t0
    finally:
        con.close()
    return {"facts_refresh_s": refresh_s, "full_scan_s": scan_s}


# ---------------------------------------------------------------------------------------------
# child processes (timed)
# ---------------------------------------------------------------------------------------------
class _Results:
    """Per-step times and the high-water mark of RSS after each step (the peak includes writing each
    result file: both paths deliver every metric as a Parquet file, and that is part of the job)."""

    def __init__(self, outdir: Path) -> None:
        self.outdir, self.hwm = outdir, {}
        self.times: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        # metrics the pass ran again alone after an out-of-memory error beside another lane
        # (pass_runner.MetricDone.retried): their first attempt is in the total, not in their time
        self.retried: list[str] = []

    def step(self, name: str, seconds: float, retried: bool = False) -> None:
        self.times[name] = seconds
        self.hwm[name] = peak_mib()
        if retried:
            self.retried.append(name)

    def save(self, extra: dict) -> None:
        info = {
            "times": self.times,
            "errors": self.errors,
            "retried": self.retried,
            "peak_rss_mib": peak_mib(),
            **extra,
        }
        info["peak_rss_after_mib"] = self.hwm
        (self.outdir / "timings.json").write_text(json.dumps(info, indent=2))


def _selected(names: list[str], only: str | None, strict: bool = True) -> list[str]:
    """The metrics to time: all, or the comma-separated ``--metrics`` subset (unknown names refused
    when ``strict``; the reference may lack a registered metric, which the report then flags)."""
    if not only:
        return names
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown and strict:
        raise SystemExit(f"--metrics: unknown metric(s) {', '.join(unknown)}; known: {', '.join(names)}")
    return [n for n in names if n in wanted]


def child_duckdb(
    store: Path,
    outdir: Path,
    memory_limit: str | None,
    only: str | None,
    jobs: int,
    conformal_repeats: int | None = None,
) -> None:
    """`equipoise metrics --out DIR --jobs N` with no other options (but ``--param repeats=R`` when
    ``conformal_repeats`` is given), timed per metric (compute + write). With ``jobs`` > 1 the metrics
    run in lanes (``pass_runner.run_pass``): each metric's time is its own wall time in its lane, so
    they add up to more than the total."""
    from equipoise.evaluators.metrics.pass_runner import run_pass
    from equipoise.evaluators.metrics.registry import REGISTRY, metric_names, prepare
    from equipoise.evaluators.store import connect

    names = metric_names()  # imports every metric module before the clock starts
    # nothing else is imported: the metrics need neither scipy nor scikit-learn (their tests and fits
    # are computed by the package itself since stop 27) nor pandas and pyarrow (numpy columns written
    # by DuckDB since stop 32), and importing them here would add their ~80 and ~70 MiB to this
    # process's peak RSS, which is measured against the store's size

    base_mib = (status_kib("VmRSS") or 0) / 1024
    res = _Results(outdir)
    t_all, cpu0 = time.perf_counter(), cpu_s()
    t0 = time.perf_counter()
    con = connect(store, read_only=True, memory_limit=memory_limit)
    prepare(con, materialize=True)
    # after prepare: over current facts it caps memory_limit for the pass (registry.cap_pass_memory)
    threads, mem_limit = con.execute(
        "SELECT current_setting('threads'), current_setting('memory_limit')"
    ).fetchall()[0]
    res.step("(open + prepare)", time.perf_counter() - t0)
    targets = {name: outdir / f"{name}.parquet" for name in _selected(names, only)}
    params = {
        name: {"repeats": conformal_repeats}
        for name in targets
        if conformal_repeats is not None and "repeats" in REGISTRY[name].params
    }

    def failed(name: str, exc: Exception) -> bool:
        """A failing metric is reported, not fatal to the benchmark: the rest run on."""
        res.errors[name] = "".join(traceback.format_exception(exc, limit=3))
        return True

    run_pass(
        con,
        targets,
        params=params,
        jobs=jobs,
        on_done=lambda d: res.step(d.name, d.seconds, d.retried),
        on_error=failed,
    )
    con.close()
    total, cpu = time.perf_counter() - t_all, cpu_s() - cpu0
    res.save(
        {
            "total_s": total,
            "cpu_s": cpu,
            "baseline_rss_mib": base_mib,
            "threads": threads,
            "memory_limit": mem_limit,
            "jobs": jobs,
        }
    )


def child_reference(
    store: Path, outdir: Path, only: str | None = None, conformal_repeats: int | None = None
) -> None:
    """The reference, timed per metric (compute in pandas / scikit-learn + write the frame), with
    ``conformal_repeats`` random splits in its conformal metrics where given."""
    sys.path.insert(0, str(HERE))
    import metrics_reference as ref

    if conformal_repeats is not None:
        ref.REPEATS = conformal_repeats

    base_mib = (status_kib("VmRSS") or 0) / 1024
    res = _Results(outdir)
    t_all, cpu0 = time.perf_counter(), cpu_s()
    t0 = time.perf_counter()
    tables = ref.read_tables(store)
    res.step("(read tables)", time.perf_counter() - t0)
    t0 = time.perf_counter()
    data = ref.Data(tables)
    res.step("(joins + softmax)", time.perf_counter() - t0)
    chosen = set(_selected(sorted(ref.REFERENCE), only, strict=False))
    for name, (fn, _) in sorted(ref.REFERENCE.items()):
        if name not in chosen:
            continue
        t0 = time.perf_counter()
        try:
            fn(data).to_parquet(outdir / f"{name}.parquet", index=False)
        except Exception:  # reported, not fatal
            res.errors[name] = traceback.format_exc(limit=4)
        res.step(name, time.perf_counter() - t0)
    total, cpu = time.perf_counter() - t_all, cpu_s() - cpu0
    res.save({"total_s": total, "cpu_s": cpu, "baseline_rss_mib": base_mib})


def run_child(
    kind: str,
    store: Path,
    outdir: Path,
    memory_limit: str | None = None,
    only: str | None = None,
    jobs: int | None = None,
    conformal_repeats: int | None = None,
) -> dict[str, Any]:
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--store",
        str(store),
        "--workdir",
        str(outdir),
        *(["--memory-limit", memory_limit] if memory_limit else []),
        *(["--metrics", only] if only else []),
        *(["--jobs", str(jobs)] if jobs is not None else []),
        *(["--conformal-repeats", str(conformal_repeats)] if conformal_repeats is not None else []),
    ]
    t0, m0, c0 = time.perf_counter(), machine_cpu_s(), children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, m1 = time.perf_counter() - t0, machine_cpu_s()
    # the whole child's CPU time: its imports too, which its own cpu_s leaves out
    machine = machine_delta(m0, m1, children_cpu_s() - c0)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{kind} child failed with status {proc.returncode}")
    info = json.loads((outdir / "timings.json").read_text())
    info["process_wall_s"] = wall
    if machine is not None:
        # while the child ran (its start and imports included): the host's steal, and the CPU time
        # of every other process (the machine's busy time less the whole child's; this parent only
        # waits). Either one, when large, is why a run took longer than its CPU time would say
        info["machine_steal_s"] = machine["steal"]
        info["machine_others_s"] = machine["others"]
    return info


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    import duckdb
    import numpy
    import pandas
    import scipy
    import sklearn

    def first(path: str, key: str) -> str | None:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=HERE
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=HERE
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    mem = first("/proc/meminfo", "MemTotal")
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": first("/proc/cpuinfo", "model name"),
        "cpu_count": os.cpu_count(),
        "mem_total_gib": round(int(mem.split()[0]) / 2**20, 1) if mem else None,
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "pandas": pandas.__version__,
        "numpy": numpy.__version__,
        "scikit_learn": sklearn.__version__,
        "scipy": scipy.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
    }


def _label(rows: int) -> str:
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}m"
    if rows % 1000 == 0:
        return f"{rows // 1000}k"
    return str(rows)


def _compare_all(duck_dir: Path, ref_dir: Path, only: str | None = None) -> dict[str, dict]:
    import pandas as pd

    sys.path.insert(0, str(HERE))
    import metrics_reference as ref

    out = {}
    chosen = set(_selected(sorted(ref.REFERENCE), only, strict=False))
    for name, (_, keys) in sorted(ref.REFERENCE.items()):
        if name not in chosen:
            continue
        d, r = duck_dir / f"{name}.parquet", ref_dir / f"{name}.parquet"
        if not d.exists() and name not in _registered():
            continue  # a reference for a metric this checkout does not register
        if not d.exists() or not r.exists():
            out[name] = {"mismatches": None, "examples": ["no output on one side (the metric failed)"]}
            continue
        out[name] = ref.compare(pd.read_parquet(d), pd.read_parquet(r), keys)
    return out


def _registered() -> list[str]:
    """The registry's metric names, imported here: the reference's child process never loads it."""
    from equipoise.evaluators.metrics.registry import metric_names

    return metric_names()


def _rows_of(duck_dir: Path, name: str) -> tuple[int | None, bool]:
    """(rows, has numbers): a metric 'has data' when some row has a non-null number beyond counts."""
    import pandas as pd

    p = duck_dir / f"{name}.parquet"
    if not p.exists():
        return None, False
    df = pd.read_parquet(p)
    num = df.select_dtypes("number")
    return len(df), bool(len(df) and num.notna().to_numpy().any() and (num.fillna(0).to_numpy() != 0).any())


def _at_least_one(text: str) -> int:
    """argparse type of --jobs (lanes) and --repeat (runs): a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> int:
    from equipoise.evaluators.metrics.pass_runner import DEFAULT_JOBS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="predictions in the store (approximately)")
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--layout", choices=("mixed", "plain"), default="mixed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--paths", choices=("both", "duckdb", "reference"), default="both")
    ap.add_argument("--store", type=Path, help="store file to use (built there if missing, and kept)")
    ap.add_argument("--out", type=Path, help="JSON results (default benchmarks/results/metrics_<rows>.json)")
    ap.add_argument(
        "--memory-limit",
        help="DuckDB memory_limit for the DuckDB path (e.g. 2GB; spills the rest to <store>.tmp), "
        "as `equipoise metrics --memory-limit`; default DuckDB's 80%% of RAM",
    )
    ap.add_argument(
        "--metrics",
        help="comma-separated subset of metrics to time (default: all; TOTAL then covers the subset)",
    )
    ap.add_argument(
        "--jobs",
        type=_at_least_one,
        default=DEFAULT_JOBS,
        help="lanes of the DuckDB path, as `equipoise metrics --jobs` (1: one metric at a time; "
        "default %(default)s); per-metric times are then each metric's own wall time in its lane",
    )
    ap.add_argument(
        "--repeat",
        type=_at_least_one,
        default=1,
        help="runs of both paths over the same store (order alternated; default 1): prints each "
        "run's ratio and the median, range and share of runs at the goal",
    )
    ap.add_argument(
        "--conformal-repeats",
        type=_at_least_one,
        help="random calibration splits of the conformal metrics on both paths (`equipoise metrics "
        "--param repeats=R`; default: the package's default, which the reference's REPEATS matches)",
    )
    ap.add_argument("--child", choices=("duckdb", "reference"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.child == "duckdb":
            child_duckdb(
                args.store, args.workdir, args.memory_limit, args.metrics, args.jobs, args.conformal_repeats
            )
        else:
            child_reference(args.store, args.workdir, args.metrics, args.conformal_repeats)
        return 0

    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="eq-metrics-bench-"))
    store = args.store or tmp / "store.duckdb"
    t0 = time.perf_counter()
    if store.exists():
        from equipoise.evaluators.store import connect

        con = connect(store, read_only=True)
        info = {
            "reused": True,
            "predictions_rows": con.execute("SELECT count(*) FROM predictions").fetchall()[0][0],
        }
        con.close()
        info["file_bytes"] = store.stat().st_size
    else:
        info = build_store(store, args.rows, args.models, args.samples, args.seed, args.layout)
    build_s = time.perf_counter() - t0
    info.update(write_facts(store, args.memory_limit))
    info["file_bytes"] = sum(p.stat().st_size for p in store.parent.glob(store.name + "*"))
    n_pred = info["predictions_rows"]
    store_mib = info["file_bytes"] / 2**20
    print(
        f"store: {n_pred:,} predictions ({store_mib:,.0f} MiB on disk), built in {build_s:.0f} s (not timed)"
    )
    print(
        f"write-time facts (facts.refresh, paid once by the writer, not in the metrics total): "
        f"{info['facts_refresh_s']:.2f} s; floor, one full scan of every source table (count + hash of "
        f"every column, the fingerprint): {info['full_scan_s']:.2f} s"
    )

    kinds = [k for k in ("duckdb", "reference") if args.paths in (k, "both")]

    def run_paths(workdir: Path, order: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
        """Both paths (or the one asked for) in ``order``, their outputs compared."""
        got: dict[str, dict] = {}
        for kind in order:
            print(f"running the {kind} path ...", flush=True)
            got[kind] = run_child(
                kind,
                store,
                workdir / kind,
                args.memory_limit if kind == "duckdb" else None,
                args.metrics,
                args.jobs if kind == "duckdb" else None,
                args.conformal_repeats,
            )
        cmp_ = _compare_all(workdir / "duckdb", workdir / "reference", args.metrics) if len(got) == 2 else {}
        return got, cmp_

    first_load = os.getloadavg()
    runs, compared = run_paths(tmp, kinds)

    sys.path.insert(0, str(HERE))
    import metrics_reference as ref

    names = _selected(_registered(), args.metrics)
    duck, refr = runs.get("duckdb"), runs.get("reference")
    per_metric = []
    hdr = f"{'metric':<30} {'rows':>9} {'duckdb s':>9} {'ref s':>9} {'ratio':>7} {'mismatch':>9}  note"
    print(hdr)
    print("-" * len(hdr))
    for setup_d, setup_r in (("(open + prepare)", "(read tables)"), (None, "(joins + softmax)")):
        ds = duck["times"].get(setup_d) if duck and setup_d else None
        rs = refr["times"].get(setup_r) if refr else None
        label = setup_d if setup_d else setup_r
        if setup_d and refr:
            label = f"{setup_d} / {setup_r}"
        print(f"{label:<30} {'':>9} {_f(ds):>9} {_f(rs):>9}")
    for name in names:
        rows, has = _rows_of(tmp / "duckdb", name) if duck else (None, False)
        ds = duck["times"].get(name) if duck else None
        rs = refr["times"].get(name) if refr else None
        cmp_ = compared.get(name, {})
        mm = cmp_.get("mismatches")
        errs = [k for k in ("duckdb", "reference") if runs.get(k) and name in runs[k]["errors"]]
        note = (
            "FAILED on " + ", ".join(errs)
            if errs
            else ("" if has else "no data in this store (empty / all NULL)")
        )
        if duck and name in duck.get("retried", []):
            note = "; ".join(x for x in (note, "out of memory beside another lane, run again alone") if x)
        if refr and name not in ref.REFERENCE:
            note = "NO REFERENCE (add one to metrics_reference.py)"
            cmp_ = {"mismatches": None, "examples": ["no reference implementation"]}
        ratio = rs / ds if ds and rs else None
        print(
            f"{name:<30} {rows if rows is not None else '-':>9} {_f(ds):>9} {_f(rs):>9} {_f(ratio, 1):>7} "
            f"{mm if mm is not None else '-':>9}  {note}"
        )
        per_metric.append(
            {
                "metric": name,
                "rows": rows,
                "has_data": has,
                "duckdb_s": ds,
                "reference_s": rs,
                "ratio": ratio,
                "comparison": cmp_,
                "errors": {k: runs[k]["errors"][name] for k in errs},
            }
        )
    print("-" * len(hdr))
    total_d = duck["total_s"] if duck else None
    total_r = refr["total_s"] if refr else None
    ratio = total_r / total_d if total_d and total_r else None
    print(
        # two decimals: one would print 19.95x as 20.0 next to a goal of 20
        f"{'TOTAL':<30} {'':>9} {_f(total_d):>9} {_f(total_r):>9} {_f(ratio, 2):>7} "
        f"{sum(m['comparison'].get('mismatches') or 0 for m in per_metric) if compared else '-':>9}"
    )
    for kind, r in runs.items():
        print(
            f"{kind}: wall {r['total_s']:,.1f} s, CPU {r['cpu_s']:,.1f} s (user + system, all threads)"
            + _machine_text(r)
        )
    for kind, r in runs.items():
        print(
            f"peak RSS {kind}: {r['peak_rss_mib']:,.0f} MiB (after imports {r['baseline_rss_mib']:,.0f} MiB)"
            f"; store file {store_mib:,.0f} MiB"
        )
    if duck:
        print(f"DuckDB threads {duck['threads']}, memory_limit {duck['memory_limit']}, jobs {duck['jobs']}")
    for m in per_metric:
        for e in m["comparison"].get("examples", [])[:3]:
            print(f"  {m['metric']}: {e}")
        for k, tb in m["errors"].items():
            print(f"  {m['metric']} failed on {k}: {tb.strip().splitlines()[-1]}")
    slow = sorted((m for m in per_metric if m["duckdb_s"]), key=lambda m: -m["duckdb_s"])[:5]
    if slow:
        print("slowest on DuckDB: " + ", ".join(f"{m['metric']} {m['duckdb_s']:.2f}s" for m in slow))
    empty = [m["metric"] for m in per_metric if duck and not m["has_data"]]
    if empty:
        print(f"no data in this store: {', '.join(empty)}")
    repeats = [_run_record(1, kinds, first_load, runs, compared, names)]
    for i in range(2, args.repeat + 1):
        load = os.getloadavg()
        order = kinds if i % 2 else kinds[::-1]
        got, cmp_ = run_paths(tmp / f"run{i}", order)
        repeats.append(_run_record(i, order, load, got, cmp_, names))
        shutil.rmtree(tmp / f"run{i}", ignore_errors=True)
    # the exit status: any run with a failed metric, a mismatch or a metric left uncompared
    failed = any(_run_failed(r) for r in repeats)
    if args.repeat > 1:
        _print_repeats(repeats, store_mib)
    targets = {
        "ratio_ge_20": None if ratio is None else ratio >= TARGET_RATIO,
        "duckdb_under_60s_at_this_size": None if total_d is None else total_d < TARGET_SECONDS_10M,
        "duckdb_rss_below_store_size": None if not duck else duck["peak_rss_mib"] < store_mib,
    }
    if args.repeat > 1:
        targets["ratio_ge_20_every_run"] = _every(repeats, "ratio", lambda v: v >= TARGET_RATIO)
        targets["duckdb_rss_below_store_size_every_run"] = _every(
            repeats, "duckdb_peak_rss_mib", lambda v: v < store_mib
        )
    print("targets: " + ", ".join(f"{k}={v}" for k, v in targets.items()))
    out = {
        "started": started,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "store": {**info, "build_s": build_s, "file_mib": store_mib},
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("child", "workdir")
        },
        "duckdb": duck,
        "reference": refr,
        "total_duckdb_s": total_d,
        "total_reference_s": total_r,
        "ratio": ratio,
        "targets": targets,
        "metrics": per_metric,
        "repeats": repeats,
    }
    dest = (
        args.out
        or RESULTS / f"metrics_{_label(args.rows)}{'' if args.layout == 'mixed' else '_' + args.layout}.json"
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2, default=_json_default))
    print(f"wrote {dest}")
    shutil.rmtree(tmp, ignore_errors=True)  # child outputs, and the store unless --store named one
    return 1 if failed else 0


def _run_record(
    i: int,
    order: list[str],
    load: tuple[float, float, float],
    runs: dict[str, dict],
    compared: dict[str, dict],
    names: list[str],
) -> dict[str, Any]:
    """One run of ``--repeat``: what its line and the JSON show. ``uncompared``: the metrics of
    ``names`` that have no comparison although both paths ran (a failed metric, no reference)."""
    duck, refr = runs.get("duckdb"), runs.get("reference")
    total_d = duck["total_s"] if duck else None
    total_r = refr["total_s"] if refr else None
    both = len(runs) == 2
    known = [compared[n]["mismatches"] for n in names if compared.get(n, {}).get("mismatches") is not None]
    return {
        "run": i,
        "order": order,
        "loadavg_before": list(load),
        "duckdb_s": total_d,
        "duckdb_cpu_s": duck["cpu_s"] if duck else None,
        "duckdb_peak_rss_mib": duck["peak_rss_mib"] if duck else None,
        "reference_s": total_r,
        "reference_cpu_s": refr["cpu_s"] if refr else None,
        "ratio": total_r / total_d if total_d and total_r else None,
        "mismatches": sum(known) if both else None,
        "uncompared": [n for n in names if compared.get(n, {}).get("mismatches") is None] if both else [],
        "errors": sorted({n for r in runs.values() for n in r["errors"]}),
        "retried": list(duck.get("retried", [])) if duck else [],
        "duckdb_steal_s": duck.get("machine_steal_s") if duck else None,
        "duckdb_others_s": duck.get("machine_others_s") if duck else None,
        "reference_steal_s": refr.get("machine_steal_s") if refr else None,
        "reference_others_s": refr.get("machine_others_s") if refr else None,
    }


def _every(repeats: list[dict], field: str, ok: Callable[[float], bool]) -> bool | None:
    values = [r[field] for r in repeats]
    return None if any(v is None for v in values) else all(ok(v) for v in values)


def _print_repeats(repeats: list[dict], store_mib: float) -> bool:
    """The table of ``--repeat``'s runs and its summary; returns whether any run failed a check."""
    print(f"\n{len(repeats)} runs over this store (run 1 is the one above; the paths' order alternates):")
    hdr = f"{'run':>3}  {'load before':<16} {'first':<9} {'duckdb s':>9} {'ref s':>8} {'ratio':>7} "
    hdr += f"{'mismatch':>9} {'peak RSS':>9} {'steal s':>8} {'others s':>9}"
    print(hdr)
    for r in repeats:
        load = " ".join(f"{x:.2f}" for x in r["loadavg_before"])
        peak = r["duckdb_peak_rss_mib"]
        print(
            f"{r['run']:>3}  {load:<16} {r['order'][0]:<9} {_f(r['duckdb_s']):>9} {_f(r['reference_s']):>8} "
            f"{_f(r['ratio'], 2):>7} {r['mismatches'] if r['mismatches'] is not None else '-':>9} "
            f"{'-' if peak is None else f'{peak:,.0f} MiB':>9} {_f(r.get('duckdb_steal_s')):>8} "
            f"{_f(r.get('duckdb_others_s')):>9}"
            + (f"  FAILED: {', '.join(r['errors'])}" if r["errors"] else "")
            + (f"  RUN AGAIN ALONE (out of memory): {', '.join(r['retried'])}" if r.get("retried") else "")
            + (f"  NOT COMPARED: {', '.join(r['uncompared'])}" if r["uncompared"] else "")
        )
    ratios = sorted(r["ratio"] for r in repeats if r["ratio"] is not None)
    if ratios:
        reached = sum(v >= TARGET_RATIO for v in ratios)
        print(
            f"ratio over {len(ratios)} runs: median {statistics.median(ratios):.2f}x, "
            f"range {ratios[0]:.2f}x-{ratios[-1]:.2f}x; {reached} of {len(ratios)} at >= {TARGET_RATIO:g}x"
        )
    walls = sorted(r["duckdb_s"] for r in repeats if r["duckdb_s"] is not None)
    if walls:
        over = sum(
            r["duckdb_peak_rss_mib"] >= store_mib for r in repeats if r["duckdb_peak_rss_mib"] is not None
        )
        print(
            f"duckdb: median {statistics.median(walls):.2f} s, range {walls[0]:.2f}-{walls[-1]:.2f} s; "
            f"peak RSS at or above the store file ({store_mib:,.0f} MiB) in {over} of {len(walls)} runs"
        )
    return any(_run_failed(r) for r in repeats)


def _machine_text(r: dict[str, Any]) -> str:
    """What the rest of the machine did during a child's run (``run_child``), for its summary line."""
    if r.get("machine_steal_s") is None:
        return ""
    return (
        f"; meanwhile steal {r['machine_steal_s']:,.1f} s, other processes {r['machine_others_s']:,.1f} s "
        f"(CPU s, all cores, child start included)"
    )


def _run_failed(r: dict[str, Any]) -> bool:
    """Whether a run (``_run_record``) failed a check: a metric failed on either path, a cell
    mismatched, or a metric has no comparison although both paths ran (no reference, no output)."""
    return bool(r["errors"] or r["uncompared"] or (r["mismatches"] or 0) > 0)


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def _json_default(v: object) -> object:
    try:
        return v.item()  # type: ignore[attr-defined]
    except AttributeError:
        return str(v)


if __name__ == "__main__":
    sys.exit(main())
