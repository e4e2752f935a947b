"""Per-prediction facts: the base relations every metric reads, computed once and kept in the store.

Why: a metrics pass spends most of its time joining predictions to runs, items and options and
taking the option softmax (``scored`` and ``option_probs``, see ``sql/base_views.sql``), and then
computing the per-item uncertainty scores (``sql/unc_scores.sql``) that five metrics share. Those
are facts of the stored rows, not of a metric, so a writer computes them once, in one vectorized
DuckDB pass, into ordinary tables of the store (:func:`refresh`):

- ``facts_scored``            = the ``scored`` relation (one row per prediction sample);
- ``facts_option_probs``      = the ``option_probs`` relation (one row per scored option);
- ``facts_unc_scores_<pool>`` = the per-item uncertainty scores with every stratum, per pool.

A read-only metrics pass (``registry.prepare(con, materialize=True)``) then reads them through
views instead of recomputing them, but only when they are current: :func:`fingerprint` hashes the
fact definitions (the SQL text and the package's regular expressions) together with a row count
and an order-independent sum of row hashes of every source table, and the facts are used only when
the fingerprint stored with them (``store_meta`` key ``facts_fingerprint``) equals the store's
fingerprint now. Any write that changes a source table (through this package or plain SQL) changes
the fingerprint, and the metrics fall back to computing the relations for the connection, so a
stale fact can never reach a result. The fingerprint is one scan of the source tables, the floor
any metrics pass pays anyway.
"""

from __future__ import annotations

import hashlib

import duckdb

from equipoise.evaluators.store import scalar

SOURCE_TABLES: tuple[str, ...] = ("datasets", "items", "options", "runs", "predictions", "option_scores")
POOLS: tuple[str, ...] = ("item", "base")
FACT_TABLES: tuple[str, ...] = (
    "facts_scored",
    "facts_option_probs",
    *(f"facts_unc_scores_{p}" for p in POOLS),
)
META_KEY = "facts_fingerprint"
# bump when the meaning of a fact changes in a way the SQL text does not show
FACTS_FORMAT = 1


def _definitions() -> str:
    """Everything the facts are computed from besides the rows: SQL files and regexes."""
    from equipoise.evaluators.metrics import uncertainty
    from equipoise.evaluators.metrics.registry import SQL_DIR

    texts = [str(FACTS_FORMAT), uncertainty.CONFIDENCE_RE, uncertainty.HEDGE_RE]
    texts += [(SQL_DIR / f).read_text(encoding="utf-8") for f in ("base_views.sql", "unc_scores.sql")]
    return "\x1e".join(texts)


def _main_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT temporary"
    ).fetchall()
    return {r[0] for r in rows}


def fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """SHA-256 of the fact definitions and, per source table, its row count and the sum of its
    rows' hashes (DuckDB ``hash`` over every column). One query, one scan of each table."""
    parts = []
    for t in SOURCE_TABLES:
        cols = ", ".join(f'"{r[0]}"' for r in con.execute(f"DESCRIBE main.{t}").fetchall())
        parts.append(
            f"(SELECT count(*)::VARCHAR || ':' || coalesce(sum(hash({cols})), 0)::VARCHAR FROM main.{t})"
        )
    row = con.execute("SELECT " + ", ".join(parts)).fetchone()
    assert row is not None
    text = _definitions() + "\x1d" + "\x1d".join(f"{t}={v}" for t, v in zip(SOURCE_TABLES, row, strict=True))
    return hashlib.sha256(text.encode()).hexdigest()


def stored_fingerprint(con: duckdb.DuckDBPyConnection) -> str | None:
    """The fingerprint the facts were computed for; None when the store has no (complete) facts."""
    tables = _main_tables(con)
    if "store_meta" not in tables or not set(FACT_TABLES) <= tables:
        return None
    return scalar(con, "SELECT value FROM main.store_meta WHERE key = ?", [META_KEY])


def current(con: duckdb.DuckDBPyConnection) -> str | None:
    """The store's fingerprint when its facts match it, else None."""
    stored = stored_fingerprint(con)
    if stored is None:
        return None
    return stored if fingerprint(con) == stored else None


def refresh(con: duckdb.DuckDBPyConnection, force: bool = False) -> bool:
    """Recompute the fact tables when they are missing or stale; returns whether anything was
    written. Needs a writable connection to a v2 store."""
    from equipoise.evaluators.metrics.registry import STRATA, prepare
    from equipoise.evaluators.metrics.uncertainty import scores_sql

    fp = fingerprint(con)
    if not force and stored_fingerprint(con) == fp:
        return False
    prepare(con)  # TEMP views over the source tables, always current
    # One statement per table, not one transaction: at 10M predictions the new tables of a single
    # transaction do not fit in memory. Safe because the fingerprint is removed first and written
    # last: until it is back, no reader uses any fact table, and a crash in between leaves facts
    # that are simply not used (metrics compute from the source tables) until the next refresh.
    con.execute("DELETE FROM main.store_meta WHERE key = ?", [META_KEY])
    con.execute("CREATE OR REPLACE TABLE main.facts_scored AS SELECT * FROM scored")
    con.execute("CREATE OR REPLACE TABLE main.facts_option_probs AS SELECT * FROM option_probs")
    # the per-item scores read the two tables just written, not the joins again (less memory)
    con.execute(
        """CREATE OR REPLACE TEMP VIEW scored AS SELECT * FROM main.facts_scored;
           CREATE OR REPLACE TEMP VIEW option_probs AS SELECT * FROM main.facts_option_probs;"""
    )
    for pool in POOLS:
        query = scores_sql(list(STRATA), {"pool": pool})
        con.execute(f"CREATE OR REPLACE TABLE main.facts_unc_scores_{pool} AS {query}")
    con.execute("INSERT OR REPLACE INTO main.store_meta VALUES (?, ?)", [META_KEY, fp])
    con.execute("DROP VIEW scored; DROP VIEW option_probs")  # a later prepare() builds live views
    return True
