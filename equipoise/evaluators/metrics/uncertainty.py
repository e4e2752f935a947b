"""Uncertainty scores per item (seed 002 sections 4.1 / 4.3 / appendix D; seed 004 sections 3.3-3.4,
appendix D), their min-max normalisation, the reasoning-trace combiners and a per-group summary.

Every score is SQL over the base views; one row per (run_id, item_id) so AUROC, calibration and flip
analyses can join them. Higher means more uncertain, except the two columns named as confidences
(``geo_mean_token_prob``, ``elicited_confidence``).

Single-pass scores (sample 0):

- ``label_nll``: -log p(chosen option), p = softmax over the scored options (``option_probs``);
  ``label_nll_raw``: -log-probability of the chosen option's token as the backend reported it (the
  whole-vocabulary value seed 004 calls Label NLL). NULL when sample 0 chose no option or the chosen
  option was not scored.
- ``avg_nll`` = -token_logprob_mean (ANLL), ``max_nll`` = -token_logprob_min (Max NLL: the largest
  per-token NLL), ``g_nll`` = -token_logprob_sum: G-NLL (Aichberger et al., seed 002 4.1) is the NLL
  of the greedily decoded sequence, so ``g_nll`` is exactly G-NLL when sample 0 was decoded greedily
  (``sample0_greedy``: temperature 0 in the run's decoding; an empty decoding means the default 0),
  otherwise it is the NLL of the first sampled sequence.
- ``geo_mean_token_prob`` = exp(token_logprob_mean): the store keeps only the mean log-probability, so
  this is the geometric mean of the token probabilities, not seed 002's arithmetic mean of token
  probabilities (which needs per-token values the store does not keep; by Jensen it is never larger).
- ``option_entropy``: entropy (nats) of sample 0's softmax over the scored options.
- ``elicited_confidence``: the last "Confidence: 80%" / "confidence 0.8" statement in the output
  (``CONFIDENCE_RE``); with '%' it is divided by 100, without '%' a value <= 1 is read as a
  probability and a value in (1, 100] as a percentage; anything else is NULL.
  ``elicited_uncertainty`` = 1 - confidence.
- reasoning features (seed 002 5.2 / appendix D) from the whole raw output: ``n_output_tokens``
  (the store's count), ``n_words`` (whitespace-separated runs), ``n_questions`` (maximal runs of
  '?': a self-posed question), ``n_wait`` (the word 'wait', any case) and ``n_hedges``
  (``HEDGE_WORDS`` as whole words, any case).

Sampling scores over the item's pool of M samples (param ``pool``: 'item' = the item's own samples;
'base' = every item of the run sharing the base_id, i.e. the shuffled permutations of one question,
as seeds 002 4.3 and 004 3.4 sample with options reshuffled). Answers cluster by option identity
(``parsed_option_id``), so one option keeps one cluster whatever letter it has; samples with no option
(unparsed, refusal, error) form one '(no answer)' cluster. For multiple choice an option is a
semantic-equivalence class (seed 002 4.1, seed 004 3.3).

- ``sample_consistency`` (SC) = 1 - (size of the largest cluster) / M;
- ``semantic_entropy`` (SE) = -sum_c (n_c / M) ln(n_c / M);
- ``pro`` (PRO, seed 004 appendix D.1): entropy of the sequence probabilities exp(token_logprob_sum)
  renormalised over the pool's *distinct* sampled sequences (distinct per item and text; repeats of
  one sequence are one outcome, else ten identical confident answers would score ln 10). This is the
  seed's plain entropy, not the top-K lower bound with an adaptive threshold of the PRO authors' code.

``unc_normalized`` min-max scales each uncertainty score to [0, 1] per group, with bounds taken on an
md5 held-out split (seed 004 D.3): one row per item, one column per score, as ``unc_scores``; the
bounds themselves are ``unc_normalization_bounds`` (one row per group and score), not repeated per item.

``unc_combiners`` combines the reasoning-trace features (scaled to [0, 1] on an md5 training split)
into one uncertainty per item three ways: their plain sum, an L2-penalised logistic regression and a
ridge regression on the incorrect label, and reports each one's coefficients and test-split AUROC.
Both regressions are fitted here in numpy (ridge in closed form, logistic by Newton's method) to the
exact optimum of their objectives, the ones scikit-learn's ``LogisticRegression(C)`` and
``Ridge(alpha)`` state: fitted to convergence, so the coefficients do not depend on a solver's
stopping tolerance.

``unc_auroc`` ranks every uncertainty score against correctness: the AUROC for detecting incorrect
sample-0 answers (the discrimination number seeds 002 and 004 report per method), with undefined
scores counted rather than silently dropped.

EigenEmbed and RDS need an external sentence encoder: :func:`embedding_scores` computes them for any
``embed(texts) -> array`` callable (not registered as a metric, since it cannot run without one).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from equipoise.evaluators.metrics import columns
from equipoise.evaluators.metrics.registry import (
    PER_ITEM_DICTIONARY_LIMIT,
    REGISTRY,
    SQL_DIR,
    STRATA,
    Metric,
    _check_by,
    _materialized,
    cached_table,
    prepare,
    register,
    render_sql,
    scans_in_insertion_order,
    temp_tables,
    uses_facts,
)
from equipoise.evaluators.store import sql_literal

if TYPE_CHECKING:  # the public frame-returning helpers import it when called; a metrics pass never does
    import pandas as pd

# a statement of confidence: the word, up to 20 non-digit characters, a number, an optional '%'
CONFIDENCE_RE = r"(?i)\bconfidence\b[^0-9\n]{0,20}?([0-9]+(?:\.[0-9]+)?)\s*(%?)"
# hedging vocabulary (whole words, any case); two-word hedges allow any whitespace between
HEDGE_WORDS: tuple[str, ...] = (
    "maybe",
    "perhaps",
    "possibly",
    "probably",
    "likely",
    "unlikely",
    "might",
    "unsure",
    "uncertain",
    "seem",
    "seems",
    "seemingly",
    "apparently",
    "not sure",
    "not certain",
)
HEDGE_RE = r"(?i)\b(?:" + "|".join(w.replace(" ", r"\s+") for w in HEDGE_WORDS) + r")\b"

# numeric per-item columns of unc_scores (all may be summarised or normalised)
SCORE_COLUMNS: tuple[str, ...] = (
    "sample_consistency",
    "semantic_entropy",
    "pro",
    "option_entropy",
    "label_nll",
    "label_nll_raw",
    "avg_nll",
    "max_nll",
    "g_nll",
    "geo_mean_token_prob",
    "elicited_confidence",
    "elicited_uncertainty",
    "n_output_tokens",
    "n_words",
    "n_questions",
    "n_wait",
    "n_hedges",
)
# the columns that are uncertainties (higher = less sure): the default for unc_normalized
UNCERTAINTY_COLUMNS: tuple[str, ...] = tuple(
    c for c in SCORE_COLUMNS if c not in ("geo_mean_token_prob", "elicited_confidence", "n_words")
)
# seed 002's three behavioural features
DEFAULT_FEATURES: tuple[str, ...] = ("n_output_tokens", "n_questions", "n_wait")
FEATURE_COLUMNS: tuple[str, ...] = ("n_output_tokens", "n_words", "n_questions", "n_wait", "n_hedges")
COMBINERS: tuple[str, ...] = ("linear_sum", "logistic", "ridge")

_POOLS = {"item": "sc.item_id", "base": "sc.base_id"}
_SPLIT_KEYS = ("item_id", "base_id")


def _fraction(params: dict, name: str) -> float:
    value = float(params[name])
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value}")
    return value


def _columns(params: dict, name: str, allowed: Sequence[str]) -> list[str]:
    cols = params[name]
    cols = [cols] if isinstance(cols, str) else list(cols)
    bad = [c for c in cols if c not in allowed]
    if bad or not cols:
        raise ValueError(f"{name}: unknown or empty {bad or cols}; allowed: {', '.join(allowed)}")
    return cols


def _strata(by: Sequence[str], prefix: str = "") -> str:
    """The grouping columns other than run_id (always selected), comma-terminated."""
    cols = [b for b in by if b != "run_id"]
    return "".join(f"{prefix}{c}, " for c in cols)


def _by(by: Sequence[str]) -> str:
    return "".join(f"{c}, " for c in by)


def _order_by_key(by: Sequence[str]) -> str:
    """ORDER BY for per-item rows that start with the strata, run_id and item_id.

    (run_id, item_id) is unique, so these leading columns give the same order as ORDER BY ALL while
    the sort compares two or three keys instead of every one of some thirty columns.
    """
    n = len([b for b in by if b != "run_id"]) + 2
    return "ORDER BY " + ", ".join(str(i) for i in range(1, n + 1))


def scores_sql(by: Sequence[str], params: dict | None = None, ordered: bool = True) -> str:
    """The rendered unc_scores query (also the inner query of the other uncertainty metrics, which
    pass ``ordered=False``: an aggregate over the scores gains nothing from sorting them first)."""
    params = {**REGISTRY["unc_scores"].params, **(params or {})}
    pool = params["pool"]
    if pool not in _POOLS:
        raise ValueError(f"pool must be one of {sorted(_POOLS)}, got {pool!r}")
    by = _check_by(by)
    sql = render_sql(
        REGISTRY["unc_scores"],
        by,
        {
            "strata": _strata(by, "s0."),
            "pool_key": _POOLS[str(pool)],
            "conf_re": sql_literal(CONFIDENCE_RE),
            "hedge_re": sql_literal(HEDGE_RE),
        },
    )
    return sql + _order_by_key(by) + "\n" if ordered else sql


# 2**32 as a SQL double: 32 bits of md5 divided by it are a fraction in [0, 1)
_SPLIT_DIVISOR = "4294967296.0"


def split_fraction_sql(key: str) -> str:
    """An item's place in the md5 splits (held-out bounds, combiner training rows): the first 32
    bits of md5(key) as a fraction in [0, 1); a row is in the split when it lies below the split's
    fraction. ``key`` is a column name (``item_id`` or ``base_id``)."""
    return f"{_split_bits_sql(key)} / {_SPLIT_DIVISOR}"


def _split_bits_sql(key: str) -> str:
    """The first 32 bits of md5(key) as a UINTEGER: what the fact stores (4 bytes a row, not the
    fraction's 8); divided by ``_SPLIT_DIVISOR`` it is exactly split_fraction_sql(key)."""
    return f"('0x' || substr(md5({key}), 1, 8))::UBIGINT::UINTEGER"


# the columns facts_unc_scores_<pool> holds besides unc_scores' own: _split_bits_sql of each key
SPLIT_FACT_COLUMNS: dict[str, str] = {k: f"_split_{k}" for k in _SPLIT_KEYS}
# ... and the item's place in its run's items sorted by item_id (0, 1, ...)
ITEM_ORD_COLUMN = "_item_ord"


def fact_scores_sql(pool: str) -> str:
    """The query of the write-time fact ``facts_unc_scores_<pool>``: unc_scores with every stratum
    plus, per split key, the bits of the item's md5 split fraction (``SPLIT_FACT_COLUMNS``). The
    md5 of every item's key was about a tenth of unc_normalized's, unc_normalization_bounds' and
    unc_combiners' CPU each; it is a fact of the item's key, so the writer hashes it once. And
    ``ITEM_ORD_COLUMN``, the item's rank among its run's items by item_id: sorting on
    (run_id, that integer) gives the order of (run_id, item_id) without comparing item_id strings
    (unc_combiners' sort took about half the CPU of its query with the strings). Both depend on the
    run's own rows alone, so a run's facts can still be refreshed on their own."""
    splits = ", ".join(f"{_split_bits_sql(k)} AS {c}" for k, c in SPLIT_FACT_COLUMNS.items())
    ord_ = f"(row_number() OVER (PARTITION BY run_id ORDER BY item_id) - 1)::UINTEGER AS {ITEM_ORD_COLUMN}"
    # sorted after the window into unc_scores' published order for its default grouping (model,
    # run_id, item_id); facts.refresh writes the batches of runs in (model, run_id) order, so the
    # table as a whole is in that order and unc_scores can skip its sort (see _fact_in_order)
    inner = scores_sql(list(STRATA), {"pool": pool}, ordered=False)
    return f"SELECT *, {splits}, {ord_} FROM (\n{inner})\nORDER BY {', '.join(FACT_ORDER)}"


# the order of the rows facts_unc_scores_<pool> is written in: unc_scores' rows for its default
# grouping (the strata of default_by, run_id, item_id), so a plain scan of the fact is already sorted
FACT_ORDER: tuple[str, ...] = ("model", "run_id", "item_id")


def _fact_in_order(con: duckdb.DuckDBPyConnection, table: str, by: Sequence[str]) -> bool:
    """Whether a plain scan of the fact ``table`` returns its rows in the published order of
    ``by`` (``_order_by_key(by)``: strata, run_id, item_id), so unc_scores can copy them without
    sorting (the sort and the join that ranks the runs were about a third of its CPU at 1M
    predictions).

    Checked on the rows, not assumed from how they were written: an incremental refresh appends
    the changed runs at the end, and another grouping has another order. A scan of a table returns
    the rows in rowid order when ``preserve_insertion_order`` is on (DuckDB's default; with it off
    nothing is promised and the answer is False). The rows are in order exactly when the rowids
    of every (strata, run_id) pair are one contiguous range, those ranges follow each other from 0
    in the pairs' sorted order, and within a pair rowid - ``ITEM_ORD_COLUMN`` (the item's rank by
    item_id in its run, 0, 1, ...) is the range's start on every row. One grouped scan of three
    integer columns and the strata: about 0.02 s at 1M predictions against 0.25 s for the sort.
    Rows deleted but not yet vacuumed leave gaps in the rowids, which fail the test (a sort,
    never a wrong order)."""
    if not scans_in_insertion_order(con):
        return False
    keys = ", ".join([*(b for b in by if b != "run_id"), "run_id"])
    sql = f"""
        WITH p AS (
            SELECT {keys}, count(*) AS _n, min(rowid) AS _lo, max(rowid) AS _hi,
                   min(rowid - {ITEM_ORD_COLUMN}) AS _a, max(rowid - {ITEM_ORD_COLUMN}) AS _b
            FROM {table} GROUP BY ALL
        ),
        q AS (
            SELECT *, coalesce(sum(_n) OVER (ORDER BY {keys} ROWS BETWEEN UNBOUNDED PRECEDING
                                                               AND 1 PRECEDING), 0) AS _start
            FROM p
        )
        SELECT coalesce(bool_and(_lo = _start AND _hi - _lo + 1 = _n AND _a = _lo AND _b = _lo), false)
        FROM q"""
    return bool(con.execute(sql).fetchone()[0])


def _scores_source(
    con: duckdb.DuckDBPyConnection,
    by: Sequence[str],
    params: dict,
    ordered: bool = False,
    split_key: str | None = None,
    item_ord: bool = False,
) -> str:
    """The unc_scores query for ``by``: computed inline, or read from a per-connection cache.

    Six metrics start from the same per-item scores, which cost more than anything done after
    them. When the base relations are materialized (a read-only pass over many metrics, see
    ``registry.prepare``) the scores are computed once per pool with every stratum into a TEMP
    table, and each metric selects its own strata from it in the same column order, so results are
    identical to the inline query. With plain views (a connection that may also write) nothing is
    cached: the scores must follow the store. Sorted only when ``ordered`` (the published
    unc_scores rows), and not even then when the fact's rows are already in that order
    (``_fact_in_order``); the other metrics aggregate or sort their own output. With ``split_key``
    the rows end in one more column, ``_split``: ``split_fraction_sql(split_key)``, read from the
    fact when there is one, else computed here. With ``item_ord`` (after ``_split``) one more,
    ``_item_ord``: a key that sorts the items of a run as item_id does (the fact's integer rank,
    else item_id itself).
    """
    params = {**REGISTRY["unc_scores"].params, **(params or {})}
    by = _check_by(by)
    if split_key is not None and split_key not in _SPLIT_KEYS:
        raise ValueError(f"split_key must be one of {_SPLIT_KEYS}, got {split_key!r}")
    # the trailing columns, computed here; the fact's own columns replace them below where it has them
    split = None if split_key is None else f"{split_fraction_sql(split_key)} AS _split"
    ord_ = f"item_id AS {ITEM_ORD_COLUMN}" if item_ord else None
    if not _materialized(con):
        sql = scores_sql(by, params, ordered=False)
        tail = _tail(split, ord_)
        if tail:
            sql = f"SELECT *{tail} FROM (\n{sql})"
        return sql + _order_by_key(by) + "\n" if ordered else sql
    pool = str(params["pool"])
    scores_sql([], params)  # validates the pool before its name is used
    table = f"_unc_scores_cache_{pool}"
    all_by = [*STRATA]
    if uses_facts(con):
        table = f"main.facts_unc_scores_{pool}"  # computed by facts.refresh with the same query
    else:  # the pool is validated above, before the name is used
        cached_table(con, table, scores_sql(all_by, params, ordered=False))
    cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    extra = {*SPLIT_FACT_COLUMNS.values(), ITEM_ORD_COLUMN}
    fixed = [c for c in cols[len([b for b in all_by if b != "run_id"]) :] if c not in extra]
    if split_key is not None and SPLIT_FACT_COLUMNS[split_key] in cols:
        split = f"{SPLIT_FACT_COLUMNS[split_key]} / {_SPLIT_DIVISOR} AS _split"
    if item_ord and ITEM_ORD_COLUMN in cols:
        ord_ = ITEM_ORD_COLUMN
    select = f"SELECT {_strata(by)}{', '.join(fixed)}{_tail(split, ord_)} FROM {table}"
    if not ordered:
        return select
    if ITEM_ORD_COLUMN not in cols:
        return f"{select} {_order_by_key(by)}"
    if _fact_in_order(con, table, by):  # a plain scan is the published order
        return select
    return f"{select} {_ranked_runs_join(by, table)} ORDER BY _rk, {ITEM_ORD_COLUMN}"


def _fact_with_item_ord(con: duckdb.DuckDBPyConnection, params: dict) -> str | None:
    """The write-time fact ``_scores_source`` reads for ``params``' pool when it holds the integer
    ``ITEM_ORD_COLUMN``, else None (no facts, or a cache table that lacks it)."""
    if not uses_facts(con):  # facts in use imply fixed base relations (registry._materialized)
        return None
    pool = str({**REGISTRY["unc_scores"].params, **(params or {})}["pool"])
    scores_sql([], {"pool": pool})  # validates the pool before its name is used
    table = f"main.facts_unc_scores_{pool}"
    cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    return table if ITEM_ORD_COLUMN in cols else None


def _ranked_runs_join(by: Sequence[str], table: str, source: str | None = None) -> str:
    """A JOIN that gives every row of ``table`` (a per-item table with the strata, run_id and the
    fact's integer ``ITEM_ORD_COLUMN``) ``_rk``: the place of its (strata, run_id) pair among the
    table's distinct pairs in (strata, run_id) order. Sorting on (_rk, item rank) gives the order
    of ``_order_by_key(by)`` (strata, run_id, item_id; (run_id, item_id) is unique) on two
    integers, so the rows are the same and in the same order: comparing the strata and id strings
    was about a third of the sort's CPU, and the sort about a third of unc_scores' (1M
    predictions). NULL strata match, and rank last, as in the ORDER BY. ``table`` may also be the
    name of a relation over such a table's rows, with ``source`` the table the pairs are read from
    (any superset of the relation's pairs ranks them in the same order)."""
    keys = [*(b for b in by if b != "run_id"), "run_id"]
    names = ", ".join(keys)
    pairs = ", ".join(f"{c} AS _rk_{i}" for i, c in enumerate(keys))
    on = " AND ".join(
        f"{table}.{c} {'=' if c == 'run_id' else 'IS NOT DISTINCT FROM'} _runs._rk_{i}"
        for i, c in enumerate(keys)
    )
    return (
        f"JOIN (SELECT {pairs}, (row_number() OVER (ORDER BY {names}) - 1)::UBIGINT AS _rk "
        f"FROM (SELECT DISTINCT {names} FROM {source or table})) AS _runs ON {on}"
    )


def _source_mode(con: duckdb.DuckDBPyConnection) -> str:
    """How a CTE over the scores' source should be kept when several consumers read it: NOT
    MATERIALIZED when the source is a table (the fact or the connection's cache, see
    ``_scores_source``), since each consumer then scans only the columns it reads, which costs less
    than copying every row first; otherwise empty (DuckDB's choice), as the source is the whole
    unc_scores query, which must not run once per consumer."""
    return "NOT MATERIALIZED" if _materialized(con) else ""


def _tail(*columns: str | None) -> str:
    """The select-list items ``columns`` (None: left out), each after ', '."""
    return "".join(f", {c}" for c in columns if c is not None)


def _wrapped(
    con: duckdb.DuckDBPyConnection,
    name: str,
    by: Sequence[str],
    params: dict,
    split_key: str | None = None,
    item_ord: bool = False,
    source: str | None = None,
    **extra: str,
) -> str:
    """Metric ``name``'s SQL template filled in; ``source``: the scores' query when the caller has
    already built it (``_scores_source`` with no split key or item order), not built again."""
    text = (SQL_DIR / REGISTRY[name].sql).read_text(encoding="utf-8")
    if source is None:
        source = _scores_source(con, by, params, split_key=split_key, item_ord=item_ord)
    # every template gets the scores' source mode; those that do not name it ignore it
    return text.format(
        scores_sql=source,
        by=_by(by),
        part=_by(by),
        strata=_strata(by),
        source_mode=_source_mode(con),
        **extra,
    )


def _split_key(params: dict) -> str:
    key = params["split_key"]
    if key not in _SPLIT_KEYS:
        raise ValueError(f"split_key must be one of {_SPLIT_KEYS}, got {key!r}")
    return str(key)


def _upper_quantile(params: dict) -> float:
    q = float(params["upper_quantile"])
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"upper_quantile must lie in [0, 1], got {q}")
    return q


