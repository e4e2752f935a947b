"""Determinability metrics (seed 003 ClinDet-Bench: 3.3.2, 3.4.2, Table 3, Figure 2, Tables A.6/A.7).

Rows are the decision samples of ``task = 'determinability'`` items (conditions ``complete``,
``incomplete_determinable``, ``incomplete_undeterminable``; options 'Met', 'Not met' and 'Unable to
determine', the last with role ``abstain``). Runs whose prompt_style starts with ``self_eval:`` are
self-evaluations, never decisions, and are left out of every decision metric. A sample that chose
no option (unparsed, error) stays in every denominator and is never correct.

- ``determinability_accuracy`` (``det_accuracy.sql``): per group *and condition* (condition is always
  a key): n, accuracy, ``premature_judgment_rate`` (undeterminable cases answered 'Met' / 'Not met'),
  ``excessive_abstention_rate`` (complete or determinable cases answered 'Unable to determine'),
  ``wrong_decision_rate`` (determinable cases answered with the opposite decision) and
  ``unparsed_rate``. The premature rate is NULL outside the undeterminable condition and the
  abstention / wrong-decision rates are NULL in it.
- ``determinability_fisher`` (``det_fisher_counts.sql``): within each group (default model x
  prompt_style) each incomplete condition's accuracy against Complete's, two-sided Fisher exact test
  on the 2x2 table [[correct, wrong] incomplete, [correct, wrong] complete]: p is the total
  hypergeometric probability (margins fixed) of the tables no more likely than the observed one, ties
  decided exactly (``exact_tests.fisher_exact_2x2``; the tests check it against
  scipy.stats.fisher_exact); ``odds_ratio`` is the sample odds ratio (incomplete vs complete odds of a
  correct decision; inf when no incomplete decision is wrong or no complete one is correct, NaN
  when a column is empty, where p = 1), ``significant`` is p <= ``alpha`` (default 0.05, as in the
  seed). p is NULL when either row of the table is empty.
- ``determinability_tradeoff`` (``det_tradeoff_points.sql``): one point per group (default model x
  prompt_style): (Incomplete-Determinable accuracy, Incomplete-Undeterminable accuracy); Spearman's
  rank correlation across the points with its two-sided p-value (``exact_tests.spearman_rho_p``: the
  Pearson correlation of average ranks, ties sharing their mean rank; p from Student's t with n - 2
  degrees of freedom, t = rho sqrt((n - 2) / (1 - rho^2)); the tests check it against
  scipy.stats.spearmanr). One output row. Groups missing a condition are dropped from the
  correlation and counted in ``n_groups_dropped``; fewer than 3 points, or a constant coordinate,
  give NULL rho and p.
- ``self_eval_filtered_accuracy`` (``det_self_eval.sql``): accuracy among decisions the model judged
  'Correct' in a separate self-evaluation session, per group and condition.

Self-evaluation linkage (the store has no column for it, so it is a naming convention): a
self-evaluation run is stored as its own run with ``prompt_style = 'self_eval:' || <the decision
run's prompt_style>`` (e.g. ``self_eval:cot``) and the decision run's ``model``, ``backend``,
``dataset_id`` and ``config``; its predictions carry the verdict in ``parsed_label`` ('Correct' /
'Incorrect'; anything else is an unparsed verdict) under the decision's ``item_id`` and
``sample_index``. Decoding settings and prompt template need not match. Output columns:
``n`` (all decision samples), ``accuracy`` (over all of them), ``n_self_evaluated`` (verdicts linked),
``n_judged_correct``, ``n_verdict_unparsed``, ``judged_correct_rate`` (share of verdicts that say
'Correct': seed 003's "self-evaluation consistency", Table A.6), ``accuracy_self_evaluated``
(accuracy over the decisions that got a verdict) and ``filtered_accuracy`` (accuracy among the
decisions judged 'Correct', Table A.7). With no self-evaluation run the verdict counts are 0 and the
three rates NULL.

Fisher and trade-off compare conditions, so they cannot also be grouped by ``condition`` or by
``variant`` (which equals the condition in the clindet suite); asking for it raises ``ValueError``.
Grouping accuracy or self-evaluation by ``condition`` is the same as not asking (it is always a key).
Every sample is one observation; for runs with several samples per item the exact test treats them
as independent, which they are not: use one sample per item (the seed's setting) for the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np

from equipoise.evaluators.metrics import columns
from equipoise.evaluators.metrics.exact_tests import fisher_exact_2x2, spearman_rho_p
from equipoise.evaluators.metrics.registry import REGISTRY, Metric, register, render_sql

CONDITIONS: tuple[str, ...] = ("complete", "incomplete_determinable", "incomplete_undeterminable")
SELF_EVAL_PREFIX = "self_eval:"
DEFAULT_BY: tuple[str, ...] = ("model", "prompt_style")


def _without(by: Sequence[str], fixed: Sequence[str]) -> list[str]:
    """``by`` minus columns the metric always groups by (asking for them again changes nothing)."""
    return [b for b in by if b not in fixed]


def _refuse(name: str, by: Sequence[str], compared: Sequence[str]) -> list[str]:
    bad = [b for b in by if b in compared]
    if bad:
        raise ValueError(f"{name} compares information conditions; it cannot be grouped by {bad}")
    return list(by)


def _alpha(params: dict) -> float:
    alpha = float(params.get("alpha", 0.05))
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return alpha


def _per_condition(name: str):
    def fn(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
        return columns.fetch(con, render_sql(REGISTRY[name], _without(by, ["condition"]), params))

    return fn


def fisher_table_p(n_correct: int, n: int, n_correct_ref: int, n_ref: int) -> tuple[float, float]:
    """Two-sided Fisher exact test of [[correct, wrong], [correct_ref, wrong_ref]]: (odds ratio, p)."""
    if n == 0 or n_ref == 0:
        return float("nan"), float("nan")
    return fisher_exact_2x2(n_correct, n - n_correct, n_correct_ref, n_ref - n_correct_ref)


def _share(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """part / whole as floats, NaN where whole is 0."""
    part, whole = np.asarray(part, dtype=float), np.asarray(whole, dtype=float)
    return np.divide(part, whole, out=np.full(len(whole), np.nan), where=whole > 0)


def _fisher(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    by = _refuse("determinability_fisher", by, ["condition", "variant"])
    alpha = _alpha(params)
    out = columns.fetch(con, render_sql(REGISTRY["determinability_fisher"], by, params))
    nc, n, ncr, nr = (out[c] for c in ("n_correct", "n", "n_correct_complete", "n_complete"))
    # one exact test per aggregated row (groups x 2): a loop over the small result, not over rows
    tests = [
        fisher_table_p(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(nc, n, ncr, nr, strict=True)
    ]
    out["accuracy"] = _share(nc, n)
    out["accuracy_complete"] = _share(ncr, nr)
    out["accuracy_difference"] = out["accuracy"] - out["accuracy_complete"]
    out["odds_ratio"] = np.array([t[0] for t in tests], dtype=float)
    out["p_value"] = p = np.array([t[1] for t in tests], dtype=float)
    out["significant"] = columns.where_valid(p <= alpha, ~np.isnan(p))
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman's rho and two-sided p (``spearman_rho_p``); NaN for under 3 points or a constant input."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan")
    return spearman_rho_p(x, y)


def _tradeoff(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    by = _refuse("determinability_tradeoff", by, ["condition", "variant"])
    alpha = _alpha(params)
    pts = columns.fetch(con, render_sql(REGISTRY["determinability_tradeoff"], by, params))
    det = np.asarray(pts["acc_determinable"], dtype=float)
    undet = np.asarray(pts["acc_undeterminable"], dtype=float)
    ok = ~np.isnan(det) & ~np.isnan(undet)
    rho, p = spearman(det[ok], undet[ok])
    return {
        "points_by": np.array([", ".join(by)], dtype=object),
        "n_points": np.array([int(ok.sum())], dtype=np.int64),
        "n_groups_dropped": np.array([int((~ok).sum())], dtype=np.int64),
        "spearman_rho": np.array([rho], dtype=float),
        "p_value": np.array([p], dtype=float),
        "significant": columns.where_valid(np.array([p <= alpha]), np.array([not np.isnan(p)])),
    }


register(
    Metric(
        name="determinability_accuracy",
        description="per condition: accuracy, premature judgment, excessive abstention, wrong decision "
        "and unparsed rates (seed 003 Table 3)",
        sql="det_accuracy.sql",
        default_by=DEFAULT_BY,
        compute_fn=_per_condition("determinability_accuracy"),
    )
)
register(
    Metric(
        name="determinability_fisher",
        description="two-sided Fisher exact test of each incomplete condition's accuracy vs Complete "
        "within each group (seed 003 3.4.2)",
        sql="det_fisher_counts.sql",
        default_by=DEFAULT_BY,
        params={"alpha": 0.05},
        compute_fn=_fisher,
    )
)
register(
    Metric(
        name="determinability_tradeoff",
        description="Spearman correlation of Incomplete-Determinable vs Incomplete-Undeterminable "
        "accuracy across groups (seed 003 Figure 2)",
        sql="det_tradeoff_points.sql",
        default_by=DEFAULT_BY,
        params={"alpha": 0.05},
        compute_fn=_tradeoff,
    )
)
register(
    Metric(
        name="self_eval_filtered_accuracy",
        description="accuracy among decisions a linked self-evaluation run judged 'Correct', with the "
        "judged-correct rate (seed 003 Tables A.6 / A.7)",
        sql="det_self_eval.sql",
        default_by=DEFAULT_BY,
        compute_fn=_per_condition("self_eval_filtered_accuracy"),
    )
)
