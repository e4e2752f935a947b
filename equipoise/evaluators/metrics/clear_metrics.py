"""CLEAR metrics (seed 001: Methods "Perturbation and Evaluation protocol", Figs. 3-5, Supplementary
Figs. S3-S6) over MCQ items of suite 'clear', whose variants are ``k{k}_{task}`` with task one of
``gold`` (target = gold), ``na`` / ``idk`` / ``ina`` (gold replaced by that abstain option, now the
target) and ``na_idk`` / ``na_ina`` (gold replaced by NA, the second abstain option added; NA stays
the target).

- ``humility_deficit`` (``clr_humility.sql``): one row per (group, k, framing) with framing in
  NA / IDK / INA: ``accuracy`` on k{k}_gold, ``abstention_rate`` (selecting the target abstain
  option) on k{k}_{framing}, ``humility_deficit = accuracy - abstention_rate`` (seed 001: "the gap in a
  model's accuracy and abstention rates"), plus the abstention side's ``incorrect_selection_rate``
  and both sides' unparsed rates.
- ``idk_shift`` (``clr_idk_shift.sql``): one row per (group, k, added_framing) with added_framing in
  IDK / INA: P(distractor), P(NA), P(second option) and P(unparsed) on k{k}_na ("before") and on
  k{k}_na_{idk|ina} ("after"), and the after - before deltas (Supplementary Fig. S6's "IDK Shift").
- ``chance_baseline`` (``clr_chance.sql``): per group, the exact expected accuracy of a uniform
  random choice (mean of 1 / n_options over the same rows) next to the observed accuracy; param
  ``suite`` (default 'clear', '*' = every MCQ suite).

Pairing (humility_deficit, idk_shift) is per question, not just per group: each item of the reported
side (the abstention item, or the "after" item), one per run, is paired with the partner item of the
same ``base_id`` (k{k}_gold, or k{k}_na), pooled over every partner run sharing dataset_id, model,
backend, prompt_style and decoding. Different prompt templates of one style (e.g. the NA and NA+IDK
system prompts) therefore still pair, and a second partner run (another template) adds samples to
the partner instead of duplicating the pair. An item's value is the mean over its samples and every
rate is a mean over complete pairs, so with one sample per item and complete runs the rates equal
the plain per-config rates. Items of the reported side without a partner are counted in
``n_unpaired``. Strata for grouping come from the reported-side item. ``k`` and, for
humility_deficit, ``framing`` are always keys; asking to group by them changes nothing. Unparsed
samples (no valid option: unparseable text, backend errors, free-text refusals, unknown letters;
CLEAR scores the selected option) stay in every denominator and never count as target, abstain or
distractor selections.

Neither pairing metric takes parameters; chance_baseline takes only ``suite``, which is checked and
bound as a query parameter, never pasted into SQL. Unknown parameters are refused with ValueError,
so a misspelt option cannot silently fall back to a default.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import duckdb

from equipoise.evaluators.metrics import columns
from equipoise.evaluators.metrics.registry import REGISTRY, Metric, register, render_sql

_SUITE_RE = re.compile(r"^(\*|[A-Za-z0-9_.-]+)$")
DEFAULT_BY: tuple[str, ...] = ("model", "prompt_style")


def _refuse_unknown(name: str, params: dict, allowed: Sequence[str]) -> None:
    """Fail loudly on parameters the metric does not read (a typo would otherwise be ignored)."""
    extra = sorted(set(params) - set(allowed))
    if extra:
        takes = ", ".join(allowed) if allowed else "no parameters"
        raise ValueError(f"metric '{name}' got unknown parameter(s) {extra}; it takes {takes}")


def _keyed(
    name: str, fixed: Sequence[str]
) -> Callable[[duckdb.DuckDBPyConnection, Sequence[str], dict], columns.Columns]:
    """compute_fn for a metric whose SQL always groups by ``fixed`` after the caller's ``by``; the
    fixed keys are dropped from ``by`` so asking for them neither duplicates nor breaks a column."""

    def fn(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
        _refuse_unknown(name, params, ())
        by = [b for b in by if b not in fixed]
        # the per-item step keeps only the strata of this grouping (any_value over the item's key;
        # run_id, part of that key, it has as it is; item_id is no stratum, refused with ``by``)
        keep = [b for b in dict.fromkeys(by) if b != "run_id"]
        by_any = "".join(f"any_value({b}) AS {b}, " for b in keep)
        return columns.fetch(con, render_sql(REGISTRY[name], by, {"by_any": by_any}))

    return fn


def _chance(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    """chance_baseline: validate ``suite`` (a suite name or '*') and bind it as a query parameter."""
    _refuse_unknown("chance_baseline", params, ("suite",))
    suite = params.get("suite", "clear")
    if not isinstance(suite, str) or not _SUITE_RE.match(suite):
        raise ValueError(f"chance_baseline: bad suite {suite!r}; expected a suite name or '*'")
    sql = render_sql(REGISTRY["chance_baseline"], by, {})
    return columns.fetch(con, sql, {"suite": suite})


register(
    Metric(
        name="humility_deficit",
        description="CLEAR: accuracy on k{k}_gold minus abstention rate on the paired k{k}_{NA|IDK|INA} "
        "items (seed 001 Fig. 3)",
        sql="clr_humility.sql",
        default_by=DEFAULT_BY,
        compute_fn=_keyed("humility_deficit", ("k", "framing")),
    )
)
register(
    Metric(
        name="idk_shift",
        description="CLEAR: P(distractor), P(NA), P(IDK|INA) before and after the second abstain option "
        "is added to k{k}_na (seed 001 Fig. 5, Supp. Fig. S6)",
        sql="clr_idk_shift.sql",
        default_by=DEFAULT_BY,
        compute_fn=_keyed("idk_shift", ("k",)),
    )
)
register(
    Metric(
        name="chance_baseline",
        description="expected accuracy of a uniform random choice (mean 1/n_options) next to observed "
        "accuracy (seed 001)",
        sql="clr_chance.sql",
        default_by=("model", "prompt_style", "variant"),
        params={"suite": "clear"},
        compute_fn=_chance,
    )
)
