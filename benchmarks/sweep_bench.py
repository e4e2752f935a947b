"""Predictions per second of a sweep on the reference backend: one plain process vs Ray with 1 and 2
workers, measured in one run so the overhead ratio is against the same machine under the same load.

    python benchmarks/sweep_bench.py --items 2000 --configs 3 --policies 4

1. builds the NOTA suite from the bundled mini-source with ``--items`` source questions (fresh ids,
   as ``build_bench.py`` does) and plans ``--policies`` reference policies x ``--configs`` configs
   x prompt styles base and cot (not timed);
2. *single*: ``executor.execute_planned`` into a fresh store, one process (the plain
   ``equipoise eval PLAN.yaml`` path without the progress display);
3. *ray-1* / *ray-2*: ``ray_exec.run_sweep_ray`` with 1 and 2 shards into fresh stores and part
   folders, on ``ray.init(num_cpus=2)`` started before the clock (cluster start-up is not timed;
   task scheduling, the workers' imports, Parquet parts and the driver's ingest are);
4. checks the three stores hold identical prediction rows (exit 1 otherwise).

Each mode runs ``--repeat`` times; the best time is reported (the least disturbed by other jobs on a
shared machine), with the 1-minute load average before and after. The overhead is the single-process
rate divided by the Ray rate: > 1 means Ray is slower. Prints a table and writes
benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from equipoise.evaluators.backends.base import Decoding  # noqa: E402
from equipoise.evaluators.executor import execute_planned  # noqa: E402
from equipoise.evaluators.planner import RunSpec, plan_status  # noqa: E402
from equipoise.evaluators.store import connect  # noqa: E402

POLICIES = ["chance", "oracle", "always_answer", "always_abstain", "calibrated"]
PRED_SQL = "SELECT * EXCLUDE (latency_ms) FROM predictions ORDER BY run_id, item_id, sample_index"


def build(folder: Path, items: int) -> list[str]:
    """The NOTA suite over ``items`` source questions (``build_bench``'s synthetic source: the
    bundled questions under fresh ids); returns its config names."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from build_bench import synthetic_source

    from equipoise.builders.dataset_writer import ConfigData, DatasetSpec, write_dataset
    from equipoise.builders.mcq_build import TRANSFORM_VERSION
    from equipoise.builders.suites import MCQ_SUITES, SuiteOptions
    from equipoise.schemas.items import MCQItem

    result = MCQ_SUITES["nota"](synthetic_source(items), SuiteOptions(seed=0))
    spec = DatasetSpec(
        pretty_name="sweep bench nota",
        license="cc-by-4.0",
        configs=[
            ConfigData(name, MCQItem, rows, "", default=i == 0)
            for i, (name, rows) in enumerate(result.configs.items())
        ],
        manifest_extra={"suite": "nota", "seed": 0, "builder_version": TRANSFORM_VERSION},
        card_body="Benchmark build of nota for the sweep benchmark.",
        tags=["benchmark"],
    )
    write_dataset(folder, spec)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return sorted(manifest["configs"])


def specs_for(folder: Path, configs: list[str], policies: list[str]) -> list[RunSpec]:
    return [
        RunSpec(
            dataset=str(folder),
            folder=str(folder),
            config=c,
            backend="reference",
            model=p,
            style=s,
            decoding=Decoding(),
            commit_every=256,
        )
        for c in configs
        for p in policies
        for s in ("base", "cot")
    ]


def single(specs: list[RunSpec], store: Path) -> float:
    con = connect(store)
    t0 = time.perf_counter()
    execute_planned(plan_status(specs, con), con)
    dt = time.perf_counter() - t0
    con.close()
    return dt


def with_ray(specs: list[RunSpec], store: Path, parts: Path, workers: int) -> float:
    from equipoise.evaluators.ray_exec import run_sweep_ray

    con = connect(store)
    t0 = time.perf_counter()
    run_sweep_ray(plan_status(specs, con), con, parts, workers=workers, progress=False)
    dt = time.perf_counter() - t0
    con.close()
    return dt


def rows(store: Path) -> list[tuple]:
    con = connect(store, read_only=True)
    try:
        return con.execute(PRED_SQL).fetchall()
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--configs", type=int, default=3)
    ap.add_argument("--policies", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import ray

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        configs = build(work / "nota", args.items)[: args.configs]
        specs = specs_for(work / "nota", configs, POLICIES[: args.policies])
        con = connect(work / "count.duckdb")
        n = sum(p.total for p in plan_status(specs, con))
        con.close()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        times: dict[str, list[float]] = {"single": [], "ray-1": [], "ray-2": []}
        for r in range(args.repeat):
            times["single"].append(single(specs, work / f"single{r}.duckdb"))
            for w in (1, 2):
                times[f"ray-{w}"].append(
                    with_ray(specs, work / f"ray{w}-{r}.duckdb", work / f"parts{w}-{r}", w)
                )
        ray.shutdown()
        ref = rows(work / "single0.duckdb")
        same = all(rows(work / f"ray{w}-0.duckdb") == ref for w in (1, 2))
    load_after = os.getloadavg()[0]
    best = {k: min(v) for k, v in times.items()}
    rate = {k: n / v for k, v in best.items()}
    print(
        f"{len(specs)} runs, {n:,} predictions; load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print("| mode | best s | predictions/s | overhead vs single |")
    print("| --- | --- | --- | --- |")
    for k in ("single", "ray-1", "ray-2"):
        print(f"| {k} | {best[k]:.2f} | {rate[k]:,.0f} | {rate['single'] / rate[k]:.2f}x |")
    print(f"speed-up ray-2 / ray-1: {rate['ray-2'] / rate['ray-1']:.2f}x; identical rows: {same}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "runs": len(specs),
                "predictions": n,
                "times_s": times,
                "predictions_per_s": rate,
                "identical_rows": same,
                "load_before": load_before,
                "load_after": load_after,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
