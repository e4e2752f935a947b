"""A metrics pass in lanes (pass_runner.run_pass, `equipoise metrics --out --jobs`) writes the same
files as one metric at a time, keeps the pass's memory cap, and reports a failing metric by name."""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import pytest
from threadpoolctl import threadpool_info
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators.metrics import facts, pass_runner, registry
from equipoise.evaluators.metrics.pass_runner import PassError, cache_group, run_pass, schedule
from equipoise.evaluators.metrics.registry import metric_names, prepare, write_result
from equipoise.evaluators.store import connect, memory_bytes
from equipoise.evaluators.synthetic import SyntheticSpec, make_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with current facts (lanes need them) and robustness / abstain rows beside the MCQ ones."""
    path = tmp_path_factory.mktemp("lanes") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=60, models=("m1", "m2"), samples=3, unparsed_rate=0.1, seed=11))
    con = connect(path)
    facts.refresh(con)
    con.close()
    return path


@pytest.fixture(scope="module")
def sequential(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of the pass as it was before lanes: one connection, every metric in name order."""
    out = tmp_path_factory.mktemp("sequential")
    con = connect(store, read_only=True)
    try:
        prepare(con, materialize=True)
        for name in metric_names():
            write_result(con, name, out / f"{name}.parquet")
    finally:
        con.close()
    return out


def _lanes(store: Path, out: Path, jobs: int) -> list[pass_runner.MetricDone]:
    out.mkdir()
    con = connect(store, read_only=True)
    try:
        return run_pass(con, {n: out / f"{n}.parquet" for n in metric_names()}, jobs=jobs)
    finally:
        con.close()


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_a_pass_in_lanes_writes_the_same_bytes_as_one_metric_at_a_time(
    store: Path, sequential: Path, tmp_path: Path, jobs: int
) -> None:
    done = _lanes(store, tmp_path / "lanes", jobs)
    assert sorted(d.name for d in done) == metric_names()  # each metric once
    lanes_used = {d.lane for d in done}
    assert lanes_used <= set(range(jobs)) and 0 in lanes_used and (jobs == 1 or len(lanes_used) > 1)
    seq, lanes = sequential, tmp_path / "lanes"
    differ = [
        n
        for n in metric_names()
        if (seq / f"{n}.parquet").read_bytes() != (lanes / f"{n}.parquet").read_bytes()
    ]
    assert differ == []
    assert all(d.seconds > 0 for d in done)


def test_metrics_that_share_caches_run_in_one_lane_and_the_heavy_groups_in_lane_0(store: Path) -> None:
    heavy, light = schedule(metric_names())
    groups = heavy + light
    assert sorted(itertools.chain.from_iterable(groups)) == metric_names()
    for group in groups:
        assert len({cache_group(n) for n in group}) == 1
    # metrics sharing TEMP caches: the conformal mask, aurc / prr, ece / reliability, the unc bounds
    for together in (
        ("conformal_aps", "conformal_lac", "conformal_coverage_by", "conformal_sampling"),
        ("aurc", "prr"),
        ("ece", "reliability"),
        ("unc_normalization_bounds", "unc_normalized"),
    ):
        assert any(set(together) <= set(g) for g in groups), together
    # the bounds' cache is built by unc_normalization_bounds and read by unc_normalized: in that order
    bounds = next(g for g in groups if "unc_normalized" in g)
    assert bounds.index("unc_normalization_bounds") < bounds.index("unc_normalized")
    # the other uncertainty metrics read the write-time fact alone: groups of their own
    for name in ("unc_scores", "unc_auroc", "unc_combiners", "unc_summary"):
        assert [name] in light, name
    assert [cache_group(g[0]) for g in heavy] == list(pass_runner.HEAVY_GROUPS)
    done = _lanes(store, Path(str(store) + ".out"), 2)
    assert {d.lane for d in done if cache_group(d.name) in pass_runner.HEAVY_GROUPS} == {0}
    lane = {d.name: d.lane for d in done}
    for together in (("aurc", "prr"), ("ece", "reliability")):
        assert len({lane[n] for n in together}) == 1, together
    # every weighed or heavy group is one that exists (a misspelt name would silently weigh 0)
    named = set(pass_runner.GROUP_WEIGHTS) | set(pass_runner.HEAVY_GROUPS)
    assert named <= {cache_group(n) for n in metric_names()}


