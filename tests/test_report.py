"""`equipoise report` writes every metric table and the plots it has rows for."""

from __future__ import annotations

from typer.testing import CliRunner

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.cli import app
from equipoise.evaluators.reference_run import run_reference_policies
from equipoise.evaluators.store import connect


def test_report_writes_tables_and_pngs(small_clindet, tmp_path):
    clear = tmp_path / "clear"
    build_mcq_suite("clear", clear, seed=2, max_k=2)
    store = tmp_path / "s.duckdb"
    con = connect(store)
    run_reference_policies(con, small_clindet, progress=False, policies=["oracle", "chance"])
    run_reference_policies(con, clear, progress=False, policies=["oracle", "always_answer"])
    con.close()
    out = tmp_path / "report"
    r = CliRunner().invoke(app, ["report", "--store", str(store), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for png in ("accuracy_vs_abstention_by_k.png", "determinability_by_condition.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert (out / "answer_rates.csv").read_text().startswith("model,")


def test_risk_coverage_plot_never_builds_the_per_prediction_frame(tmp_path, monkeypatch):
    """The curve has a point per distinct confidence; the plot reads at most PLOT_POINTS per model
    from SQL and never asks for the whole metric as a frame."""
    from equipoise.evaluators import report as rep
    from equipoise.evaluators.metrics.registry import _load_all, prepare
    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    store = tmp_path / "s.duckdb"
    make_store(store, SyntheticSpec(n_items=300, models=("m1", "m2"), samples=2, seed=5))
    _load_all()
    con = connect(store, read_only=True)
    prepare(con, materialize=True)
    real = rep.compute

    def guarded(con, name, *a, **k):
        assert name != "risk_coverage", "the per-prediction curve was built as a frame"
        return real(con, name, *a, **k)

    monkeypatch.setattr(rep, "compute", guarded)
    monkeypatch.setattr(rep, "PLOT_POINTS", 20)
    drawn = []
    monkeypatch.setattr(rep.plt.Axes, "step", lambda self, x, y, **k: drawn.append((list(x), list(y))))
    assert rep.plot_risk_coverage(con, tmp_path / "rc.png")
    con.close()
    assert len(drawn) == 2
    for xs, ys in drawn:
        assert 1 < len(xs) <= 21 and xs == sorted(xs) and xs[-1] == 1.0
        assert all(0.0 <= y <= 1.0 for y in ys)


def test_report_skips_a_metric_the_store_cannot_give_and_stops_on_any_other_error(tmp_path, monkeypatch):
    """A DuckDB or parameter error is one skipped line and every other table is written (the
    metrics run as one pass in lanes); a bug elsewhere is raised as itself, not hidden."""
    import duckdb
    import pytest

    from equipoise.evaluators import report as rep
    from equipoise.evaluators.metrics import facts, registry
    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    store = tmp_path / "s.duckdb"
    make_store(store, SyntheticSpec(n_items=60, models=("m1", "m2"), samples=2, seed=5))
    con = connect(store)
    facts.refresh(con)  # current facts: the pass runs in lanes
    con.close()
    real = registry.write_result
    broken: dict[str, Exception] = {
        "brier": duckdb.BinderException("no column x"),
        "aurc": ValueError(""),  # no message: named by its type
    }

    def failing(con, name, path, **kw):
        if name in broken:
            raise broken[name]
        return real(con, name, path, **kw)

    monkeypatch.setattr(registry, "write_result", failing)
    monkeypatch.setattr(rep, "PLOTS", {})
    got = rep.write_report(store, tmp_path / "r")
    assert got.skipped == ["aurc: ValueError", "brier: no column x"]
    assert got.tables == [f"{n}.csv" for n in registry.metric_names() if n not in broken]
    assert sorted(p.name for p in (tmp_path / "r").glob("*.csv")) == got.tables
    broken["auroc"] = KeyError("a bug")
    with pytest.raises(KeyError, match="a bug"):
        rep.write_report(store, tmp_path / "r2")


def test_report_jobs_option_reaches_the_pass(tmp_path, monkeypatch):
    """`report --jobs N` hands N to write_report (whose pass runs in N lanes); without it the
    default lanes of `equipoise metrics` are used."""
    from equipoise.evaluators import report as rep
    from equipoise.evaluators.metrics.pass_runner import DEFAULT_JOBS

    store = tmp_path / "s.duckdb"
    connect(store).close()
    seen: list[int] = []
    monkeypatch.setattr(
        rep, "write_report", lambda store, out, memory_limit, jobs: seen.append(jobs) or rep.Report(out)
    )
    for extra in ([], ["--jobs", "1"], ["--jobs", "3"]):
        r = CliRunner().invoke(app, ["report", "--store", str(store), "--out", str(tmp_path / "r"), *extra])
        assert r.exit_code == 0, r.output
    assert seen == [DEFAULT_JOBS, 1, 3]
    r = CliRunner().invoke(app, ["report", "--store", str(store), "--jobs", "0"])
    assert r.exit_code == 2
