"""Per-prediction facts: the base relations every metric reads, computed once and kept in the store.

Why: a metrics pass spends most of its time joining predictions to runs, items and options and
taking the option softmax (``scored`` and ``option_probs``, see ``sql/base_views.sql``), and then
computing the per-item uncertainty scores (``sql/unc_scores.sql``) that six metrics share. Those
are facts of the stored rows, not of a metric, so a writer computes them once, in one vectorized
DuckDB pass, into ordinary tables of the store (:func:`refresh`):

- ``facts_scored``            = the ``scored_probs`` relation (``sql/scored_probs.sql``: one row per
  prediction sample, the ``scored`` relation plus the columns of the ``sample_probs`` relation
  (``sql/sample_probs.sql``: the sample's chosen- and target-option probability, scored-option
  count, multi-class Brier term and the conformal LAC / APS score of every option and of the
  target), so that the calibration and conformal metrics read them without a join on the sample's
  key, and ``item_code``, the item_id's rank among the items (``_item_codes_sql``), the integer key
  of conformal's option mask; readers get ``scored`` as this table without those columns, and
  ``sample_probs`` as its rows with option scores and those columns (``registry.read_facts``);
- ``facts_option_probs``      = the ``option_probs`` relation (one row per scored option);
- ``facts_unc_scores_<pool>`` = the per-item uncertainty scores with every stratum, per pool, and
  each item's md5 split bits and rank in its run (``uncertainty.fact_scores_sql``);
- on the first sample's row of each run x item in ``facts_scored``, the pool of its samples that
  conformal_sampling scores with pool 'item' (``registry.POOL_FACT_COLUMNS``, from
  ``sql/sampling_pools.sql``: sample counts, target, hit, majority vote and every option's sampling
  score; NULL on the other rows), so that the metric reads one row per pool instead of grouping
  every sample, and, that row being the pool's unit of the option mask where the pool has a sample
  0, joins the mask by the row's rowid as LAC does (``conformal._query``).

Every fact row belongs to one run and depends only on that run's rows (its ``runs`` row, its
predictions and option scores) and on the shared tables (``datasets``, ``items``, ``options``):
the views join per run, and the uncertainty pools never cross runs. So a write that adds or
changes a few runs needs only those runs' facts (:func:`refresh` is incremental): each run's
source rows have a fingerprint (``facts_runs``), and only runs whose fingerprint changed, appeared
or vanished are deleted and recomputed. A change to the shared tables or to the fact definitions
recomputes everything.

A read-only metrics pass (``registry.prepare(con, materialize=True)``) then reads them through
views instead of recomputing them, but only when they are current: :func:`fingerprint` hashes the
fact definitions (the SQL text and the package's regular expressions) together with a row count
and an order-independent sum of row hashes of every source table, and the facts are used only when
the fingerprint stored with them (``store_meta`` key ``facts_fingerprint``) equals the store's
fingerprint now. Any write that changes a source table (through this package or plain SQL) changes
the fingerprint, and the metrics fall back to computing the relations for the connection, so a
stale fact can never reach a result. The fingerprint is one scan of the source tables
(:func:`source_sums`), the floor any metrics pass pays anyway: once per ``equipoise metrics``,
whose cache key and facts check share it, and not at all where the cache's memo of the sums holds
(``cache.source_sums``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import duckdb

from equipoise.evaluators.store import DERIVED_COLUMNS, memory_capped, scalar, sql_literal

# the option scores are columns of ``predictions`` (store schema v3): hashing its rows covers them
SOURCE_TABLES: tuple[str, ...] = ("datasets", "items", "options", "runs", "predictions")
# tables whose rows each belong to one run (their facts can be refreshed run by run) ...
RUN_TABLES: tuple[str, ...] = ("runs", "predictions")
# ... and the tables every run reads (a change here recomputes every fact)
SHARED_TABLES: tuple[str, ...] = ("datasets", "items", "options")
SHARED_KEY = "facts_shared_fingerprint"
RUNS_TABLE = "facts_runs"  # run_id -> fingerprint of that run's source rows when its facts were made
POOLS: tuple[str, ...] = ("item", "base")
FACT_TABLES: tuple[str, ...] = (
    "facts_scored",
    "facts_option_probs",
    *(f"facts_unc_scores_{p}" for p in POOLS),
)
# fact tables of older formats, dropped by a full refresh (7: the pools moved into facts_scored;
# 8: the per-sample facts are only columns of facts_scored)
OBSOLETE_TABLES: tuple[str, ...] = ("facts_sampling_pools", "facts_sample_probs")
META_KEY = "facts_fingerprint"
# Predictions per batch of a refresh: runs are computed in batches of about this many predictions
# (whole runs, in (model, run_id) order, see _batches; a larger run is a batch alone). Why:
# computed in one statement, the joins, window functions and new tables of every run are in
# memory at once, and a 10M-prediction store's refresh peaked at 19 GiB; a fact row depends only
# on its own run (module docstring), so batches give the same rows with a working set of one
# batch. Stores up to this size take one pass.
# The price is CPU: 46.5 instead of 38 CPU s at 1M (2 shared cores under load), per-batch joins
# against the shared tables; a larger batch costs less CPU and more memory (2M in one pass does
# not fit REFRESH_MEMORY_LIMIT).
BATCH_PREDICTIONS = 500_000
# DuckDB memory_limit while refreshing (a lower limit of the connection is kept). Why: without it
# the buffer pool keeps every block the refresh reads and writes (the facts are as large as the
# source tables), up to DuckDB's default of 80% of RAM; with it, clean blocks are evicted and what
# does not fit spills to <store>.tmp. 2 GiB holds a batch's working set with room to spare
# (about 1.5 GiB measured at 500k predictions), so the limit bounds the peak without spilling much.
REFRESH_MEMORY_LIMIT = 2 * 2**30
# bump when the meaning of a fact changes in a way the SQL text does not show
# 2: facts_scored holds the per-sample columns of scored_probs; 3: facts_unc_scores_<pool> hold the
# md5 split bits and the item's rank in its run; 4: every sum of doubles in the uncertainty scores
# (option_entropy, semantic_entropy, pro and its per-sequence mean) adds a value-sorted list, so
# the facts are the same bits whatever the threads and batches (the last bits change once); 5:
# facts_scored holds the conformal LAC / APS scores of its sample and the integer item code. Those
# score lists are then stored twice: facts_sample_probs keeps its copy, which no reader of the facts
# uses (the conformal metrics read facts_scored), about a tenth of the store at 1M predictions (745
# -> 823 MiB); format 8 dropped it; 6: facts_sampling_pools holds the integer
# item code too (conformal_sampling joins its pools to the option mask by run_id and that code, not
# by the item_id string); 7: the pools of facts_sampling_pools are columns of facts_scored, on each
# pool's first sample row (that table is dropped), so they join the option mask by rowid; 8:
# facts_sample_probs is no longer stored. No metric read it (a pass over a 1M store whose copy of
# it was emptied wrote the same bytes for all 30 metrics, benchmarks/RESULTS.md stop 31), yet it
# was 84.5 MiB of the store's 519 MiB at 1M predictions; each refresh batch now holds it as a TEMP
# table while it fills facts_scored, and readers get sample_probs from facts_scored; 9: store
# schema v3 keeps the option scores on the prediction rows (``option_scores`` is a view of them), so
# the fingerprints hash them as part of ``predictions`` and no longer hash the view
FACTS_FORMAT = 9


def _definitions() -> str:
    """Everything the facts are computed from besides the rows: SQL files and regexes."""
    from equipoise.evaluators.metrics import conformal, uncertainty
    from equipoise.evaluators.metrics.registry import SQL_DIR

    texts = [str(FACTS_FORMAT), uncertainty.CONFIDENCE_RE, uncertainty.HEDGE_RE]
    texts += [uncertainty.fact_scores_sql(p) for p in POOLS]
    files = ("base_views.sql", "sample_probs.sql", "scored_probs.sql", "unc_scores.sql")
    texts += [(SQL_DIR / f).read_text(encoding="utf-8") for f in files]
    texts.append(conformal.sampling_pools_sql())
    texts.append(conformal.pool_facts_sql())
    return "\x1e".join(texts)


def _main_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT temporary"
    ).fetchall()
    return {r[0] for r in rows}


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """The columns a table's fingerprint hashes: all but those derived from other tables."""
    derived = DERIVED_COLUMNS.get(table, ())
    return ", ".join(
        f'"{r[0]}"' for r in con.execute(f"DESCRIBE main.{table}").fetchall() if r[0] not in derived
    )