def _bound_fragments(params: dict) -> dict[str, str]:
    """What unc_normalized and unc_normalization_bounds share, rendered once so the two cannot
    drift apart: the held-out test (the md5 split fraction ``_split`` of the scores' source, see
    ``_scores_source``, below holdout_fraction) and the DOUBLE casts of the scores (the bounds
    themselves are ``_bounds_select``'s). The upper quantile is validated here too, so a bad one
    is refused whichever of the two metrics runs first."""
    cols = _columns(params, "scores", SCORE_COLUMNS)
    _upper_quantile(params)
    fraction = _fraction(params, "holdout_fraction")
    return {
        "in_holdout": f"_split < {fraction!r}",
        "score_casts": ", ".join(f"CAST({c} AS DOUBLE) AS {c}" for c in cols),
    }


def _bounds_select(by: Sequence[str], params: dict) -> str:
    """The bounds as a SELECT over the relation ``wide`` (per item: the grouping columns,
    ``in_holdout`` and the DOUBLE scores): one row per group of ``by`` with _n_rows (the group's
    items) and, per score, ``n__x, lo__x, hi__x``: the held-out rows' count, minimum and
    upper_quantile continuous quantile of the score. The held-out rows are aggregated under a WHERE
    and joined to the per-group counts (a group without held-out rows gets counts 0 and NULL
    bounds, as FILTERed aggregates would give): three FILTER clauses per score made the aggregate
    about four times the CPU at 1M predictions, each one selecting the held-out rows again for its
    own aggregate."""
    cols = _columns(params, "scores", SCORE_COLUMNS)
    q = _upper_quantile(params)
    held = ", ".join(
        f"count({c}) AS n__{c}, min({c}) AS lo__{c}, quantile_cont({c}, {q!r}) AS hi__{c}" for c in cols
    )
    out = ", ".join(f"coalesce(h.n__{c}, 0) AS n__{c}, h.lo__{c}, h.hi__{c}" for c in cols)
    on = " AND ".join(f"n.{c} IS NOT DISTINCT FROM h.{c}" for c in by) or "true"
    return (
        f"SELECT n.*, {out}\n"
        f"FROM (SELECT {_by(by)} count(*) AS _n_rows FROM wide GROUP BY ALL) AS n\n"
        f"LEFT JOIN (SELECT {_by(by)} {held} FROM wide WHERE in_holdout GROUP BY ALL) AS h ON {on}"
    )