def test_lanes_keep_the_pass_memory_cap_of_the_first_connection(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is the database's: a lane must not cap it again (here a later look at the process's
    memory would find more and lower it)."""
    monkeypatch.setattr(registry, "PASS_MEMORY_FLOOR", 2**20)
    monkeypatch.setattr(registry, "PASS_BASELINE_MIN", 0)
    monkeypatch.setattr(registry, "PASS_OUTSIDE_FIXED", 0)  # the test store is a few MB
    monkeypatch.setattr(registry, "PASS_PEAK_SHARE", 20)  # room for every metric of this small store
    size = store.stat().st_size
    seen = itertools.count()
    monkeypatch.setattr(registry, "own_memory", lambda con: size // 10 * (1 + next(seen)))
    con = connect(store, read_only=True)
    try:
        prepare(con, materialize=True)
        q = "SELECT current_setting('memory_limit')"
        capped = con.execute(q).fetchall()[0][0]
        want = (20 * size - size // 10) / (1 + registry.PASS_OUTSIDE_LIMIT)
        assert memory_bytes(capped) == pytest.approx(want, rel=0.05)
        (tmp_path / "o").mkdir()
        done = run_pass(con, {n: tmp_path / "o" / f"{n}.parquet" for n in metric_names()}, jobs=3)
        assert len({d.lane for d in done}) > 1  # lanes ran
        assert con.execute(q).fetchall()[0][0] == capped
    finally:
        con.close()


@pytest.mark.parametrize(
    ("threads", "jobs", "during"), [(4, 2, 2), (2, 2, 1), (3, 2, 1), (2, 3, 1), (4, 1, 4)]
)
def test_lanes_share_duckdbs_threads_out_and_restore_them(
    store: Path, tmp_path: Path, threads: int, jobs: int, during: int
) -> None:
    """While the lanes run, DuckDB's threads (the database's) are the cores' share of one lane; the
    setting is the caller's again afterwards, and a sequential pass leaves it alone."""
    con = connect(store, read_only=True)
    try:
        con.execute(f"SET threads = {threads}")
        seen: set[int] = set()
        probe = con.cursor()  # lane 0 runs on con itself; the setting is the database's

        def look(_: pass_runner.MetricDone) -> None:  # run_pass calls it one call at a time
            seen.add(int(probe.execute("SELECT current_setting('threads')").fetchone()[0]))

        (tmp_path / "o").mkdir()
        names = metric_names()[:6] if jobs == 1 else metric_names()
        run_pass(con, {n: tmp_path / "o" / f"{n}.parquet" for n in names}, jobs=jobs, on_done=look)
        assert seen == {during}
        assert int(con.execute("SELECT current_setting('threads')").fetchone()[0]) == threads
        probe.close()
    finally:
        con.close()


def test_without_current_facts_the_pass_is_sequential(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=20, models=("m1",), samples=2, seed=3))
    done = _lanes(path, tmp_path / "o", 2)
    assert {d.lane for d in done} == {0}
    assert [d.name for d in done] == metric_names()  # and in the caller's order