def source_sums(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Per source table, its row count and the sum of its rows' hashes (DuckDB ``hash`` over every
    column) as ``'count:sum'``: one query, one scan of each table. What every fingerprint is made
    of; ``cache.source_sums`` keeps them beside the store, so a reader can skip the scan."""
    parts = [
        f"(SELECT count(*)::VARCHAR || ':' || coalesce(sum(hash({_columns(con, t)})), 0)::VARCHAR "
        f"FROM main.{t})"
        for t in SOURCE_TABLES
    ]
    row = con.execute("SELECT " + ", ".join(parts)).fetchone()
    assert row is not None
    return dict(zip(SOURCE_TABLES, (str(v) for v in row), strict=True))


def _digest(sums: Mapping[str, str], tables: tuple[str, ...]) -> str:
    """SHA-256 of the fact definitions and, per table of ``tables``, its ``source_sums`` entry."""
    text = _definitions() + "\x1d" + "\x1d".join(f"{t}={sums[t]}" for t in tables)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(con: duckdb.DuckDBPyConnection, sums: Mapping[str, str] | None = None) -> str:
    """The store's fingerprint: definitions plus every source table (what readers check). ``sums``:
    the store's ``source_sums`` where the caller has them (computed on this connection, or from
    ``cache.source_sums``), which saves the scan."""
    return _digest(source_sums(con) if sums is None else sums, SOURCE_TABLES)


def _run_fingerprints_sql(con: duckdb.DuckDBPyConnection) -> str:
    """Per run: row count and sum of row hashes of each of its tables, as one text (one scan)."""
    parts = [
        f"SELECT run_id, '{t}' AS t, count(*)::VARCHAR || ':' || sum(hash({_columns(con, t)}))::VARCHAR AS v "
        f"FROM main.{t} GROUP BY run_id"
        for t in RUN_TABLES
    ]
    return (
        "SELECT run_id, string_agg(t || '=' || v, '|' ORDER BY t) AS fp FROM ("
        + " UNION ALL ".join(parts)
        + ") GROUP BY run_id"
    )


def stored_fingerprint(con: duckdb.DuckDBPyConnection) -> str | None:
    """The fingerprint the facts were computed for; None when the store has no (complete) facts."""
    tables = _main_tables(con)
    if "store_meta" not in tables or not set(FACT_TABLES) <= tables:
        return None
    return scalar(con, "SELECT value FROM main.store_meta WHERE key = ?", [META_KEY])


def current(con: duckdb.DuckDBPyConnection, sums: Mapping[str, str] | None = None) -> str | None:
    """The store's fingerprint when its facts match it, else None; ``sums`` as in ``fingerprint``."""
    stored = stored_fingerprint(con)
    if stored is None:
        return None
    return stored if fingerprint(con, sums) == stored else None