def _bounds_query(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
    """One wide row per group of ``by``: _n_rows (the group's items) and, per score, the held-out
    count, minimum and upper quantile (``n__x, lo__x, hi__x``), as a query of its own. ``wide``
    has two consumers (the counts and the held-out aggregate); over a table each scans only what
    it reads (see ``_source_mode``)."""
    frag = _bound_fragments(params)
    mode = _source_mode(con)
    return (
        f"WITH sc AS {mode} (\n"
        f"{_scores_source(con, by, params, split_key=_split_key(params))}\n),\n"
        f"wide AS {mode} (SELECT {_strata(by)} run_id, {frag['in_holdout']} AS in_holdout, "
        f"{frag['score_casts']} FROM sc)\n"
        f"{_bounds_select(by, params)}"
    )


def _bounds_cache(
    con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict, create: bool
) -> str | None:
    """The TEMP table holding ``_bounds_query(by, params)`` on this connection, or None.

    unc_normalization_bounds and unc_normalized aggregate the same bounds. When the base relations
    are fixed (``registry.prepare(materialize=True)``, a read-only pass over many metrics) the
    first keeps them in a TEMP table (``create``) and the second reads them from it instead of
    aggregating again: the quantiles and minima of every score are about a quarter of
    unc_normalized's CPU. ``equipoise metrics`` runs metrics in name order, so the bounds come
    first; unc_normalized never creates the table, because aggregating inline from the per-item
    rows it reads anyway costs less than a separate pass. The key is a hash of the rendered query,
    which holds the grouping, the pool, the scores, the split and the quantile. With plain views
    (a connection that may also write) nothing is kept: the bounds must follow the store.
    """
    if not _materialized(con):
        return None
    sql = _bounds_query(con, by, params)
    table = "_unc_bounds_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
    if table not in temp_tables(con):
        if not create:
            return None
        con.execute(f"CREATE TEMP TABLE {table} AS {sql}")
    return table


def _normalized_sql(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
    cols = _columns(params, "scores", SCORE_COLUMNS)
    if by:
        on = " AND ".join(f"wide.{c} IS NOT DISTINCT FROM bounds.{c}" for c in by)
        bounds_join = f"JOIN bounds ON {on}"
    else:
        bounds_join = "CROSS JOIN bounds"
    normalized = ", ".join(
        f"CASE WHEN wide.{c} IS NULL OR hi__{c} IS NULL THEN NULL "
        f"WHEN hi__{c} > lo__{c} THEN greatest(0.0, least(1.0, (wide.{c} - lo__{c}) / (hi__{c} - lo__{c}))) "
        f"WHEN wide.{c} <= lo__{c} THEN 0.0 ELSE 1.0 END AS {c}"
        for c in cols
    )
    frag = _bound_fragments(params)
    cached = _bounds_cache(con, by, params, create=False)
    fact = _fact_with_item_ord(con, params)
    if fact:  # sorted on (pair rank, item rank): see _ranked_runs_join
        order_by = f"ORDER BY _runs._rk, wide.{ITEM_ORD_COLUMN}"
    else:  # (run_id, item_id) is unique per row: the same order as ORDER BY ALL
        order_by = "ORDER BY " + ", ".join(
            f"wide.{c}" for c in [*(b for b in by if b != "run_id"), "run_id", "item_id"]
        )
    return _wrapped(
        con,
        "unc_normalized",
        by,
        params,
        split_key=_split_key(params),
        item_ord=bool(fact),
        item_ord_column=f", {ITEM_ORD_COLUMN}" if fact else "",
        runs_join=_ranked_runs_join(by, "wide", fact) if fact else "",
        **frag,
        bounds=f"SELECT * FROM {cached}" if cached else _bounds_select(by, params),
        wide_mode="NOT MATERIALIZED" if cached else "MATERIALIZED",
        wide_strata=_strata(by, "wide."),
        normalized_columns=normalized,
        bounds_join=bounds_join,
        keep="true" if params["include_holdout"] else "NOT wide.in_holdout",
        order_by=order_by,
    )


def _normalization_bounds_sql(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
    cols = _columns(params, "scores", SCORE_COLUMNS)
    cached = _bounds_cache(con, by, params, create=True)
    return _wrapped(
        con,
        "unc_normalization_bounds",
        by,
        params,
        **_bound_fragments(params),
        bounds=f"SELECT * FROM {cached}" if cached else _bounds_query(con, by, params),
        unpivot_in=_unpivot_in(cols, ("n", "lo", "hi")),
    )


def _group_ids(by: Sequence[str], literal: _Groups | None = None) -> dict[str, str]:
    """Two CTE bodies that number a metric's groups: ``groups`` (the distinct values of the grouping
    columns with an integer ``_gid``) and ``keyed`` (every per-item row of ``sc`` with its ``_gid``,
    whether it is incorrect, and its scores). Sorting or hashing on one integer is several times
    cheaper than on the groups' strings; NULL group values match, as GROUP BY treats them.
    ``groups`` is MATERIALIZED: its numbering (row_number over a DISTINCT, in no set order) is
    read by ``keyed`` once per score and by the final join, and must be one numbering for all.

    ``literal``: the groups already read (``_read_groups``: each group's values, and the columns'
    types), numbered in that order: ``groups`` is then a VALUES list and ``keyed`` numbers each
    row by a CASE over those few groups instead of a hash join per score (about 0.05-0.06 s less
    of unc_auroc's CPU at 1M predictions with three groups)."""
    if not by:
        return {
            "groups": "groups AS (SELECT 0 AS _gid)",
            "keyed": "SELECT 0 AS _gid, NOT correct AS _incorrect, * FROM sc",
        }
    cols = ", ".join(by)
    if literal is not None:
        rows, types = literal

        def typed(v: object, c: str) -> str:
            assert v is None or isinstance(v, str | int), v  # _read_groups keeps strings and integers
            value = "NULL" if v is None else sql_literal(v) if isinstance(v, str) else str(v)
            return f"{value}::{types[c]}"

        values = ", ".join(
            "(" + ", ".join([*(typed(v, c) for v, c in zip(r, by, strict=True)), f"{k}::BIGINT"]) + ")"
            for k, r in enumerate(rows)
        )
        whens = " ".join(
            "WHEN "
            + " AND ".join(
                f"sc.{c} IS NULL" if v is None else f"sc.{c} = {typed(v, c)}"
                for v, c in zip(r, by, strict=True)
            )
            + f" THEN {k}::BIGINT"
            for k, r in enumerate(rows)
        )
        return {
            "groups": f"groups AS (SELECT * FROM (VALUES {values}) AS _g({cols}, _gid))",
            "keyed": f"SELECT CASE {whens} END AS _gid, NOT sc.correct AS _incorrect, sc.* FROM sc",
        }
    on = " AND ".join(f"sc.{c} IS NOT DISTINCT FROM gr.{c}" for c in by)
    return {
        "groups": f"groups AS MATERIALIZED (SELECT {cols}, (row_number() OVER () - 1)::BIGINT AS _gid "
        f"FROM (SELECT DISTINCT {cols} FROM sc))",
        "keyed": f"SELECT gr._gid, NOT sc.correct AS _incorrect, sc.* FROM sc JOIN groups gr ON {on}",
    }


# at most this many groups are numbered by a CASE in unc_auroc (see _group_ids); more use a join
_CASE_GROUPS = 8

# unc_auroc's groups read ahead (``_read_groups``): the values of each group, in the order they are
# numbered, and the grouping columns' types
_Groups = tuple[list[tuple[object, ...]], dict[str, str]]


def _read_groups(
    con: duckdb.DuckDBPyConnection, by: Sequence[str], source: str, n_scores: int
) -> tuple[int | None, _Groups | None]:
    """unc_auroc's groups read ahead, where the scores are a table (over plain views reading them
    would compute the whole unc_scores query once more: (None, None) there). Returns how many
    groups there are (None: more than a 2-byte partition key numbers, see ``_part_type``) and,
    when there are at most ``_CASE_GROUPS`` and every grouping column is a string or an integer,
    the groups for ``_group_ids`` to number by a CASE (else None). One DISTINCT of the grouping
    columns, limited to what either use needs: about 2 ms at 1M predictions."""
    if not _materialized(con):
        return None, None
    if not by:
        return 1, None
    cols = ", ".join(by)
    limit = max(_CASE_GROUPS, _SMALL_PARTS // n_scores)
    rows = con.execute(f"SELECT DISTINCT {cols} FROM ({source}) LIMIT {limit + 1}").fetchall()
    if len(rows) > limit:
        return None, None
    types = {str(r[0]): str(r[1]) for r in con.execute(f"DESCRIBE {source}").fetchall()}
    if len(rows) > _CASE_GROUPS or any(types[c] != "VARCHAR" and types[c] not in _INTEGER_TYPES for c in by):
        return len(rows), None
    return len(rows), (rows, {c: types[c] for c in by})


# scores that take few distinct values (counts, fractions of a handful of samples, parsed
# confidence statements): unc_auroc collapses their rows to counts per value instead of ranking
# them. Any score gives the same AUROC either way; the split only decides the cost.
DISCRETE_COLUMNS: tuple[str, ...] = (
    "sample_consistency",
    "semantic_entropy",
    "elicited_confidence",
    "elicited_uncertainty",
    *FEATURE_COLUMNS,
)


def _long_scores(
    cols: Sequence[str],
    positions: Sequence[int],
    n_scores: int,
    part_type: str = "UINTEGER",
    undefined_nan: bool = False,
) -> str:
    """One row per (item, score) of ``keyed`` for the scores ``cols`` at ``positions`` of the
    metric's score list: _part = _gid * n_scores + position, _incorrect, and the score as DOUBLE in
    _v (NaN read as NULL; with ``undefined_nan`` the other way round: NULL read as NaN, see
    ``sql/unc_auroc.sql``). An empty list gives no rows. _part is ``part_type``, an unsigned integer
    narrower than the BIGINT the arithmetic yields: the ranking sorts on (_part, _v), and a 4-byte
    key made that sort about 25% cheaper than 8 bytes (a value too large for the type raises an
    error rather than a wrong number; see ``_part_type`` for the 2-byte one).

    One SELECT of ``keyed`` per score under UNION ALL, each reading its own score column, rather
    than one SELECT that unnests a list of every score: the same rows, and neither consumer
    depends on their order (a count per value, or a ranking by a sort on the value, where rows of
    one value are peers), and unc_auroc took about 0.04 s (some 4%) less CPU at 1M
    predictions with one DuckDB thread (0.889-0.906 -> 0.850-0.876 s, back to back): building the
    lists and unnesting them cost more than scanning ``keyed`` once per score. Over plain views
    ``sc`` (the whole unc_scores query, referenced through ``keyed`` once per score) is still
    computed once: DuckDB materializes it (measured on a small store: the same CPU as before)."""
    if not cols:
        return (
            f"SELECT NULL::{part_type} AS _part, NULL::BOOLEAN AS _incorrect, NULL::DOUBLE AS _v WHERE false"
        )

    def value(c: str) -> str:
        x = f"CAST({c} AS DOUBLE)"
        return f"coalesce({x}, 'nan'::DOUBLE)" if undefined_nan else f"CASE WHEN NOT isnan({x}) THEN {x} END"

    # one line: the SQL templates quote their inputs inside comments
    return " UNION ALL ".join(
        f"SELECT (_gid * {n_scores} + {k})::{part_type} AS _part, _incorrect, {value(c)} AS _v FROM keyed"
        for c, k in zip(cols, positions, strict=True)
    )


# the largest number of (group, score) partitions unc_auroc's 2-byte partition key numbers
_SMALL_PARTS = 65536


def _part_type(n_groups: int | None, n_scores: int) -> str:
    """The type of unc_auroc's partition key _part for the continuous scores: USMALLINT when every
    (group, score) pair fits in it, else UINTEGER. The ranking sorts on (_part, _v) (one plain sort,
    or a partitioned window: ``_ranked_continuous``); with the 2-byte
    key that sort took about 0.06 s (some 7% of the metric) less CPU at 1M predictions with one
    DuckDB thread than with the 4-byte one, the same ranks. ``n_groups`` is known only where the
    scores are a table and few enough groups exist (``_read_groups``); None (plain views, where
    counting the groups would compute the whole unc_scores query once more, or too many groups)
    keeps the 4-byte key."""
    if n_groups is None:
        return "UINTEGER"
    return "USMALLINT" if n_groups * n_scores <= _SMALL_PARTS else "UINTEGER"


def _value_counts(long: str, name: str) -> str:
    """The CTEs of ``unc_value_counts.sql`` (Mann-Whitney counted per distinct value) over the rows
    of the query ``long`` (_part, _incorrect, _v), ending in the CTE ``name`` (per _part: n_items,
    n, n_incorrect, _twice_u); unc_auroc and the combiners' AUROC share them."""
    text = (SQL_DIR / "unc_value_counts.sql").read_text(encoding="utf-8")
    return text.format(long=long, name=name).strip()


def _ranked_continuous(con: duckdb.DuckDBPyConnection, long: str) -> str:
    """unc_auroc's CTEs that rank the continuous scores' rows ``long`` (_part, _incorrect, _v with
    undefined = NaN), ending in g_continuous: ``sql/unc_auroc_sorted.sql`` (one plain sort read in
    its order by window functions with an empty OVER) where a scan keeps insertion order
    (``scans_in_insertion_order``), else ``sql/unc_auroc_windowed.sql`` (a window partitioned by
    _part). The same integers either way; the sorted form took about 0.03-0.05 CPU s less of the
    query's 0.65-0.70 at 1M predictions with one DuckDB thread (see its comments)."""
    name = "unc_auroc_sorted.sql" if scans_in_insertion_order(con) else "unc_auroc_windowed.sql"
    text = (SQL_DIR / name).read_text(encoding="utf-8")
    return text.format(long_continuous=long).strip()


def _auroc_sql(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
    cols = _columns(params, "scores", UNCERTAINTY_COLUMNS)
    discrete = [k for k, c in enumerate(cols) if c in DISCRETE_COLUMNS]
    continuous = [k for k, c in enumerate(cols) if c not in DISCRETE_COLUMNS]
    source = _scores_source(con, by, params)
    n_groups, literal = _read_groups(con, by, source, len(cols))
    long_continuous = _long_scores(
        [cols[k] for k in continuous],
        continuous,
        len(cols),
        part_type=_part_type(n_groups, len(cols)),
        undefined_nan=True,
    )
    return _wrapped(
        con,
        "unc_auroc",
        by,
        params,
        source=source,
        n_scores=str(len(cols)),
        value_counts=_value_counts(
            _long_scores([cols[k] for k in discrete], discrete, len(cols)), "g_discrete"
        ),
        ranked=_ranked_continuous(con, long_continuous),
        score_names=", ".join(sql_literal(c) for c in cols),
        **_group_ids(by, literal),
    )


def _unpivot_in(cols: Sequence[str], prefixes: Sequence[str]) -> str:
    """The IN list of a multi-column UNPIVOT of wide per-score columns named ``<prefix>__<score>``
    (the score's own column for an empty prefix): ``(n__a, m__a) AS a, (n__b, m__b) AS b`` for
    prefixes (n, m)."""
    return ", ".join("(" + ", ".join(f"{p}__{c}" if p else c for p in prefixes) + f") AS {c}" for c in cols)


# bits of a score's largest finite |value| that unc_summary's fixed-point sums keep (see _exact_mean)
MEAN_BITS = 61


# DuckDB's integer types: a score of one of these is finite once cast to DOUBLE (see _exact_mean)
_INTEGER_TYPES = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)


def _scale_sql(largest: str) -> str:
    """The power of two that scales a score whose largest finite |value| is ``largest`` (> 0) below
    2**MEAN_BITS (``_exact_mean``); ``_literal_means`` computes the same scale from the same SQL,
    so the two forms give the same bits."""
    return f"pow(2.0, least(1000, {MEAN_BITS} - (floor(log2({largest})) + 1)))"


def _exact_mean(col: str, integer: bool = False) -> tuple[str, str]:
    """A deterministic mean of score ``col`` for unc_summary: (the select item of its scale, over all
    rows of ``sc``; the aggregate of its mean, per group).

    Why: ``avg()`` of doubles adds in the order DuckDB's threads deliver the rows, so the mean's
    last bits changed between runs of the same pass. Here each finite value is scaled by a power of
    two (exact) so that the column's largest finite |value| lies below 2**MEAN_BITS, rounded to a
    BIGINT and summed as integers, which is exact in any order; the sum is then divided once by the
    scale and once by the count. What rounding loses is at most 2**-(MEAN_BITS + 1) of that largest
    |value| per term (below the mean's last bit unless the group's mean is more than about 500
    times smaller than the column's largest finite |value|). A group holding inf or NaN gets
    ``avg()``: inf, -inf or NaN, the same in any order. Cost at 1M rows, 20 scores: about 0.17 s
    instead of 0.04 s (a value-sorted list was 0.6 s).

    ``integer``: the column is of an integer type, so every value cast to DOUBLE is finite: the
    finiteness test is left out and so is the ``avg()`` branch it could never take, the same
    numbers for less work (unc_summary's five count scores: about 0.02 s of its 0.21 s)."""
    x = f"CAST({col} AS DOUBLE)"
    finite = x if integer else f"CASE WHEN isfinite({x}) THEN {x} END"
    largest = f"max(abs({finite}))"
    scale = f"CASE WHEN {largest} > 0 THEN {_scale_sql(largest)} ELSE 1.0 END AS s__{col}"
    fixed = f"sum(({finite} * s__{col})::BIGINT)::DOUBLE / any_value(s__{col}) / count({col})"
    if integer:
        return scale, fixed
    return scale, f"CASE WHEN count({col}) > count({finite}) THEN avg({x}) ELSE {fixed} END"


def _literal_means(con: duckdb.DuckDBPyConnection, source: str, cols: Sequence[str]) -> list[str] | None:
    """unc_summary's mean aggregates with each score's scale (see ``_exact_mean``) read first by a
    query of its own and written into the SQL as a literal, or None when some score holds inf or
    NaN (the general form then keeps its finiteness tests).

    Why: the general form computes the scales in a CTE (one pass over the scores) and joins them to
    every row, and each aggregate tests each value for finiteness twice. Here a query of plain
    max and min finds the largest |value| of every score: when that is finite (or NULL: no value),
    no value is inf or NaN, so it is the largest finite |value| and the scale is the same power of
    two, computed by the same SQL expression (``_scale_sql``) and written back exactly (``repr``
    of a double round-trips); the aggregates need no finiteness test and no ``avg()`` branch. The
    same bits as the general form; unc_summary's CPU 0.20 -> 0.12 s at 1M predictions with one
    DuckDB thread. Only where the scores are a table (see ``_summary_sql``).

    A score of an integer type whose rows times largest |value| stay below 2**53 is summed as it
    is: ``sum(x)::DOUBLE / count(x)``. The same bits: every |x| and the group's sum are then below
    2**53, so the scaled form's terms x * scale are exact, their exact integer sum is scale * sum(x)
    with no more significant bits than sum(x), and its conversion to DOUBLE and the division by the
    power of two are exact, leaving the one rounding of sum(x) / count(x) both forms make. The casts
    of every value to DOUBLE and of every scaled product back to BIGINT are work saved: the query
    took 0.083 -> 0.065-0.066 CPU s at 1M predictions with one DuckDB thread (five count scores;
    min of 7 runs in one process)."""
    # the largest |value| from the plain max and min of the column, cast after aggregating: the
    # same double as max(abs(CAST(x AS DOUBLE))) (the cast is monotone), and DuckDB answers a bare
    # min / max of a table's column far faster (about 3 ms for all 17 scores at 1M predictions
    # against 0.04 s with the cast and abs inside the aggregate). A NaN is the largest value in
    # DuckDB, so a column holding NaN, inf or -inf gives a non-finite largest |value|.
    extremes = [f"greatest(CAST(max({c}) AS DOUBLE), -CAST(min({c}) AS DOUBLE)) AS m__{c}" for c in cols]
    items = []
    for c in cols:
        items += [f"m__{c}", f"CASE WHEN m__{c} > 0 THEN {_scale_sql(f'm__{c}')} ELSE 1.0 END AS s__{c}"]
    row = con.execute(
        f"SELECT {', '.join(items)}, _n FROM (SELECT {', '.join(extremes)}, count(*) AS _n FROM ({source}))"
    ).fetchone()
    assert row is not None
    n_rows = int(row[-1])
    types = {str(r[0]): str(r[1]) for r in con.execute(f"DESCRIBE {source}").fetchall()}
    means = []
    for k, c in enumerate(cols):
        largest, scale = row[2 * k], float(row[2 * k + 1])
        if largest is not None and not np.isfinite(largest):
            return None
        if types.get(c) in _INTEGER_TYPES and (largest is None or n_rows * int(largest) < 2**53):
            means.append(f"sum({c})::DOUBLE / count({c})")  # exact, see the docstring
            continue
        s = f"'{scale!r}'::DOUBLE"
        means.append(f"sum((CAST({c} AS DOUBLE) * {s})::BIGINT)::DOUBLE / {s} / count({c})")
    return means


def _summary_sql(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
    """unc_summary's query. Where the scores are a table (the fact or the connection's cache) the
    scales of the fixed-point means are read first and written in as literals
    (``_literal_means``); over plain views that would compute the whole unc_scores query twice,
    so the scales stay a CTE of the query (``_exact_mean``)."""
    cols = _columns(params, "scores", SCORE_COLUMNS)
    source = _scores_source(con, by, params)
    literal = _literal_means(con, source, cols) if _materialized(con) else None
    if literal is not None:
        means = literal
        scale_cte, scale_join = "", ""
    else:
        # the scores' types, from the relation the metric reads (DESCRIBE binds it, computes nothing)
        types = {str(r[0]): str(r[1]) for r in con.execute(f"DESCRIBE {source}").fetchall()}
        exact = [_exact_mean(c, integer=types.get(c) in _INTEGER_TYPES) for c in cols]
        means = [m for _, m in exact]
        scale_cte = ",\nscale AS (\n    SELECT " + ", ".join(sc for sc, _ in exact) + " FROM sc\n)"
        scale_join = " CROSS JOIN scale"
    aggregates = ", ".join(f"count({c}) AS n__{c}, {m} AS m__{c}" for c, m in zip(cols, means, strict=True))
    return _wrapped(
        con,
        "unc_summary",
        by,
        params,
        source=source,
        aggregates=aggregates,
        scale_cte=scale_cte,
        scale_join=scale_join,
        unpivot_in=_unpivot_in(cols, ("n", "m")),
    )


# 2**32: an item's rank in its run (a UINTEGER) fits below it, so rank of the run * 2**32 + the
# item's rank is a BIGINT that sorts as the pair (overflow, past 2**31 runs, raises an error)
_KEY_SHIFT = 4294967296


def _features_with_gid(
    con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict, slim: bool = False
) -> columns.Columns:
    """``combiner_features`` plus ``_gid``, as columns: the group's number, 0.. in the sorted
    order of its values (the order of pandas ``groupby(sort=True)``, NULLs last). ``slim``: only
    what fitting reads (_gid, label, split, completeness, scaled features), sorted by _gid then
    (run_id, item_id): no strings cross into Python, not even the grouping values repeated on every
    row (their conversion was about a tenth of unc_combiners' CPU); ``_group_keys`` gives those
    once per group.

    Over the write-time fact the slim rows are not sorted by DuckDB: they carry one BIGINT
    ``_key`` = (the rank of their (group, run) pair) * 2**32 + (the item's rank in its run, the
    fact's ``ITEM_ORD_COLUMN``), unique per row and in the order of (_gid, run_id, item_id), and
    numpy orders them by it. DuckDB's sort moved every row's eight columns to sort two keys (about
    half the CPU of this query at 1M predictions); numpy sorts the keys alone and then gathers the
    columns: about 0.025 s less of unc_combiners' 0.32 s, the same rows in the same order."""
    feats = _columns(params, "features", FEATURE_COLUMNS)
    prepare(con)
    scaled = [
        f"CASE WHEN hi__{f} > lo__{f} THEN ({f} - lo__{f}) / (hi__{f} - lo__{f}) "
        f"WHEN {f} IS NOT NULL AND lo__{f} IS NOT NULL THEN 0.0 END AS {f}_scaled"
        for f in feats
    ]
    bounds_on = " AND ".join(
        [*(f"base.{c} IS NOT DISTINCT FROM bounds.{c}" for c in by), "base.complete = bounds.complete"]
    )
    groups_on = " AND ".join(f"base.{c} IS NOT DISTINCT FROM groups.{c}" for c in by) or "true"
    # slim: the (group, run) pairs, numbered in (_gid, run_id) order (see unc_combiner_features.sql)
    run_by = [c for c in by if c != "run_id"]
    pairs = ", ".join([*run_by, "run_id"])
    runs = (
        ",\nruns AS (\n"
        "    SELECT r.*, groups._gid,\n"
        "           (row_number() OVER (ORDER BY groups._gid, r.run_id) - 1)::BIGINT AS _rk\n"
        f"    FROM (SELECT DISTINCT {pairs} FROM base) r\n"
        "    JOIN groups ON "
        + (" AND ".join(f"r.{c} IS NOT DISTINCT FROM groups.{c}" for c in by) or "true")
        + "\n)"
    )
    runs_on = " AND ".join(
        [*(f"base.{c} IS NOT DISTINCT FROM runs.{c}" for c in run_by), "base.run_id = runs.run_id"]
    )
    # slim over the fact (integer item ranks): the rows come unsorted with one integer key, sorted
    # in numpy below, for which see the docstring
    keyed = slim and _fact_with_item_ord(con, params) is not None
    if keyed:
        order_by = ""
    elif slim:
        order_by = f"ORDER BY runs._rk, base.{ITEM_ORD_COLUMN}"
    else:
        order_by = "ORDER BY " + ", ".join(
            [*(f"base.{c}" for c in by if c != "run_id"), "base.run_id", "base.item_id"]
        )
    sql = _wrapped(
        con,
        "unc_combiners",
        by,
        params,
        split_key=_split_key(params),
        item_ord=slim,
        item_ord_column=f", {ITEM_ORD_COLUMN}" if slim else "",
        train_fraction=repr(_fraction(params, "train_fraction")),
        feature_casts=", ".join(f"CAST({f} AS DOUBLE) AS {f}" for f in feats),
        complete=" AND ".join(f"{f} IS NOT NULL" for f in feats),
        bound_aggregates=", ".join(f"min({f}) AS lo__{f}, max({f}) AS hi__{f}" for f in feats),
        group_order=("ORDER BY " + ", ".join(by)) if by else "",
        bounds_on=bounds_on,
        runs=runs if slim else "",
        groups_join=f"runs ON {runs_on}" if slim else f"groups ON {groups_on}",
        select=(
            ", ".join(
                [
                    *([f"runs._rk * {_KEY_SHIFT} + base.{ITEM_ORD_COLUMN} AS _key"] if keyed else []),
                    "runs._gid",
                    "base.incorrect",
                    "base.is_train",
                    "base.complete",
                ]
            )
            + ", "
            + ", ".join(scaled)
            if slim
            else "base.*, " + ", ".join(scaled) + ", groups._gid"
        ),
        order_by=order_by,
    )
    got = columns.fetch(con, sql)
    if keyed:
        order = np.argsort(np.asarray(got.pop("_key"), dtype=np.int64), kind="stable")
        got = columns.take(got, order)
    return got


def _group_keys(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> list[tuple]:
    """The values of the grouping columns of each group, in _gid order: the distinct values sorted
    as unc_combiner_features.sql numbers them (``row_number() OVER (ORDER BY by)``, NULLs last)."""
    if not by:
        return [()]
    cols = ", ".join(by)
    source = _scores_source(con, by, params)
    sql = f"SELECT {cols} FROM (SELECT DISTINCT {cols} FROM ({source})) ORDER BY {cols}"
    return [tuple(r) for r in con.execute(sql).fetchall()]


def combiner_features(
    con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict | None = None
) -> pd.DataFrame:
    """Per-item feature matrix (raw and train-scaled ``<feature>_scaled``), label and split."""
    params = {**REGISTRY["unc_combiners"].params, **(params or {})}
    got = _features_with_gid(con, _check_by(by), params)
    return columns.to_frame(con, {k: v for k, v in got.items() if k != "_gid"})


# ----------------------------------------------------------------------------- combiner fits
#
# The two regressions are written out here rather than taken from scikit-learn: importing it (and
# the scipy it pulls in) for two fits on three columns raised the peak RSS of a process running
# unc_combiners on the 1M-prediction store from 398 to 464 MiB, memory better given to DuckDB's
# cap. Both fits are defined by their objective, not by a solver.

# Newton's method stops once its full step moves no coefficient by more than this, relative to the
# largest coefficient (at least 1): from there the error is the step's square, far below 1e-12
_NEWTON_STEP_TOL = 1e-12
# ... or after this many steps (a well-posed fit needs fewer than ten; the cap is a guard only)
_NEWTON_MAX_STEPS = 100
# a step is accepted when it lowers the objective by at least this share of the decrease the
# quadratic model promises (the Armijo condition), halving the step until it does ...
_ARMIJO_SHARE = 1e-4
# ... down to this fraction of the Newton step; a direction that no such step improves means the
# objective's changes are already below its rounding, so the fit stops there
_MIN_STEP_SCALE = 2.0**-40
# changes of the objective this small relative to its value are rounding, not a rise: near the
# optimum the promised decrease (about the coefficients' error squared) is far below float noise
_OBJECTIVE_NOISE = 1e-12


def _softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|)), exact to rounding for any z."""
    return np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))


def _sigmoid(z: np.ndarray, e: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-z)) without overflow: exp(-|z|) lies in (0, 1], so neither branch overflows
    and neither loses the small tail to a 1 - p cancellation. ``e``: exp(-|z|), where the caller
    has computed it already (the Newton step needs it for the weights too)."""
    if e is None:
        e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _logistic_objective(
    theta: np.ndarray, x1: np.ndarray, sign: np.ndarray, c: float
) -> tuple[float, np.ndarray]:
    """The penalised negative log-likelihood at ``theta`` (coefficients, then the intercept) and
    each row's margin ``m`` = -z for label 1, z for label 0 (z = x1 @ theta).

    A row's log-loss is log(1 + exp(z)) - y z, which is softplus(m) for both labels: a sum of
    non-negative terms, so it is computed without cancellation however confident the fit."""
    m = sign * (x1 @ theta)
    w = theta[:-1]
    return 0.5 * float(w @ w) + c * float(_softplus(m).sum()), m


def _fit_logistic(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression with an unpenalised intercept, fitted to its optimum.

    Minimises 0.5 ||w||^2 + C * sum_i log(1 + exp(-s_i (x_i . w + b))) with s_i = +1 for label 1
    and -1 for label 0: the objective scikit-learn's ``LogisticRegression(C=C)`` states. For finite
    C > 0 and both labels present it is strictly convex and grows without bound in every direction
    (the penalty bounds w, and a runaway intercept mislabels one class), so it has exactly one
    minimum, separable data included. The fit returns that minimum to the precision of the
    arithmetic (Newton's method stops once its step is below 1e-12), not a solver's stopping point:
    scikit-learn's default lbfgs (tol 1e-4) stopped 1.5e-4 to 4e-4 away from it in the coefficients
    at 1M predictions, which made the published coefficients depend on the solver's tolerance.

    Newton's method (iteratively reweighted least squares): the gradient is (w, 0) + C X1'(p - y)
    and the Hessian diag(1, .., 1, 0) + C X1' diag(p (1 - p)) X1 with X1 = [x, 1], both exact; each
    step solves the Hessian system and is shortened by halving until the objective falls (Armijo),
    so no step can overshoot into divergence. Starts from w = 0 and the intercept-only optimum
    b = logit(mean y), where Newton's method converges in a handful of steps."""
    yb = np.asarray(y, dtype=bool)
    rate = float(yb.mean()) if len(yb) else 0.0
    if not 0.0 < rate < 1.0:
        raise ValueError("logistic combiner: the training rows need both labels")
    n, d = x.shape
    x1 = np.empty((n, d + 1))
    x1[:, :d] = x
    x1[:, d] = 1.0
    sign = np.where(yb, -1.0, 1.0)  # the margin's sign: m = sign * z
    penalty = np.ones(d + 1)
    penalty[d] = 0.0  # the intercept is not penalised
    theta = np.zeros(d + 1)
    theta[d] = np.log(rate) - np.log1p(-rate)
    f, m = _logistic_objective(theta, x1, sign, c)
    for _ in range(_NEWTON_MAX_STEPS):
        # p - y = sign * sigmoid(m) for both labels, and p (1 - p) = e / (1 + e)^2 with e = exp(-|z|)
        e = np.exp(-np.abs(m))
        residual = sign * _sigmoid(m, e)
        weight = e / (1.0 + e) ** 2
        grad = penalty * theta + c * (x1.T @ residual)
        hess = np.diag(penalty) + c * ((x1 * weight[:, None]).T @ x1)
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:  # a singular Hessian (every weight underflowed): least squares
            step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        if not np.all(np.isfinite(step)):
            raise FloatingPointError("logistic combiner: the Newton step is not finite")
        if np.max(np.abs(step)) <= _NEWTON_STEP_TOL * max(1.0, float(np.max(np.abs(theta)))):
            return (theta - step)[:d], float((theta - step)[d])
        decrease = float(grad @ step)  # the model's promised decrease per unit step (>= 0)
        scale = 1.0
        while scale >= _MIN_STEP_SCALE:
            trial = theta - scale * step
            f_new, m_new = _logistic_objective(trial, x1, sign, c)
            if f_new <= f - _ARMIJO_SHARE * scale * decrease + _OBJECTIVE_NOISE * abs(f):
                break
            scale /= 2.0
        else:  # no step lowers the objective beyond rounding: as close as the arithmetic allows
            break
        theta, f, m = trial, f_new, m_new
    else:
        warnings.warn(
            f"logistic combiner: Newton's method did not converge in {_NEWTON_MAX_STEPS} steps",
            RuntimeWarning,
            stacklevel=2,
        )
    return theta[:d], float(theta[d])


def _fit_ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Ridge regression with an unpenalised intercept, in closed form.

    Minimises ||y - x w - b||^2 + alpha ||w||^2 (scikit-learn's ``Ridge(alpha=alpha)``). Setting
    the intercept's derivative to zero gives b = ybar - xbar . w, and substituting it leaves the
    centred problem (Xc' Xc + alpha I) w = Xc' yc, one small symmetric system (one row and column per
    feature). Centring first, rather than appending a column of ones, keeps the intercept out of
    the penalty and keeps the system well conditioned when a feature's mean is far from 0."""
    yf = np.asarray(y, dtype=float)
    x_mean = x.mean(axis=0)
    y_mean = float(yf.mean())
    xc = x - x_mean
    if alpha == 0.0:
        # plain least squares: with collinear features the normal equations are singular (or nearly,
        # and np.linalg.solve then returns one of many minimisers), so take the least-norm minimiser
        # from the centred design itself
        w = np.linalg.lstsq(xc, yf - y_mean, rcond=None)[0]
        return w, y_mean - float(x_mean @ w)
    gram = xc.T @ xc
    gram[np.diag_indices_from(gram)] += alpha  # alpha > 0: positive definite, one solution
    w = np.linalg.solve(gram, xc.T @ (yf - y_mean))
    return w, y_mean - float(x_mean @ w)


def _regularization(params: dict) -> tuple[float, float]:
    """The combiners' C (logistic) and alpha (ridge), checked: C must be finite and > 0 (C = 0
    leaves no data term, and an infinite C removes the penalty, without which separable training
    rows have no optimum); alpha finite and >= 0 (0 is least squares)."""
    c, alpha = float(params["C"]), float(params["alpha"])
    if not (np.isfinite(c) and c > 0.0):
        raise ValueError(f"C must be finite and > 0, got {c}")
    if not (np.isfinite(alpha) and alpha >= 0.0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    return c, alpha


def _fit_combiners(
    con: duckdb.DuckDBPyConnection, by: list[str], params: dict, slim: bool = False
) -> tuple[columns.Columns, np.ndarray, dict[str, np.ndarray], list[dict[str, object]]]:
    """Fit the combiners per group; returns (the complete rows as columns, sorted by group then
    run_id and item_id; their group numbers; each combiner's prediction per row; one fit summary
    per group, in group order, with its ``_gid``). Groups are split by their integer number, not
    by grouping on the strata strings. ``slim`` rows carry no run_id / item_id (see
    ``_features_with_gid``)."""
    from threadpoolctl import threadpool_limits

    c, alpha = _regularization(params)
    feats = _columns(params, "features", FEATURE_COLUMNS)
    xcols = [f"{f}_scaled" for f in feats]
    df = _features_with_gid(con, by, params, slim)
    n_all = columns.n_rows(df)
    gid_all = np.asarray(df["_gid"], dtype=np.int64)
    complete = np.asarray(df["complete"], dtype=bool)
    # group totals over every row (complete or not); the rows within a group stay in SQL order
    n_groups = int(gid_all.max()) + 1 if n_all else 0
    n_rows = np.bincount(gid_all, minlength=n_groups)
    n_missing = np.bincount(gid_all[~complete], minlength=n_groups)
    if slim:
        keys = _group_keys(con, by, params)
    else:  # the key values of each group's first row
        first = np.full(n_groups, -1)
        first[gid_all[::-1]] = np.arange(n_all)[::-1]
        key_values = [columns.values(df[b]) for b in by]
        keys = [tuple(vals[first[k]] for vals in key_values) for k in range(n_groups)]
    rows = np.flatnonzero(complete)
    g_df = columns.take(df, rows[np.argsort(gid_all[rows], kind="stable")])
    gid = np.asarray(g_df["_gid"], dtype=np.int64)
    n_complete = len(gid)
    x = (
        np.column_stack([np.asarray(g_df[c], dtype=float) for c in xcols])
        if xcols
        else np.empty((n_complete, 0))
    )
    y = np.asarray(g_df["incorrect"], dtype=bool).astype(int)
    train = np.asarray(g_df["is_train"], dtype=bool)
    bounds = np.searchsorted(gid, np.arange(n_groups + 1))
    preds = {
        "linear_sum": x.sum(axis=1),
        "logistic": np.full(n_complete, np.nan),
        "ridge": np.full(n_complete, np.nan),
    }
    fits: list[dict[str, object]] = []
    # One BLAS thread for the fits and predictions: with a few features every BLAS call is a small,
    # memory-bound product, and OpenBLAS's other threads only spin waiting for work. Measured at 1M
    # predictions (three groups of about 160k rows): this metric's CPU 0.60 s -> 0.36 s, and a
    # synthetic group of 1.6M rows x 3 features fitted in less wall time with about 40% less CPU.
    # The fits are the same up to the last bits of BLAS sums (the order of a threaded reduction).
    # The limit is process-wide and meant for the main thread: a metrics pass in lanes sets it
    # around all its lanes (pass_runner.run_pass), so a lane's thread leaves it alone.
    in_main = threading.current_thread() is threading.main_thread()
    with threadpool_limits(limits=1, user_api="blas") if in_main else contextlib.nullcontext():
        for k in range(n_groups):
            sl = slice(bounds[k], bounds[k + 1])
            xg, yg, tr = x[sl], y[sl], train[sl]
            y_tr = yg[tr]
            fit: dict[str, object] = dict(zip(by, keys[k], strict=True))
            fit.update(n_rows=int(n_rows[k]), n_missing_features=int(n_missing[k]))
            fit.update(n_train=int(tr.sum()), n_train_incorrect=int(y_tr.sum()))
            fit.update(n_test=int((~tr).sum()), n_test_incorrect=int(yg.sum() - y_tr.sum()))
            if len(y_tr) and 0 < y_tr.sum() < len(y_tr):
                w, b = _fit_logistic(xg[tr], y_tr, c)
                preds["logistic"][sl] = _sigmoid(xg @ w + b)
                fit.update({f"logistic_{f}": float(v) for f, v in zip(feats, w, strict=True)})
                fit["logistic_bias"] = b
            if len(y_tr):
                w, b = _fit_ridge(xg[tr], y_tr, alpha)
                preds["ridge"][sl] = xg @ w + b
                fit.update({f"ridge_{f}": float(v) for f, v in zip(feats, w, strict=True)})
                fit["ridge_bias"] = b
            fit["_gid"] = k
            fits.append(fit)
    return g_df, gid, preds, fits


def combiner_predictions(
    con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fit the combiners per group on the training split; return (per-item predictions in long form,
    per-group fit summary with coefficients).

    linear_sum = sum of the train-scaled features (seed 002 D.1 "Linear Sum"); logistic =
    P(incorrect) from the L2-penalised logistic regression that ``LogisticRegression(C=C)`` defines
    (``_fit_logistic``); ridge = the ridge regression ``Ridge(alpha=alpha)`` defines (``_fit_ridge``),
    fitted to the 0/1 incorrect label (seed 002's Calibration Regression fits correctness and uses
    1 - f(x); with an intercept the two are the same function). Both read the train-scaled features,
    leave the intercept unpenalised and are fitted to convergence, so the coefficients do not depend
    on a solver's stopping tolerance (scikit-learn's default logistic solver stops about 1e-4 short).
    """
    import pandas as pd

    params = {**REGISTRY["unc_combiners"].params, **(params or {})}
    by = _check_by(by)
    g_cols, gid, preds, fits = _fit_combiners(con, by, params)
    g_df = columns.to_frame(con, g_cols)
    keep = list(dict.fromkeys([*by, "run_id", "item_id", "incorrect", "is_train"]))
    cols = [*keep, "combiner", "u"]
    parts = []
    bounds = np.searchsorted(gid, np.arange(len(fits) + 1))  # rows are sorted by group
    for k in range(len(fits)):  # per group, the three combiners in turn (the long layout)
        rows = slice(bounds[k], bounds[k + 1])
        for name in COMBINERS:
            p = g_df.iloc[rows][keep].copy()
            p["combiner"] = name
            p["u"] = preds[name][rows]
            parts.append(p)
    pred = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    return pred[cols], pd.DataFrame(fits).drop(columns="_gid", errors="ignore")


def _combiners(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    """Per group: fit summary and coefficients, then test-split AUROC of each combiner (SQL over the
    test rows' group numbers, labels and the three predictions; no long frame is built)."""
    by = _check_by(by)
    g_df, gid, preds, fits = _fit_combiners(con, by, params, slim=True)
    test = ~np.asarray(g_df["is_train"], dtype=bool)
    table = {
        "_gid": gid[test],
        "incorrect": np.asarray(g_df["incorrect"], dtype=bool)[test],
        **{name: preds[name][test] for name in COMBINERS},
    }
    text = (SQL_DIR / "unc_combiner_auroc.sql").read_text(encoding="utf-8")
    n = len(COMBINERS)
    # one SELECT per combiner under UNION ALL (as uncertainty._long_scores does for unc_auroc), not
    # an unnest of a list of the three: the same rows, for about 0.01 CPU s less at 1M predictions
    long = " UNION ALL ".join(
        f"SELECT _gid * {n} + {k} AS _part, incorrect AS _incorrect, "
        f"CASE WHEN NOT isnan({name}) THEN {name} END AS _v FROM _unc_combiner_preds"
        for k, name in enumerate(COMBINERS)
    )
    con.register("_unc_combiner_preds", table)
    try:
        sql = text.format(
            n_combiners=n,
            combiner_list=", ".join(COMBINERS),
            value_counts=_value_counts(long, "g"),
            auroc_columns=", ".join(
                f"max(auroc) FILTER (WHERE _k = {i}) AS auroc_{c}" for i, c in enumerate(COMBINERS)
            ),
        )
        auc = columns.fetch(con, sql)
    finally:
        con.unregister("_unc_combiner_preds")
    if not fits:  # no rows: the AUROC columns alone (one row of NULLs when there is no grouping)
        return {f"auroc_{c}": np.full(0 if by else 1, np.nan) for c in COMBINERS}
    # each group's fit summary, then its AUROCs (NaN where the test split gave none)
    out = {k: v for k, v in _records(fits).items() if k != "_gid"}
    at = {int(g): i for i, g in enumerate(np.asarray(auc["_gid"], dtype=np.int64))}
    rows = np.array([at.get(int(f["_gid"]), -1) for f in fits], dtype=np.int64)
    for name, col in auc.items():
        if name != "_gid":
            vals = np.asarray(col, dtype=float)
            out[name] = np.where(rows >= 0, vals[np.maximum(rows, 0)] if len(vals) else np.nan, np.nan)
    return out


def _records(rows: list[dict[str, object]]) -> columns.Columns:
    """Rows of named values as columns, as a pandas frame of them would type them: columns in order
    of first appearance, a missing value NULL; all-integer columns int64 (float64 with NaN where a
    value is missing), numeric ones float64, booleans bool (masked where missing), the rest text."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    out: columns.Columns = {}
    for name in names:
        vals = [r.get(name) for r in rows]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, (bool, np.bool_)) for v in present):
            out[name] = columns.where_valid(
                np.array([bool(v) for v in vals]), np.array([v is not None for v in vals])
            )
        elif present and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in present):
            out[name] = (
                np.array(vals, dtype=np.int64)
                if len(present) == len(vals)
                else np.array([np.nan if v is None else v for v in vals], dtype=float)
            )
        elif present and all(isinstance(v, (int, float, np.integer, np.floating)) for v in present):
            out[name] = np.array([np.nan if v is None else v for v in vals], dtype=float)
        else:
            out[name] = np.array(vals, dtype=object)
    return out


def embedding_scores(
    con: duckdb.DuckDBPyConnection,
    embed: Callable[[list[str]], np.ndarray],
    by: Sequence[str] = ("model",),
    pool: str = "item",
    normalize: bool = True,
) -> pd.DataFrame:
    """EigenEmbed and RDS per (run_id, item_id) with a caller's sentence encoder.

    ``embed`` maps a list of texts to an (n, d) array. Each distinct output text is embedded once
    (the one Python step; an encoder is not SQL); with ``normalize`` the vectors are put on the unit
    sphere, as the RDS authors do. The geometry is SQL over the pool of samples (``pool`` as in
    unc_scores): eigen_embed = trace of the covariance with 1/N = mean squared Euclidean distance to
    the centroid (seed 004 eq. 5 with external embeddings); rds = sum of L1 distances to the centroid
    (seed 004 eq. 6, the L1 norm of the RDS paper). Not the authors' code's EigenEmbed, which takes the
    mean log10 eigenvalue of a regularised N x N sample covariance.
    """
    if pool not in _POOLS:
        raise ValueError(f"pool must be one of {sorted(_POOLS)}, got {pool!r}")
    by = _check_by(by)
    prepare(con)
    texts = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT raw_output FROM scored WHERE outcome <> 'error' ORDER BY 1"
        ).fetchall()
    ]
    vecs = np.asarray(embed(texts), dtype=float) if texts else np.zeros((0, 1))
    if vecs.ndim != 2 or vecs.shape[0] != len(texts):
        raise ValueError(f"embed returned shape {vecs.shape} for {len(texts)} texts; expected (n, d)")
    if normalize and len(texts):
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = np.divide(vecs, norms, out=np.zeros_like(vecs), where=norms > 0)
    n, d = vecs.shape
    table = {
        "text": np.repeat(np.array(texts, dtype=object), d) if n else np.array([], dtype=object),
        "d": np.tile(np.arange(d, dtype=np.int32), n),
        "v": vecs.ravel(),
    }
    text = (SQL_DIR / "unc_embedding.sql").read_text(encoding="utf-8")
    con.register("_unc_embeddings", table)
    try:
        return con.execute(text.format(strata=_strata(by, "s."), pool_key=_POOLS[pool])).df()
    finally:
        con.unregister("_unc_embeddings")


# unc_normalized's parameters; unc_normalization_bounds takes the same but include_holdout
_NORMALIZATION_PARAMS: dict[str, object] = {
    "pool": "item",
    "scores": UNCERTAINTY_COLUMNS,
    "holdout_fraction": 0.3,
    "upper_quantile": 0.99,
    "split_key": "item_id",
    "include_holdout": False,
}

# Lane groups (``Metric.lane_group``): over the store's fact tables, the only pass-wide cache these
# metrics share is the normalisation bounds (``_bounds_cache``: unc_normalization_bounds builds it,
# unc_normalized reads it); each of the others reads the write-time fact alone, so a metrics pass
# in lanes may run it beside any other metric.
register(
    Metric(
        name="unc_scores",
        description="per-item uncertainty scores: Label NLL, ANLL, Max NLL, G-NLL, geometric-mean token "
        "probability, option entropy, SC, SE and PRO over option-identity clusters, elicited confidence, "
        "reasoning-trace features (one row per run x item)",
        sql="unc_scores.sql",
        needs=("predictions", "option_scores"),
        default_by=("model",),
        params={"pool": "item"},
        sql_fn=lambda con, by, params: _scores_source(con, by, params, ordered=True),
        parquet_dictionary_limit=PER_ITEM_DICTIONARY_LIMIT,
        lane_group="unc_scores",
    )
)
register(
    Metric(
        name="unc_normalized",
        description="uncertainty scores min-max normalised per group: lower = min, upper = 99th "
        "percentile on a held-out md5 split, clipped to [0, 1] (one row per run x item, one column "
        "per score; bounds in unc_normalization_bounds)",
        sql="unc_normalized.sql",
        needs=("predictions", "option_scores"),
        default_by=("model",),
        params=_NORMALIZATION_PARAMS,
        sql_fn=_normalized_sql,
        parquet_dictionary_limit=PER_ITEM_DICTIONARY_LIMIT,
        lane_group="unc_bounds",
    )
)
register(
    Metric(
        name="unc_normalization_bounds",
        description="the bounds unc_normalized scales by: per group and score the held-out count, "
        "lower (min) and upper (99th percentile) bound",
        sql="unc_normalization_bounds.sql",
        needs=("predictions", "option_scores"),
        default_by=("model",),
        params={k: v for k, v in _NORMALIZATION_PARAMS.items() if k != "include_holdout"},
        sql_fn=_normalization_bounds_sql,
        lane_group="unc_bounds",
    )
)
register(
    Metric(
        name="unc_combiners",
        description="reasoning-trace features combined by linear sum, logistic and ridge regression "
        "(trained on an md5 split) into one uncertainty; test-split AUROC for incorrect answers",
        sql="unc_combiner_features.sql",
        needs=("predictions",),
        default_by=("model",),
        params={
            "pool": "item",
            "features": DEFAULT_FEATURES,
            "train_fraction": 0.4,
            "split_key": "item_id",
            "C": 1.0,
            "alpha": 1.0,
        },
        compute_fn=_combiners,
        lane_group="unc_combiners",
    )
)
register(
    Metric(
        name="unc_auroc",
        description="AUROC of every uncertainty score for detecting incorrect sample-0 answers "
        "(rank-sum, ties averaged; undefined scores counted, not ranked)",
        sql="unc_auroc.sql",
        needs=("predictions", "option_scores"),
        default_by=("model",),
        params={"pool": "item", "scores": UNCERTAINTY_COLUMNS},
        sql_fn=_auroc_sql,
        lane_group="unc_auroc",
    )
)
register(
    Metric(
        name="unc_summary",
        description="mean of every uncertainty score per group, with how many items define it",
        sql="unc_summary.sql",
        needs=("predictions", "option_scores"),
        default_by=("model",),
        params={"pool": "item", "scores": SCORE_COLUMNS},
        sql_fn=_summary_sql,
        lane_group="unc_summary",
    )
)
