"""`equipoise report`: every metric as a CSV table plus the plots a reader would rather look at.

Each plot is drawn from a registered metric's SQL output only (no recomputation here), and is
skipped with a note when the store has no rows it could draw (e.g. no CLEAR runs, no option scores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

from equipoise.evaluators.metrics import cache
from equipoise.evaluators.metrics.pass_runner import DEFAULT_JOBS, PassError, run_pass
from equipoise.evaluators.metrics.registry import compute, metric_names, result_sql
from equipoise.evaluators.store import connect, first_line

PLOT_POINTS = 2000  # most points drawn per risk-coverage curve


@dataclass
class Report:
    out: Path
    tables: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _short(model: str) -> str:
    return str(model).removeprefix("reference:")


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})  # no version stamp: stable bytes
    plt.close(fig)


def plot_accuracy_vs_abstention_by_k(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """CLEAR: accuracy with the gold present vs abstention with it absent, as distractors grow."""
    df = compute(con, "answer_rates", ["suite", "model", "k", "variant"])
    df = df[df.suite == "clear"]
    if df.empty:
        return False
    df = df.assign(task=df.variant.str.split("_", n=1).str[1])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for model, g in df.groupby("model"):
        gold = g[g.task == "gold"].sort_values("k")
        na = g[g.task == "na"].sort_values("k")
        line = left.plot(gold.k, gold.accuracy, marker="o", label=_short(model))[0]
        right.plot(na.k, na.abstention_rate, marker="s", color=line.get_color(), label=_short(model))
    ks = sorted(df.k.dropna().unique())
    for ax, title in (
        (left, "accuracy, gold present"),
        (right, "abstention, gold replaced by 'None of the above'"),
    ):
        ax.set_xticks(ks)
        ax.set_xlabel("distractors k")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    left.set_ylabel("rate")
    right.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("CLEAR: the humility deficit is the gap between the two panels at the same k")
    _save(fig, path)
    return True


def plot_determinability(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """ClinDet: accuracy per information condition for each model."""
    df = compute(con, "answer_rates", ["suite", "model", "condition"])
    df = df[(df.suite == "clindet") & df.condition.notna()]
    if df.empty:
        return False
    order = ["complete", "incomplete_determinable", "incomplete_undeterminable"]
    models = sorted(df.model.unique())
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(order)
    for j, cond in enumerate(order):
        vals = [df[(df.model == m) & (df.condition == cond)].accuracy.mean() for m in models]
        ax.bar([i + j * width for i in range(len(models))], vals, width, label=cond.replace("_", " "))
    ax.set_xticks([i + width for i in range(len(models))], [_short(m) for m in models], rotation=20)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.18)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_title("Determinability accuracy by information condition (ClinDet)")
    ax.legend(fontsize=8, ncol=3, loc="upper center", frameon=False)
    _save(fig, path)
    return True


def _legend_right(ax: plt.Axes) -> None:
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)


def plot_reliability(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """Reliability diagram: accuracy against mean confidence per bin, one line per model; bins with
    no predictions are left out rather than drawn at zero."""
    df = compute(con, "reliability", ["model"])
    df = df[df.n > 0]
    if df.empty:
        return False
    fig, ax = plt.subplots(figsize=(6.8, 4.8))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    for model, g in df.groupby("model"):
        g = g.sort_values("bin")
        ax.plot(g.mean_confidence, g.accuracy, marker="o", ms=4, label=_short(model))
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("confidence: probability of the chosen option (10 equal-width bins)")
    ax.set_ylabel("accuracy in bin")
    ax.set_title("Reliability diagram (all suites)")
    ax.grid(alpha=0.3)
    _legend_right(ax)
    _save(fig, path)
    return True


def plot_risk_coverage(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """Selective prediction: error rate among the accepted answers as coverage grows.

    The curve has a point per distinct confidence (about one per prediction); the plot needs no
    more than its width can show, so SQL keeps the last point of each 1/2000 of coverage (the
    curve's value there, as a step plot draws it) and no frame of every prediction is built."""
    sql = result_sql(con, "risk_coverage", ["model"])
    assert sql is not None  # risk_coverage is one query
    df = con.execute(
        f"""SELECT model, max(coverage) AS coverage, arg_max(risk, coverage) AS risk
            FROM ({sql}) GROUP BY model, floor(coverage * {PLOT_POINTS}) ORDER BY model, coverage"""
    ).df()
    if df.empty:
        return False
    aurc = compute(con, "aurc", ["model"]).set_index("model").aurc
    fig, ax = plt.subplots(figsize=(6.8, 4.8))
    for model, g in df.groupby("model"):
        g = g.sort_values("coverage")
        label = f"{_short(model)} (AURC {aurc.get(model, float('nan')):.3f})"
        ax.step(g.coverage, g.risk, where="post", marker=".", ms=3, label=label)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("coverage (share of predictions accepted, most confident first)")
    ax.set_ylabel("risk (error rate of accepted)")
    ax.set_title("Risk-coverage curves (all suites)")
    ax.grid(alpha=0.3)
    _legend_right(ax)
    _save(fig, path)
    return True


def plot_humility_deficit(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """CLEAR: accuracy with the gold present minus abstention with it absent, per model, k and framing."""
    df = compute(con, "humility_deficit", ["model"])
    df = df[df.humility_deficit.notna()]
    if df.empty:
        return False
    framings = [f for f in ("NA", "IDK", "INA") if f in set(df.framing)]
    fig, axes = plt.subplots(1, len(framings), figsize=(3.6 * len(framings) + 1.6, 4), sharey=True)
    axes = [axes] if len(framings) == 1 else list(axes)
    for ax, framing in zip(axes, framings, strict=True):
        sub = df[df.framing == framing]
        for model, g in sub.groupby("model"):
            g = g.sort_values("k")
            ax.plot(g.k, g.humility_deficit, marker="o", label=_short(model))
        ax.axhline(0, color="grey", lw=1)
        ax.set_xticks(sorted(sub.k.unique()))
        ax.set_xlabel("distractors k")
        ax.set_title(f"gold replaced by {framing}", fontsize=10)
        ax.set_ylim(-1.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("humility deficit (accuracy - abstention)")
    _legend_right(axes[-1])
    fig.suptitle("CLEAR humility deficit per model: above 0, the model knows more than it admits not knowing")
    _save(fig, path)
    return True


SET_SIZE_SUITES = ("medabstain", "nota", "calc-mcq", "shuffle")


def plot_set_size_by_variant(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """Conformal (LAC) mean set size per variant, one bar per model, with the test coverage on top."""
    df = compute(con, "conformal_lac", ["model", "suite", "variant"])
    df = df[df.suite.isin(SET_SIZE_SUITES) & df.set_size_mean.notna()]
    if df.empty:
        return False
    suites = [s for s in SET_SIZE_SUITES if s in set(df.suite)]
    models = sorted(df.model.unique())
    fig, axes = plt.subplots(1, len(suites), figsize=(3.8 * len(suites) + 1.6, 4.4), sharey=True)
    axes = [axes] if len(suites) == 1 else list(axes)
    width = 0.8 / len(models)
    for ax, suite in zip(axes, suites, strict=True):
        sub = df[df.suite == suite]
        variants = sorted(sub.variant.unique())
        for j, model in enumerate(models):
            g = sub[sub.model == model].set_index("variant").reindex(variants)
            xs = [i + j * width for i in range(len(variants))]
            ax.bar(xs, g.set_size_mean, width, label=_short(model))
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(variants))], variants, rotation=25, fontsize=8)
        ax.set_title(suite, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("mean LAC set size (alpha = 0.1)")
    _legend_right(axes[-1])
    fig.suptitle("Conformal prediction set size by variant (split conformal, 30/70, mean over splits)")
    _save(fig, path)
    return True


PLOTS: dict[str, tuple[tuple[str, ...], Callable[[duckdb.DuckDBPyConnection, Path], bool]]] = {
    "accuracy_vs_abstention_by_k.png": (("answer_rates",), plot_accuracy_vs_abstention_by_k),
    "determinability_by_condition.png": (("answer_rates",), plot_determinability),
    "reliability_diagram.png": (("reliability",), plot_reliability),
    "risk_coverage.png": (("risk_coverage", "aurc"), plot_risk_coverage),
    "humility_deficit.png": (("humility_deficit",), plot_humility_deficit),
    "set_size_by_variant.png": (("conformal_lac",), plot_set_size_by_variant),
}


def write_report(store: Path, out: Path, memory_limit: str | None = None, jobs: int = DEFAULT_JOBS) -> Report:
    """Every metric as CSV plus the plots; ``memory_limit`` as in ``store.connect``.

    Tables are one metrics pass (``pass_runner.run_pass``, in ``jobs`` lanes): each goes through
    ``write_result``, where a metric that is one query is copied by DuckDB straight to its CSV, so
    no frame of all predictions (or per-item scores) is built here; the small aggregated results
    are numpy columns that DuckDB writes (``metrics.columns``), and only the plots' inputs pass
    through pandas. A metric the store cannot give (a DuckDB or
    parameter error) is listed as skipped and the rest are written; any other error stops the
    report. A folder that cannot be created is a ``ValueError`` naming it, raised before the store
    is opened.
    """
    names = metric_names()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from exc
    opened = cache.file_stat(store)  # before opening: the memo must be of the file opened
    con = connect(store, read_only=True, memory_limit=memory_limit)
    rep = Report(out)
    try:
        skipped: dict[str, str] = {}

        def skip(name: str, exc: Exception) -> bool:
            if not isinstance(exc, (duckdb.Error, ValueError)):
                return False
            skipped[name] = first_line(exc)
            return True

        failure: Exception | None = None
        try:  # prepares the base joins once for every table and plot
            # the memo of `equipoise metrics` (cache.memoised_sums, checked while this read-only
            # connection holds the store) spares the pass its fingerprint scan; a report never
            # writes one
            targets = {name: out / f"{name}.csv" for name in names}
            sums = cache.memoised_sums(store, opened)
            done = run_pass(con, targets, jobs=jobs, on_error=skip, sums=sums)
            written = {d.name for d in done}
        except PassError as exc:
            failure = exc.error  # raised as itself, as a caller of that one metric would see it
        if failure is not None:
            raise failure
        # in the metrics' order, whichever lane finished first
        rep.tables = [f"{name}.csv" for name in names if name in written]
        rep.skipped = [f"{name}: {skipped[name]}" for name in names if name in skipped]
        for fname, (needs, fn) in PLOTS.items():
            if not all(n in names for n in needs):
                rep.skipped.append(f"{fname}: needs metrics {needs}")
                continue
            if fn(con, out / fname):
                rep.plots.append(fname)
            else:
                rep.skipped.append(f"{fname}: no rows to draw in this store")
    finally:
        con.close()
    return rep