def _meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    return scalar(con, "SELECT value FROM main.store_meta WHERE key = ?", [key])


def refresh(con: duckdb.DuckDBPyConnection, force: bool = False) -> bool:
    """Bring the fact tables up to date; returns whether anything was written. Needs a writable
    connection to a v2 store.

    Incremental when it can be: with facts present, the shared tables and definitions unchanged
    (``SHARED_KEY``) and per-run fingerprints on record, only the runs whose source rows changed,
    appeared or vanished are deleted and recomputed (a new run on a large store costs that run,
    not the store). Otherwise, or with ``force``, every fact is recomputed. Either way runs are
    computed in batches of ``BATCH_PREDICTIONS`` predictions under ``REFRESH_MEMORY_LIMIT``, so
    the peak memory depends on the batch, not on the store's size.
    """
    sums = source_sums(con)  # one scan gives both fingerprints
    fp = fingerprint(con, sums)
    stored = stored_fingerprint(con)
    if not force and stored == fp:
        return False
    shared = _digest(sums, SHARED_TABLES)
    incremental = (
        not force
        and stored is not None
        and RUNS_TABLE in _main_tables(con)
        and _meta(con, SHARED_KEY) == shared
    )
    # One statement per table, not one transaction: at 10M predictions the new tables of a single
    # transaction do not fit in memory. Safe because the fingerprint is removed first and written
    # last: until it is back, no reader uses any fact table, and a crash in between leaves facts
    # that are simply not used (metrics compute from the source tables) until the next refresh,
    # which then recomputes everything (the shared fingerprint is removed with it).
    con.execute("DELETE FROM main.store_meta WHERE key IN (?, ?)", [META_KEY, SHARED_KEY])
    # insertion order off: a fact table's row order carries no meaning (readers group or order),
    # and keeping it makes DuckDB buffer a whole CREATE TABLE AS before writing it
    with memory_capped(con, REFRESH_MEMORY_LIMIT, preserve_insertion_order=False):
        con.execute(f"CREATE OR REPLACE TEMP TABLE _facts_runs_now AS {_run_fingerprints_sql(con)}")
        try:
            if incremental:
                _refresh_runs(con)
            else:
                _refresh_all(con)
            con.execute(
                f"CREATE OR REPLACE TABLE main.{RUNS_TABLE} AS SELECT * FROM _facts_runs_now ORDER BY run_id"
            )
        finally:
            con.execute("DROP TABLE IF EXISTS _facts_runs_now")
    con.execute(
        "INSERT OR REPLACE INTO main.store_meta VALUES (?, ?), (?, ?)", [META_KEY, fp, SHARED_KEY, shared]
    )
    return True


