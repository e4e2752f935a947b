"""Calibration, discrimination and selective-prediction metrics of a confidence score (seed 002
sections 4.3 and 5.2: AUROC, ECE with 10 bins, Brier score; seed 004 sections 3.3-3.4).

Every metric is SQL over the view ``cal_samples`` (``sql/cal_samples.sql``): one row per prediction
sample of ``scored``, with

- ``confidence`` (param ``confidence``):

  - ``'chosen_prob'`` (default): the probability of the parsed option in ``option_probs`` (softmax over
    the item's scored options; read from the per-sample fact ``sample_probs``), i.e. the model's
    probability for its own answer. With greedy decoding and every option scored this is the maximum
    option probability;
  - ``'target_prob'``: the probability of the target option;
  - ``'token_mean'``: ``exp(token_logprob_mean)``, the geometric mean of the output tokens'
    probabilities;

- ``correct`` = ``scored.correct`` (the parsed label is the target label);
- ``cal_status``: ``'unparsed'`` (no parsed option: unparseable output, error, or a label that is not
  an option of the item; there is no prediction to judge), ``'no_confidence'`` (a parsed option but no
  usable confidence: the option was not scored, no token log-probabilities, or a value NULL, NaN or
  outside [0, 1]) or ``'used'``. The same rule holds for every choice of ``confidence`` (an
  unparsed row is excluded even where a target probability exists), so the populations of all
  confidences and metrics are comparable.

Excluded rows are never dropped silently: every metric reports ``n_total``, ``n`` (used),
``n_excluded`` and, where per group, ``n_unparsed`` and ``n_no_confidence``.

Param ``samples``: ``'all'`` (default; every sample is one prediction) or ``'first'`` (sample 0 only,
the greedy answer when the run decoded greedily). Param ``n_bins`` (default 10, seed 002 4.3 /
seed 004 3.4 following Rivera et al.) for ``ece`` and ``reliability``.

Metrics (definitions in each SQL file's header):

- ``auroc``: rank-sum (Mann-Whitney) AUROC with average ranks for ties, correct = positive class;
  NULL with one class.
- ``ece``: equal-width bins over [0, 1]; bin b holds b/B <= c < (b+1)/B, the last bin is closed, so
  confidence exactly 1.0 is in the last bin (seed 002's public code drops it) and 0.0 in the first;
  ECE = sum_b (n_b / N) |acc_b - conf_b|; also MCE, accuracy, mean confidence.
- ``reliability``: per-bin rows (bin, lower, upper, n, mean_confidence, accuracy, gap) for all B bins.
- ``brier``: mean (confidence - 1[correct])^2.
- ``brier_multiclass``: mean over fully scored samples of sum_o (p_o - 1[o = target])^2, with the
  share of samples that are fully scored (``coverage``).
- ``risk_coverage``: one step per distinct confidence (ties accepted together), accepting the
  ``n_accepted`` rows with confidence >= the threshold: coverage = n_accepted / N, risk = their errors
  / n_accepted.
- ``aurc`` / ``prr``: discrete AURC = mean over k = 1..N of risk(k) (ties: expectation over a random
  order inside the tie block), AURC_random = error rate (exact), AURC_oracle = (E - C (H_N - H_C)) / N,
  PRR = (AURC_random - AURC) / (AURC_random - AURC_oracle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import duckdb

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
    register,
    render_sql,
    scans_in_insertion_order,
    temp_tables,
    uses_facts,
)

# confidence name -> expression over a row `sc` of `scored_probs` (`scored` with the per-sample facts
# of sample_probs as columns, sql/scored_probs.sql), so the chosen / target option's probability is
# read, not searched for among the per-option rows of option_probs)
CONFIDENCES: dict[str, str] = {
    "chosen_prob": "sc.chosen_prob",
    "target_prob": "sc.target_prob",
    "token_mean": "exp(sc.token_logprob_mean)",
}
SAMPLES: dict[str, str] = {"all": "true", "first": "sc.sample_index = 0"}
DEFAULT_PARAMS: dict[str, object] = {"confidence": "chosen_prob", "samples": "all", "n_bins": 10}


def bin_sql(expr: str, n_bins: int) -> str:
    """SQL for the 0-based bin of ``expr`` in ``n_bins`` equal-width bins over [0, 1].

    Bin b is b/B <= c < (b+1)/B with the edges b/B as doubles (correctly rounded divisions), the last
    bin closed (c = 1.0 -> B-1), c = 0.0 -> 0. ``floor(c * B)`` alone can be one off next to an edge
    (c * B rounds), so it is corrected by one comparison with each neighbouring edge.
    """
    f = f"floor(({expr}) * {n_bins})::BIGINT"
    return (
        f"least({n_bins} - 1, greatest(0, {f} - (({expr}) < {f} / {n_bins})::INT "
        f"+ (({expr}) >= ({f} + 1) / {n_bins})::INT))"
    )


def _params(params: dict) -> dict[str, object]:
    p = {**DEFAULT_PARAMS, **params}
    if p["confidence"] not in CONFIDENCES:
        raise ValueError(f"confidence must be one of {sorted(CONFIDENCES)}, got {p['confidence']!r}")
    if p["samples"] not in SAMPLES:
        raise ValueError(f"samples must be one of {sorted(SAMPLES)}, got {p['samples']!r}")
    n_bins = p["n_bins"]
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    return p


def samples_sql(params: dict | None = None) -> str:
    """The rendered ``CREATE TEMP VIEW cal_samples`` statement."""
    p = _params(params or {})
    text = (SQL_DIR / "cal_samples.sql").read_text(encoding="utf-8")
    return text.format(conf_expr=CONFIDENCES[str(p["confidence"])], sample_filter=SAMPLES[str(p["samples"])])


# the columns of cal_samples any calibration metric reads (besides the strata). Not the sample's key
# (run_id, item_id, sample_index): brier_multiclass reads its per-sample facts (n_scored, brier_mc)
# from cal_samples, which has them as columns of scored_probs, so no metric joins on the key, and the cache
# holds no per-row strings but the strata: the metrics test the booleans `used` and `unparsed`, not the
# cal_status string they define (sql/cal_samples.sql)
_CACHED_COLUMNS = ("n_options", "n_scored", "brier_mc", "correct", "unparsed", "used", "confidence")


def _cache_key(p: dict[str, object], by: Sequence[str]) -> str:
    """Name suffix of a per-connection cache: confidence and samples (both checked by _params) and
    a hash of the grouping (its names are checked against STRATA by the caller)."""
    return f"{p['confidence']}_{p['samples']}_" + hashlib.sha256("\x1f".join(by).encode()).hexdigest()[:16]


def prepare_samples(
    con: duckdb.DuckDBPyConnection, params: dict | None = None, by: Sequence[str] | None = None
) -> None:
    """Create the ``cal_samples`` view (the base views must exist: ``registry.prepare``).

    Why a cache: eight metrics read ``cal_samples``; as a plain view each of them paid its scan
    of ``scored_probs`` again (without current facts that relation is a hash join of the whole
    ``scored`` relation with ``sample_probs`` on a key of two strings; with them, a column of the
    fact table ``facts_scored``, written once per store). When the base relations are
    fixed for the connection (``registry.prepare(con, materialize=True)``: a read-only pass over
    many metrics) the view's rows are computed once per (confidence, samples, by) into a narrow
    TEMP table, the strata of ``by`` (default: all) and the columns the metrics read, not the raw
    output text or strata no metric of this grouping reads (copying those strings cost as much as
    the join), and ``cal_samples`` selects from it. A connection with live views (it may also
    write) keeps the plain view, which always follows the store. So does a connection that reads
    the store's current facts: there ``scored_probs`` is the fact table ``facts_scored`` itself, so
    the view is a scan of its few columns the metric reads, as fast as a scan of the copy (measured
    at 1M predictions), and filling the copy was pure cost (about 0.1 s and its memory).
    """
    p = _params(params or {})
    if not _materialized(con) or uses_facts(con):
        con.execute(samples_sql(p))
        return
    strata = list(dict.fromkeys(STRATA if by is None else _check_by(by)))
    cols = ", ".join([*(c for c in strata if c not in _CACHED_COLUMNS), *_CACHED_COLUMNS])
    _view_of_cache(
        con,
        "cal_samples",
        f"_cal_samples_{_cache_key(p, strata)}",
        lambda src: samples_sql(p).replace("TEMP VIEW cal_samples", f"TEMP VIEW {src}", 1),
        cols,
    )


def _view_of_cache(
    con: duckdb.DuckDBPyConnection, view: str, table: str, create_src: Callable[[str], str], cols: str = "*"
) -> None:
    """Point TEMP view ``view`` at TEMP table ``table``, filling the table on first use from the
    view that ``create_src(name)`` creates under ``name`` (``cols`` of it)."""
    if table not in temp_tables(con):
        src = f"{table}_src"
        con.execute(create_src(src))
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT {cols} FROM {src}")
        con.execute(f"DROP VIEW {src}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {table}")


def _prepare_step(
    con: duckdb.DuckDBPyConnection, step: Metric, p: dict, by: Sequence[str], tag: str, values: dict
) -> None:
    """Create the view ``step.name`` (``cal_blocks`` or ``cal_bins``) over ``cal_samples`` grouped by
    ``by`` (``p`` and ``by`` already checked): on a connection with fixed base relations a view of
    the TEMP table ``_{step.name}_{tag}{_cache_key}``, computed once, otherwise a plain view.
    """
    prepare_samples(con, p, by)
    if not _materialized(con):
        con.execute(render_sql(step, by, {**values, "view": step.name}))
        return
    _view_of_cache(
        con,
        step.name,
        f"_{step.name}_{tag}{_cache_key(p, by)}",
        lambda src: render_sql(step, by, {**values, "view": src}),
    )


# not a registered metric: a shared first step, rendered like one (by, group_by, by_list)
_BLOCKS = Metric(name="cal_blocks", description="tie blocks of cal_samples", sql="cal_blocks.sql")
_BLOCK_METRICS = ("auroc", "aurc", "prr", "risk_coverage")  # their SQL reads cal_blocks
# the same blocks from a sort and a streaming scan into TEMP tables, on a connection with fixed
# base relations
_BLOCKS_SORTED = Metric(
    name="cal_blocks_sorted", description="tie blocks by one sort", sql="cal_blocks_sorted.sql"
)
# the last step of both: the blocks' rows with their strata
_BLOCKS_OUT = Metric(name="cal_blocks_out", description="tie blocks with strata", sql="cal_blocks_out.sql")


def _blocks_values(by: Sequence[str], blocks: str, groups: str) -> dict[str, str]:
    """The values that ``cal_blocks.sql`` and ``cal_blocks_sorted.sql`` take for grouping ``by``
    (checked): how a row matches its group (NULL-safe, a NULL stratum is a group too) and the final
    SELECT of the blocks ``blocks`` with the groups ``groups`` (``cal_blocks_out.sql``)."""
    return {
        "by_match": " AND ".join(f"s.{c} IS NOT DISTINCT FROM gk.{c}" for c in by) or "true",
        "blocks_out": render_sql(_BLOCKS_OUT, by, {"blocks": blocks, "groups": groups}),
    }


def prepare_blocks(con: duckdb.DuckDBPyConnection, params: dict, by: Sequence[str]) -> None:
    """Create the ``cal_blocks`` view over ``cal_samples`` grouped by ``by``.

    Four metrics start with the same tie blocks in confidence order; on a connection with fixed
    base relations (see ``prepare_samples``) they are computed once per (confidence, samples, by)
    into TEMP tables by ``sql/cal_blocks_sorted.sql`` (one plain sort into a narrow table, then a
    streaming scan of it in that order: about a fifth less CPU than the partitioned window at 1M
    predictions, same rows), and ``cal_blocks`` is a view of them. That needs a table scan to
    return the rows in insertion order (``preserve_insertion_order``, DuckDB's default); without
    it, and on a connection with live views, the blocks are ``sql/cal_blocks.sql`` (a window
    partitioned by group): cached into a TEMP table where the relations are fixed, else a view
    over the live ``cal_samples``.
    """
    p = _params(params)
    by = _check_by(by)
    if not _materialized(con) or not scans_in_insertion_order(con):
        _prepare_step(con, _BLOCKS, p, by, "", _blocks_values(by, "blocks", "gk"))
        return
    prepare_samples(con, p, by)
    # its own prefix: the windowed path's cache of the same key holds other columns
    table = f"_cal_blocks_sorted_{_cache_key(p, by)}"
    values = _blocks_values(by, table, f"{table}_groups")
    if table not in temp_tables(con):  # else filled by an earlier metric of this key
        names = {"blocks": table, "groups": f"{table}_groups", "rows": f"{table}_rows"}
        con.execute(render_sql(_BLOCKS_SORTED, by, {**values, **names}))
    con.execute(f"CREATE OR REPLACE TEMP VIEW cal_blocks AS\n{values['blocks_out']}")


# not a registered metric either: the per-bin step of ece, reliability and brier
_BINS = Metric(name="cal_bins", description="per-bin sums of cal_samples", sql="cal_bins.sql")
_BIN_METRICS = ("ece", "reliability", "brier")  # their SQL reads cal_bins


def prepare_bins(con: duckdb.DuckDBPyConnection, params: dict, by: Sequence[str]) -> None:
    """Create the ``cal_bins`` view (``sql/cal_bins.sql``) over ``cal_samples`` grouped by ``by``.

    ece and reliability bin every row of a group the same way, and brier adds up the bins' exact
    fixed-point sums (see cal_brier.sql); on a connection with fixed base
    relations (see ``prepare_samples``) the bins are computed once per (confidence, samples, by,
    n_bins) into a TEMP table of a few rows per group, otherwise it stays a view.
    """
    p = _params(params)
    n_bins = int(p["n_bins"])  # type: ignore[call-overload]
    values = {"bin_expr": bin_sql("confidence", n_bins), "n_bins": n_bins}
    _prepare_step(con, _BINS, p, _check_by(by), f"{n_bins}_", values)


def _sql_of(name: str) -> Callable[[duckdb.DuckDBPyConnection, Sequence[str], dict], str]:
    def sql(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> str:
        p = _params(params)
        if name in _BLOCK_METRICS:
            prepare_blocks(con, p, by)  # also prepares cal_samples
        elif name in _BIN_METRICS:
            prepare_bins(con, p, by)  # also prepares cal_samples
        else:
            prepare_samples(con, p, by)
        return render_sql(REGISTRY[name], by, {**p, "block_counts": _BLOCK_COUNTS})

    return sql


def _runner(
    name: str, kept: Sequence[str]
) -> Callable[[duckdb.DuckDBPyConnection, Sequence[str], dict], columns.Columns]:
    """For metrics that share one query and keep some of its columns (aurc, prr: one row per group).

    On a connection with fixed base relations the shared query's rows (one per group) are kept in
    a TEMP table per (confidence, samples, by), like cal_blocks, so the second of aurc / prr reads
    them instead of aggregating every tie block again; elsewhere the query runs each time.
    """
    sql = _sql_of(name)

    def run(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
        query = sql(con, by, params)
        if _materialized(con):
            table = cached_table(con, f"_cal_selective_{_cache_key(_params(params), _check_by(by))}", query)
            query = f"SELECT * FROM {table} ORDER BY ALL"
        got = columns.fetch(con, query)
        return {c: got[c] for c in [*by, *kept]}

    return run


_NEEDS = ("predictions", "option_scores")
_COUNTS = ("n_total", "n", "n_excluded", "n_unparsed", "n_no_confidence")
# the _COUNTS of a group from its cal_blocks rows (n_b rows each), one definition for every metric
# that aggregates blocks ({block_counts} in cal_auroc.sql and cal_selective.sql)
_BLOCK_COUNTS = """coalesce(sum(n_b), 0)::BIGINT AS n_total,
           coalesce(sum(n_b) FILTER (WHERE used), 0)::BIGINT AS n,
           coalesce(sum(n_b) FILTER (WHERE NOT used), 0)::BIGINT AS n_excluded,
           coalesce(sum(n_b) FILTER (WHERE unparsed), 0)::BIGINT AS n_unparsed,
           coalesce(sum(n_b) FILTER (WHERE NOT used AND NOT unparsed), 0)::BIGINT AS n_no_confidence"""


def _metric(
    name: str,
    sql: str,
    description: str,
    columns: Sequence[str] | None = None,
    parquet_dictionary_limit: int | None = None,
) -> None:
    register(
        Metric(
            name=name,
            description=description,
            sql=sql,
            needs=_NEEDS,
            default_by=("model",),
            params=dict(DEFAULT_PARAMS),
            sql_fn=_sql_of(name) if columns is None else None,
            compute_fn=_runner(name, columns) if columns is not None else None,
            parquet_dictionary_limit=parquet_dictionary_limit,
        )
    )


_metric(
    "auroc",
    "cal_auroc.sql",
    "AUROC of the confidence for separating correct from incorrect predictions (rank-sum, average "
    "ranks for ties; NULL with one class)",
)
_metric(
    "ece",
    "cal_ece.sql",
    "expected calibration error over n_bins equal-width bins of [0, 1] (1.0 in the last bin), with MCE, "
    "accuracy and mean confidence",
)
_metric(
    "reliability",
    "cal_reliability.sql",
    "reliability-diagram rows: per bin lower, upper, n, mean confidence, accuracy, gap",
)
_metric("brier", "cal_brier.sql", "binary Brier score of the confidence against correctness")
_metric(
    "brier_multiclass",
    "cal_brier_multiclass.sql",
    "multi-class Brier score of the option softmax (sum over options), over samples with every option "
    "scored; coverage = share of such samples",
)
_metric(
    "risk_coverage",
    "cal_risk_coverage.sql",
    "risk-coverage curve: one step per distinct confidence, coverage = n_accepted/N, risk = error rate "
    "of the accepted",
    # one row per distinct confidence (931k rows at 1M predictions), its threshold, counts,
    # coverage and risk nearly all distinct: about 0.05 CPU s less to write at 1M (one thread)
    parquet_dictionary_limit=PER_ITEM_DICTIONARY_LIMIT,
)
_metric(
    "aurc",
    "cal_selective.sql",
    "area under the risk-coverage curve (mean of risk@k, ties averaged) with its random (error rate) "
    "and oracle baselines and the excess AURC",
    columns=(*_COUNTS, "n_errors", "error_rate", "aurc", "aurc_random", "aurc_oracle", "e_aurc"),
)
_metric(
    "prr",
    "cal_selective.sql",
    "prediction-rejection ratio (AURC_random - AURC) / (AURC_random - AURC_oracle)",
    columns=(*_COUNTS, "n_errors", "error_rate", "aurc", "aurc_random", "aurc_oracle", "prr"),
)
