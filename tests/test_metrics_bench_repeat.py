"""benchmarks/metrics_bench.py --repeat: both paths run again over the same store, in alternating
order, and each run's ratio and checks are on record (the spread, not one draw, says whether a
ratio goal holds on a shared machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _bench_module():
    """metrics_bench.py as a module (it imports its sibling procstats.py by name)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("metrics_bench_under_test", BENCH / "metrics_bench.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the benchmark reads /proc (Linux)")
def test_repeat_runs_both_paths_again_in_alternating_order(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [
        sys.executable,
        str(BENCH / "metrics_bench.py"),
        "--rows",
        "3000",
        "--repeat",
        "2",
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    runs = got["repeats"]
    assert [r["run"] for r in runs] == [1, 2]
    assert [r["order"] for r in runs] == [["duckdb", "reference"], ["reference", "duckdb"]]
    for r in runs:
        assert r["mismatches"] == 0 and r["uncompared"] == [] and r["errors"] == []
        assert r["ratio"] == pytest.approx(r["reference_s"] / r["duckdb_s"])
        assert len(r["loadavg_before"]) == 3 and r["duckdb_peak_rss_mib"] > 0
        for path in ("duckdb", "reference"):  # recorded for both children (None only without /proc)
            assert r[f"{path}_steal_s"] >= 0 and r[f"{path}_others_s"] >= 0
    # run 1 is the run the per-metric table and the top-level fields describe
    assert runs[0]["ratio"] == got["ratio"] and runs[0]["duckdb_s"] == got["total_duckdb_s"]
    median = statistics.median(r["ratio"] for r in runs)
    assert f"ratio over 2 runs: median {median:.2f}x" in res.stdout
    assert "steal s" in res.stdout and "meanwhile steal" in res.stdout
    assert got["targets"]["ratio_ge_20_every_run"] == all(r["ratio"] >= 20 for r in runs)


def test_a_repeat_with_a_mismatch_or_an_uncompared_metric_fails(capsys) -> None:
    bench = _bench_module()
    ok = {
        "run": 1,
        "order": ["duckdb", "reference"],
        "loadavg_before": [1.0, 1.0, 1.0],
        "duckdb_s": 2.0,
        "reference_s": 50.0,
        "ratio": 25.0,
        "duckdb_peak_rss_mib": 300.0,
        "mismatches": 0,
        "uncompared": [],
        "errors": [],
    }
    assert bench._print_repeats([ok, {**ok, "run": 2}], 400.0) is False
    assert bench._print_repeats([ok, {**ok, "run": 2, "mismatches": 3}], 400.0) is True
    assert bench._print_repeats([ok, {**ok, "run": 2, "uncompared": ["aurc"]}], 400.0) is True
    assert bench._print_repeats([ok, {**ok, "run": 2, "errors": ["aurc"]}], 400.0) is True
    # a metric run again alone after running out of memory beside another lane: said, not a failure
    assert bench._print_repeats([ok, {**ok, "run": 2, "retried": ["conformal_aps"]}], 400.0) is False
    shown = capsys.readouterr().out
    assert "NOT COMPARED: aurc" in shown and "FAILED: aurc" in shown
    assert "RUN AGAIN ALONE (out of memory): conformal_aps" in shown
    assert "2 of 2 at >= 20x" in shown
    # what the rest of the machine did while a run's DuckDB child ran: its own two columns
    bench._print_repeats([{**ok, "duckdb_steal_s": 3.25, "duckdb_others_s": 0.5}], 400.0)
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, text in enumerate(lines) if text.rstrip().endswith("steal s  others s"))
    assert lines[header + 1].split()[-2:] == ["3.25", "0.50"]
    # a record of a run whose comparison is missing a metric: uncompared, not silently 0
    rec = bench._run_record(
        3,
        ["reference", "duckdb"],
        (1.0, 1.0, 1.0),
        {
            k: {"total_s": 1.0, "cpu_s": 1.0, "peak_rss_mib": 1.0, "errors": {}, "retried": ["auroc"]}
            for k in ("duckdb", "reference")
        },
        {"auroc": {"mismatches": 0}, "aurc": {"mismatches": None}},
        ["auroc", "aurc", "brier"],
    )
    assert rec["mismatches"] == 0 and rec["uncompared"] == ["aurc", "brier"]
    assert rec["retried"] == ["auroc"]


def test_conformal_repeats_reach_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--conformal-repeats R runs the conformal metrics of BOTH paths with R random splits: were it
    to reach only one, their outputs would still agree with each other on everything but the
    ``repeats`` column, so the column itself is what this reads back."""
    import pandas as pd

    bench = _bench_module()
    monkeypatch.syspath_prepend(str(BENCH))
    ref = importlib.import_module("metrics_reference")  # benchmarks/metrics_reference.py, as the bench does

    monkeypatch.setattr(ref, "REPEATS", ref.REPEATS)  # child_reference sets it; restored after
    store = tmp_path / "store.duckdb"
    bench.build_store(store, 3000, 2, 1, 0, "plain")
    bench.write_facts(store)
    names = "conformal_lac,conformal_sampling"
    for path in ("duckdb", "reference"):
        (tmp_path / path).mkdir()
    bench.child_duckdb(store, tmp_path / "duckdb", None, names, 1, conformal_repeats=3)
    bench.child_reference(store, tmp_path / "reference", names, conformal_repeats=3)
    for path in ("duckdb", "reference"):
        for name in names.split(","):
            got = pd.read_parquet(tmp_path / path / f"{name}.parquet")
            assert len(got) > 0 and set(got["repeats"]) == {3}, (path, name)
    compared = bench._compare_all(tmp_path / "duckdb", tmp_path / "reference", names)
    assert [compared[n]["mismatches"] for n in names.split(",")] == [0, 0]


def test_the_reference_splits_as_often_as_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --conformal-repeats both paths run the package's default number of splits: the
    reference's REPEATS is that default, 100, the count issue 13 names (a change of one without the
    other would time different work, and every conformal metric would mismatch)."""
    from equipoise.evaluators.metrics.conformal import COMMON_PARAMS

    monkeypatch.syspath_prepend(str(BENCH))
    ref = importlib.import_module("metrics_reference")
    assert ref.REPEATS == COMMON_PARAMS["repeats"] == 100


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat (Linux)")
def test_machine_busy_time_counts_another_process() -> None:
    """procstats.machine_cpu_s (through metrics_bench, which imports it): a child that spins on one
    core for a while shows in the machine's busy time by at least (nearly) its own CPU time, as the
    kernel counts it for the child (RUSAGE_CHILDREN); and busy, idle and steal together never
    exceed the cores' elapsed time, so none of them counts another's ticks (idle summed into busy
    would double the total)."""
    import resource
    import time

    bench = _bench_module()  # procstats' functions, as metrics_bench imports them
    t0 = time.monotonic()
    before, c0 = bench.machine_cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    subprocess.run([sys.executable, "-c", spin], check=True, timeout=60)
    reading = bench.machine_cpu_s()
    elapsed = time.monotonic() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    delta = bench.machine_delta(before, reading, child)
    assert child >= 0.6
    # ticks are 1/100 s on each core: a few of them of slack
    assert delta is not None and delta["busy"] >= child - 0.05
    cores = os.cpu_count() or 1
    assert delta["busy"] + delta["idle"] + delta["steal"] <= elapsed * cores + 0.05 * cores
    assert bench.machine_delta(None, before, 0.0) is None
    # others: the busy time less the timed work's own CPU, never below 0
    assert delta["others"] == pytest.approx(max(0.0, delta["busy"] - child))
    assert bench.machine_delta(before, reading, delta["busy"] + 5.0)["others"] == 0.0