def _live_views(con: duckdb.DuckDBPyConnection, suffix: str) -> None:
    """The base views over the source tables, named ``scored{suffix}`` / ``option_probs{suffix}``."""
    from equipoise.evaluators.metrics.registry import SQL_DIR

    sql = (SQL_DIR / "base_views.sql").read_text(encoding="utf-8")
    sql = sql.replace("TEMP VIEW scored AS", f"TEMP VIEW scored{suffix} AS")
    sql = sql.replace("TEMP VIEW option_probs AS", f"TEMP VIEW option_probs{suffix} AS")
    con.execute(sql)


def _compute(con: duckdb.DuckDBPyConnection, todo: str | None, create: bool) -> None:
    """Fill the fact tables from the source tables with the rows of every run (``todo`` None) or of
    the runs the SQL predicate ``todo`` selects: replacing the tables (``create``) or appended to
    them (the runs' old rows are already deleted). The per-item uncertainty scores read the fact
    rows just written, not the joins again (less memory at 10M)."""
    from equipoise.evaluators.metrics.conformal import pool_facts_sql
    from equipoise.evaluators.metrics.registry import (
        FACT_ONLY_COLUMNS,
        POOL_FACT_COLUMNS,
        POOL_FACT_FIELDS,
        sample_probs_sql,
        scored_probs_sql,
    )
    from equipoise.evaluators.metrics.uncertainty import fact_scores_sql

    where = "" if todo is None else f" WHERE {todo}"

    def fill(table: str, query: str) -> None:
        if create:
            con.execute(f"CREATE OR REPLACE TABLE main.{table} AS {query}")
        else:
            con.execute(f"INSERT INTO main.{table} BY NAME {query}")

    _live_views(con, "_live")
    try:
        fill("facts_option_probs", f"SELECT * FROM option_probs_live{where}")
        # per sample, from the option probabilities just written and the live `scored` (it reads
        # three columns of it; not facts_scored, which gets these facts from it below)
        con.execute(
            f"""CREATE OR REPLACE TEMP VIEW scored AS SELECT * FROM scored_live{where};
               CREATE OR REPLACE TEMP VIEW option_probs AS SELECT * FROM main.facts_option_probs{where};"""
        )
        # the batch's per-sample facts, held only until facts_scored has them as columns (no
        # reader needs a table of their own: registry.read_facts serves sample_probs from
        # facts_scored); a TEMP table, not a view, so the per-sample aggregate runs once
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _facts_sample_probs AS {sample_probs_sql()};
               CREATE OR REPLACE TEMP VIEW sample_probs AS SELECT * FROM _facts_sample_probs;"""
        )
        # per run x item: the sample pools of conformal_sampling (pool 'item'), written onto each
        # pool's first sample row in the same statement that writes facts_scored (an UPDATE of list
        # columns would delete and reinsert the rows, moving the rowids the option mask keys by)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _facts_pools AS {pool_facts_sql()}")
        pool_cols = ", ".join(
            f"p.{f} AS {c}" for f, c in zip(POOL_FACT_FIELDS, POOL_FACT_COLUMNS, strict=True)
        )
        # facts_scored = scored_probs: `scored` plus the per-sample columns the calibration metrics
        # read, joined here once per store instead of once per metrics pass (registry.prepare
        # gives readers `scored` without them)
        fill(
            "facts_scored",
            f"""SELECT q.*, {pool_cols} FROM ({_item_codes_sql(scored_probs_sql())}) q
                LEFT JOIN _facts_pools p
                ON p.run_id = q.run_id AND p.item_id = q.item_id AND p.first_sample = q.sample_index""",
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP VIEW scored AS
                SELECT * EXCLUDE ({", ".join(FACT_ONLY_COLUMNS)}) FROM main.facts_scored{where}"""
        )
        for pool in POOLS:
            fill(f"facts_unc_scores_{pool}", fact_scores_sql(pool))
    finally:
        con.execute(
            """DROP TABLE IF EXISTS _facts_pools;
               DROP VIEW IF EXISTS sample_probs; DROP TABLE IF EXISTS _facts_sample_probs;
               DROP VIEW IF EXISTS scored; DROP VIEW IF EXISTS option_probs;
               DROP VIEW IF EXISTS scored_live; DROP VIEW IF EXISTS option_probs_live;"""
        )