def test_a_failing_metric_is_named_and_stops_the_pass(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = registry.write_result

    def failing(con: duckdb.DuckDBPyConnection, name: str, path: Path, **kw: object) -> int:
        if name == "brier":
            raise ValueError("no such thing")
        return real(con, name, path, **kw)

    monkeypatch.setattr(registry, "write_result", failing)
    monkeypatch.setattr(pass_runner, "GROUP_WEIGHTS", {"calibration": 9.0})  # brier's group first
    blas_before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    out = tmp_path / "o"
    out.mkdir()
    con = connect(store, read_only=True)
    try:
        con.execute("SET threads = 4")
        with pytest.raises(PassError) as info:
            run_pass(con, {n: out / f"{n}.parquet" for n in metric_names()}, jobs=2)
        # the settings the lanes shared out are the caller's again
        assert int(con.execute("SELECT current_setting('threads')").fetchone()[0]) == 4
    finally:
        con.close()
    assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"] == blas_before
    assert info.value.name == "brier" and isinstance(info.value.error, ValueError)
    # the lanes stopped taking metrics: the light lane's other groups were never written
    written = {p.stem for p in (tmp_path / "o").glob("*.parquet")}
    assert "brier" not in written and len(written) < len(metric_names()) - 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_on_error_records_a_failing_metric_and_the_pass_goes_on(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    """What a report or the benchmark needs: with on_error returning True the failure is the
    caller's record and every other metric is written; returning False stops the pass as without it."""
    real = registry.write_result

    def failing(con: duckdb.DuckDBPyConnection, name: str, path: Path, **kw: object) -> int:
        if name in ("brier", "aurc"):
            # aurc out of memory every time: beside other lanes it is retried alone, fails again
            raise duckdb.OutOfMemoryException("no room") if name == "aurc" else ValueError("no such thing")
        return real(con, name, path, **kw)

    monkeypatch.setattr(registry, "write_result", failing)
    errors: dict[str, BaseException] = {}
    out = tmp_path / "o"
    out.mkdir()
    con = connect(store, read_only=True)
    try:
        done = run_pass(
            con,
            {n: out / f"{n}.parquet" for n in metric_names()},
            jobs=jobs,
            on_error=lambda name, exc: errors.setdefault(name, exc) is exc,
        )
        assert sorted(errors) == ["aurc", "brier"] and isinstance(errors["brier"], ValueError)
        assert sorted(d.name for d in done) == [n for n in metric_names() if n not in errors]
        assert {p.stem for p in out.glob("*.parquet")} == {d.name for d in done}
        with pytest.raises(PassError) as info:
            run_pass(con, {"brier": out / "brier.parquet"}, jobs=jobs, on_error=lambda name, exc: False)
        assert info.value.name == "brier"

        def broken(name: str, exc: Exception) -> bool:
            raise KeyError("the callback's own bug")

        # an error raised by on_error itself (in a lane's thread with 2 jobs) is the pass's failure,
        # not lost with its lane
        with pytest.raises(PassError) as info:
            run_pass(con, {n: out / f"{n}.parquet" for n in metric_names()}, jobs=jobs, on_error=broken)
        assert info.value.name in ("aurc", "brier") and isinstance(info.value.error, KeyError)
    finally:
        con.close()


def test_a_metric_out_of_memory_beside_others_runs_again_alone(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = registry.write_result
    tries: list[str] = []

    def oom_once(con: duckdb.DuckDBPyConnection, name: str, path: Path, **kw: object) -> int:
        if name == "aurc" and not tries:
            tries.append(name)
            raise duckdb.OutOfMemoryException("could not allocate")
        return real(con, name, path, **kw)

    monkeypatch.setattr(registry, "write_result", oom_once)
    done = _lanes(store, tmp_path / "o", 2)
    assert tries == ["aurc"]
    # run again after the lanes, alone, on its own lane's connection (where prr, its group, ran)
    assert done[-1].name == "aurc" and done[-1].lane == next(d.lane for d in done if d.name == "prr")
    assert sorted(d.name for d in done) == metric_names()
    assert [d.name for d in done if d.retried] == ["aurc"]  # said, for a caller timing the pass


def test_cli_metrics_out_with_jobs_writes_the_same_files_and_caches_them(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 1 and --jobs 2 write the same files; the lanes' results are cached (each as its lane
    writes it), so a second call copies them without computing anything."""
    copy = tmp_path / "s.duckdb"  # its own store: the cache folder sits beside the store file
    copy.write_bytes(store.read_bytes())
    runner = CliRunner()
    outs = {}
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        args = ["metrics", "--store", str(copy), "--out", str(out), "--jobs", str(jobs)]
        r = runner.invoke(app, [*args, *(["--no-cache"] if jobs == 1 else [])])
        assert r.exit_code == 0, r.output
        outs[jobs] = {p.name: p.read_bytes() for p in sorted(out.glob("*.parquet"))}
        written = sorted(line.split(":")[0] for line in r.output.splitlines() if "rows ->" in line)
        assert written == metric_names()
    assert len(outs[1]) == len(metric_names()) and outs[1] == outs[2]

    def refused(*a: object, **k: object) -> None:
        raise AssertionError("computed although every result is cached")

    monkeypatch.setattr(pass_runner, "run_pass", refused)
    r = runner.invoke(app, ["metrics", "--store", str(copy), "--out", str(tmp_path / "again"), "--jobs", "2"])
    assert r.exit_code == 0, r.output
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "again").glob("*.parquet"))} == outs[2]


def test_cli_jobs_is_refused_below_one_lane_and_without_out(store: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["metrics", "--store", str(store), "--out", str(tmp_path / "c"), "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output
    r = runner.invoke(app, ["metrics", "--store", str(store), "--metric", "brier", "--jobs", "2"])
    assert r.exit_code == 2 and "--jobs applies to --out" in r.output
    help_text = runner.invoke(app, ["metrics", "--help"]).output
    assert f"Default: {pass_runner.DEFAULT_JOBS}." in " ".join(help_text.split()).replace("│", "")


def test_a_full_pass_imports_neither_scipy_nor_scikit_learn_nor_pandas(store: Path, tmp_path: Path) -> None:
    """The metrics compute their tests and fits themselves (``metrics.exact_tests``, the combiners'
    Newton / closed-form fits): scipy and scikit-learn held about 80 MiB of the pass process's RSS,
    memory that the pass's cap (``registry.pass_memory_cap``) now gives to DuckDB instead. The
    same for pandas and the pyarrow it imports (about 70 MiB): the metrics that do Python work
    return numpy columns that DuckDB writes (``metrics.columns``). A fresh interpreter, so that
    what other tests imported does not hide an import."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from equipoise.evaluators.metrics.pass_runner import run_pass\n"
        "from equipoise.evaluators.metrics.registry import metric_names\n"
        "from equipoise.evaluators.store import connect\n"
        f"store, out = Path({str(store)!r}), Path({str(tmp_path)!r})\n"
        "con = connect(store, read_only=True)\n"
        "done = run_pass(con, {n: out / f'{n}.parquet' for n in metric_names()}, jobs=2)\n"
        "con.close()\n"
        "assert sorted(d.name for d in done) == metric_names()\n"
        "heavy = ('scipy', 'sklearn', 'statsmodels', 'pandas', 'pyarrow')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[1]  # this checkout's package, installed or not
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_the_metrics_command_imports_neither_pandas_nor_pyarrow(store: Path, tmp_path: Path) -> None:
    """``equipoise metrics --out`` as a user runs it, in a fresh interpreter: the pass (cache empty)
    and the same command again (every metric copied from the results cache, its row count read from
    the file's footer) leave pandas and pyarrow unimported, as the pass itself does (above)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "s.duckdb"
    shutil.copy(store, copy)
    code = (
        "import sys\n"
        "from equipoise.cli import app\n"
        f"args = ['metrics', '--store', {str(copy)!r}, '--out', sys.argv[1]]\n"
        "try:\n"
        "    app(args)\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[1]
    for run in ("computed", "cached"):
        out = tmp_path / run
        res = subprocess.run(
            [sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=600, cwd=root
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().splitlines()[-1] == "[]", (run, res.stdout[-500:])
        assert len(list(out.glob("*.parquet"))) == len(metric_names())
    assert (tmp_path / "s.duckdb.cache").is_dir()


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="pass_memory.py reads /proc (Linux)")
def test_the_pass_memory_benchmark_runs_each_configuration_in_turn(store: Path, tmp_path: Path) -> None:
    """benchmarks/pass_memory.py (the memory cap's cost, measured in alternated fresh processes):
    one round of the pass's own cap and of an explicit limit with a setting, each a full pass that
    reports its limit and the kernel's counts, the second with environment variables of its own; a
    configuration that is not LIMIT[;NAME=VALUE...][|VAR=VALUE&...], or one given twice, is refused
    before any run."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = root / "benchmarks" / "pass_memory.py"
    paths = [str(root), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    out = tmp_path / "runs.json"
    cmd = [sys.executable, str(script), "--store", str(store), "--pairs", "1", "--out", str(out)]
    both = ["default|EQUIPOISE_PROBE=one", "1GiB;threads=1|EQUIPOISE_PROBE=a=b&EQUIPOISE_EMPTY="]
    cmd += ["--config", both[0], "--config", both[1]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert res.returncode == 0, res.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [r["config"] for r in runs] == both
    # each configuration's child sees its own value of the same variable
    assert runs[0]["env"] == {"EQUIPOISE_PROBE": "one"}
    assert runs[1]["env"] == {"EQUIPOISE_PROBE": "a=b", "EQUIPOISE_EMPTY": ""}
    # the default is the pass's own cap: at this store's size, the floor (registry.PASS_MEMORY_FLOOR)
    assert runs[0]["memory_limit"] == f"{registry.PASS_MEMORY_FLOOR / 2**20:.1f} MiB"
    assert runs[1]["memory_limit"] == "1.0 GiB"
    for r in runs:
        assert r["wall_s"] > 0 and r["minflt"] > 0 and r["peak_mib"] > 0 and r["read_mib"] >= 0
    assert "won 0 of 1" in res.stdout or "won 1 of 1" in res.stdout
    for configs, error in (
        (["2GiB;threads"], "is not NAME=VALUE"),
        (["2GiB|LD PRELOAD=x"], "is not VAR=VALUE"),
        (["2GiB", "2GiB"], "each configuration once"),
    ):
        refused = [*cmd[:-4], *(x for c in configs for x in ("--config", c))]
        bad = subprocess.run(refused, capture_output=True, text=True, timeout=120, cwd=root, env=env)
        assert bad.returncode != 0 and error in bad.stderr