def _item_codes_sql(query: str) -> str:
    """The rows of ``query`` (with an ``item_id`` from ``items``) plus ``registry.ITEM_CODE``: the
    rank of item_id among the distinct item_id of ``items``, in string order.

    Why: conformal's option mask (``conformal._coded``) joins every unit to its split hashes by the
    item and breaks ties by the item's string order, and conformal_sampling's pools key their own
    mask by it (they join the shared mask by rowid); an integer of the same order does both without
    hashing or comparing the item strings. The rank is per item_id string (not per dataset), so
    the code of an item_id is the same in every run, and it depends only on ``items``, a shared
    table: an incremental refresh (new or changed runs) keeps every code, and a change to
    ``items`` recomputes every fact (``refresh``)."""
    from equipoise.evaluators.metrics.registry import ITEM_CODE

    codes = (
        f"SELECT item_id, row_number() OVER (ORDER BY item_id)::INTEGER AS {ITEM_CODE} "
        "FROM (SELECT DISTINCT item_id FROM main.items)"
    )
    return f"SELECT q.*, c.{ITEM_CODE} FROM ({query}) q JOIN ({codes}) c ON c.item_id = q.item_id"


def _batches(con: duckdb.DuckDBPyConnection, runs_sql: str) -> list[list[str]]:
    """The run ids that ``runs_sql`` (a SELECT of ``run_id``) gives, in (model, run_id) order,
    grouped into batches of at most ``BATCH_PREDICTIONS`` predictions (a larger run is a batch of
    its own). Why that order: each batch writes facts_unc_scores_<pool> sorted by (model, run_id,
    item_id) (``uncertainty.FACT_ORDER``), so batches appended in that order leave the whole table
    sorted and unc_scores copies it without a sort (``uncertainty._fact_in_order`` checks)."""
    from equipoise.evaluators.metrics.uncertainty import FACT_ORDER

    # the run-level part of the fact's order, as columns of runs (m) and of the selected ids (r)
    keys = ", ".join("r.run_id" if c == "run_id" else f"m.{c}" for c in FACT_ORDER if c != "item_id")
    rows = con.execute(
        f"""SELECT r.run_id, count(p.run_id) FROM ({runs_sql}) r
            LEFT JOIN main.runs m USING (run_id)
            LEFT JOIN main.predictions p USING (run_id)
            GROUP BY {keys} ORDER BY {keys}"""
    ).fetchall()
    batches: list[list[str]] = []
    size = 0
    for run_id, n in rows:
        if not batches or size + n > BATCH_PREDICTIONS:
            batches.append([])
            size = 0
        batches[-1].append(run_id)
        size += n
    return batches


def _run_predicate(run_ids: list[str]) -> str:
    """``run_id IN (...)`` with the ids as literals: a constant list DuckDB pushes into the scans
    of predictions, whose rows hold the option scores (a subquery would be a join after scanning
    every row)."""
    return f"run_id IN ({', '.join(sql_literal(r) for r in run_ids)})"


def _refresh_all(con: duckdb.DuckDBPyConnection) -> None:
    """Recompute every fact: in one pass when the store has at most one batch of predictions,
    else batch by batch of runs, the first batch creating the tables (``BATCH_PREDICTIONS``)."""
    for t in OBSOLETE_TABLES:
        con.execute(f"DROP TABLE IF EXISTS main.{t}")
    batches = _batches(con, "SELECT run_id FROM main.runs")
    if len(batches) <= 1:
        _compute(con, None, create=True)
        return
    for i, batch in enumerate(batches):
        _compute(con, _run_predicate(batch), create=i == 0)


def _refresh_runs(con: duckdb.DuckDBPyConnection) -> None:
    """Recompute the facts of the runs whose fingerprint differs from the one on record, batch by
    batch of runs (``BATCH_PREDICTIONS``)."""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _facts_stale AS
            SELECT coalesce(n.run_id, o.run_id) AS run_id, n.run_id IS NOT NULL AS present
            FROM _facts_runs_now n FULL OUTER JOIN main.{RUNS_TABLE} o USING (run_id)
            WHERE n.fp IS DISTINCT FROM o.fp"""
    )
    try:
        for t in FACT_TABLES:
            con.execute(f"DELETE FROM main.{t} WHERE run_id IN (SELECT run_id FROM _facts_stale)")
        for batch in _batches(con, "SELECT run_id FROM _facts_stale WHERE present"):
            _compute(con, _run_predicate(batch), create=False)
    finally:
        con.execute("DROP TABLE IF EXISTS _facts_stale")
