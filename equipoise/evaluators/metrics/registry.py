"""The metric registry.

A metric is declared once: a name, the SQL that computes it (a file under ``sql/``, written against
the base views ``scored`` and ``option_probs``), what store tables it needs, and optionally a thin
Python function over the SQL result where SQL is not the tool (an exact test, a bootstrap). Grouping
is uniform: the SQL selects ``{by}`` columns first and groups by them, so every metric can be split
by any stratum in ``STRATA``. A newcomer adds a metric by adding one SQL file and one ``register``
call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from equipoise.evaluators.metrics import columns, facts
from equipoise.evaluators.procfs import status_kib
from equipoise.evaluators.store import scalar, sql_literal

if TYPE_CHECKING:  # pandas is imported by ``compute`` alone: a metrics pass never imports it (columns.py)
    import pandas as pd

SQL_DIR = Path(__file__).parent / "sql"

# a metric's Python function over its SQL (``Metric.compute_fn``): connection, grouping, parameters
ComputeFn = Callable[[duckdb.DuckDBPyConnection, Sequence[str], dict], "columns.Columns | pd.DataFrame"]

# columns of the `scored` view a metric may be grouped by
STRATA: tuple[str, ...] = (
    "model",
    "backend",
    "prompt_style",
    "suite",
    "variant",
    "config",
    "k",
    "framing",
    "system_id",
    "criterion_id",
    "condition",
    "specialty",
    "question_type",
    "imaging_modality",
    "difficulty",
    "run_id",
)


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    sql: str | None = None  # file name under sql/
    needs: tuple[str, ...] = ("predictions",)
    default_by: tuple[str, ...] = ("model",)
    post: Callable[[pd.DataFrame, Sequence[str]], pd.DataFrame] | None = None
    params: dict[str, object] = field(default_factory=dict)
    # Python work over SQL: returns the result as columns (``columns.Columns``, what a metrics pass
    # writes without pandas) or as a pandas frame
    compute_fn: ComputeFn | None = None
    # when the whole result is one query: the rendered SQL (params already merged with defaults).
    # Lets `write_result` stream a result of tens of millions of rows (per-item scores) from DuckDB
    # to a file, where a pandas frame of it would need many times the store's size in memory.
    sql_fn: Callable[[duckdb.DuckDBPyConnection, Sequence[str], dict], str] | None = None
    # the lane group of a metrics pass in lanes (``pass_runner.cache_group``): metrics that share a
    # connection's TEMP caches when the pass reads the store's fact tables run in one lane, one
    # after the other, so a cache is built once. None: the metric's module (most modules' metrics
    # share their caches); a metric that shares nothing names a group of its own, so that a lane
    # may take it alone. Only speed depends on it: a cache is named for everything its rows depend
    # on, so a metric's result is the same in any lane.
    lane_group: str | None = None
    # the most distinct values a column of one Parquet row group may have and still be written
    # dictionary-encoded by ``write_result`` (DuckDB's COPY option DICTIONARY_SIZE_LIMIT, counted in
    # entries), or None for DuckDB's default (PER_ITEM_DICTIONARY_LIMIT says why a per-item result
    # sets one)
    parquet_dictionary_limit: int | None = None


REGISTRY: dict[str, Metric] = {}

# ``Metric.parquet_dictionary_limit`` of the long results (one row per item, or per distinct
# confidence: hundreds of thousands of rows). DuckDB's default limit is a fifth of a row group
# (about 24,000 values), so its writer hashed that many values of every mostly-distinct column (ids,
# most scores) into a dictionary it then dropped for PLAIN encoding: about a sixth of the CPU of
# writing unc_scores at 1M predictions (0.44 -> 0.36 s). With 1024 it gives up sooner. Only a column
# with between 1024 and the default's number of distinct values per row group is encoded otherwise
# (PLAIN, not a dictionary), and its values read back the same; the 1M benchmark's files are
# byte-identical. Small results keep the default: there DuckDB leaves a column PLAIN when a
# dictionary would not pay (a 3-row file), which any explicit limit turns into dictionaries.
PER_ITEM_DICTIONARY_LIMIT = 1024


def register(metric: Metric) -> Metric:
    if metric.sql_fn is not None and metric.compute_fn is None:
        sql_fn = metric.sql_fn
        metric = replace(metric, compute_fn=lambda con, by, params: con.execute(sql_fn(con, by, params)).df())
    if metric.name in REGISTRY:
        raise ValueError(f"metric '{metric.name}' registered twice")
    if metric.sql is None and metric.compute_fn is None:
        raise ValueError(f"metric '{metric.name}' needs sql or compute_fn")
    REGISTRY[metric.name] = metric
    return metric


BASE_RELATIONS = ("scored", "option_probs", "sample_probs")


def temp_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of this connection's TEMP tables (materialized relations and caches).

    Filtered on the catalog name rather than the ``temporary`` column: the same tables (TEMP tables
    live in the catalog ``temp``), about a third less CPU per call (0.65 -> 0.44 ms measured with
    the 1M store attached), and a metrics pass makes about 160 of these calls."""
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'").fetchall()
    return {r[0] for r in rows}


def cached_table(con: duckdb.DuckDBPyConnection, table: str, query: str | Callable[[], str]) -> str:
    """The TEMP table ``table`` holding the rows of ``query``, computed only where this connection
    lacks it (a per-connection cache: its name must say everything its rows depend on); returns
    ``table``. ``query`` may be a function that renders it, called only when the table is missing:
    a cache named without its SQL (a hash of its inputs) is then found without rendering it."""
    if table not in temp_tables(con):
        con.execute(f"CREATE TEMP TABLE {table} AS {query if isinstance(query, str) else query()}")
    return table


FACTS_MARK = "_facts_in_use"  # TEMP table: this connection reads the store's current fact tables
# a variable of the connection (SET VARIABLE): what ``prepare`` / ``read_facts`` made of its base
# relations, 'facts' (views of the store's current fact tables, FACTS_MARK created) or 'tables'
# (TEMP tables); unset before. Those two functions alone create the TEMP tables that
# ``_materialized`` and ``uses_facts`` look for, and nothing drops them, so where it is set the
# variable is the answer: one getvariable instead of listing the catalog (``temp_tables``, about
# 0.6-0.9 ms a call at 1M predictions against 0.1-0.2 ms; a pass asks about 130 times, about 0.1
# CPU s in all). Where it is unset (a connection not prepared, or TEMP tables made by hand), the
# catalog is listed as before. A variable is not rolled back with a transaction: a prepare inside
# one that is then rolled back (no caller does that) would leave it set without the tables.
BASE_RELATIONS_VAR = "equipoise_base_relations"


def _prepared_as(con: duckdb.DuckDBPyConnection) -> str | None:
    """``BASE_RELATIONS_VAR`` of this connection: 'facts', 'tables' or None (unset)."""
    value = scalar(con, f"SELECT getvariable('{BASE_RELATIONS_VAR}')")
    return None if value is None else str(value)


def _materialized(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the base relations are fixed for this connection (TEMP tables, or views over the
    store's fact tables found current by ``prepare``)."""
    if _prepared_as(con) is not None:
        return True
    temps = temp_tables(con)
    return set(BASE_RELATIONS) <= temps or FACTS_MARK in temps


def scans_in_insertion_order(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether a plain scan of a table returns its rows in the order they were inserted
    (``preserve_insertion_order``, DuckDB's default; it can be set per connection): what a metric
    checks before it reads a table's stored order instead of sorting (unc_scores' copy of its fact,
    calibration's sorted tie blocks)."""
    return bool(scalar(con, "SELECT current_setting('preserve_insertion_order')"))


def uses_facts(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``prepare`` found the store's fact tables current and reads them."""
    prepared = _prepared_as(con)
    if prepared is not None:
        return prepared == "facts"
    return FACTS_MARK in temp_tables(con)


def prepare(
    con: duckdb.DuckDBPyConnection, materialize: bool = False, sums: Mapping[str, str] | None = None
) -> None:
    """Create the base relations ``scored``, ``option_probs`` and ``sample_probs`` (TEMP, so
    read-only stores work), and the view ``scored_probs`` (``scored`` with per-sample columns of
    ``sample_probs``, see ``scored_probs_sql``).

    By default they are views, recomputed by every metric query: always current, right for a
    connection that also writes. ``materialize=True`` computes them once into TEMP tables for the
    rest of the connection, which is what a read-only pass over many metrics wants (the joins of
    predictions to runs, items and options are most of each metric's cost). Once materialized,
    later calls keep the tables. When the store holds current fact tables (``facts.refresh``,
    checked by fingerprint) ``materialize=True`` reads those instead of computing anything, with
    DuckDB's memory capped for the pass (``cap_pass_memory``). That check is one scan of the source
    tables unless the caller hands in their ``sums`` (``facts.source_sums``: scanned by this command
    already, or ``cache.source_sums`` of an unchanged store).
    """
    if _materialized(con):
        return
    if materialize and facts.current(con, sums) is not None:
        read_facts(con)
        cap_pass_memory(con)
        return
    sql = (SQL_DIR / "base_views.sql").read_text(encoding="utf-8")
    sql = sql.rstrip().rstrip(";") + ";\nCREATE OR REPLACE TEMP VIEW sample_probs AS\n" + sample_probs_sql()
    if materialize:
        sql = sql.replace("CREATE OR REPLACE TEMP VIEW", "CREATE OR REPLACE TEMP TABLE")
    # a view in every case: a TEMP table of it would copy all of `scored` again for the few
    # metrics that read it (the calibration ones, which cache their own narrow rows of it)
    sql += ";\nCREATE OR REPLACE TEMP VIEW scored_probs AS\n" + scored_probs_sql()
    con.execute(sql)
    if materialize:
        con.execute(f"SET VARIABLE {BASE_RELATIONS_VAR} = 'tables'")


def read_facts(con: duckdb.DuckDBPyConnection) -> None:
    """Point the connection's base relations at the store's fact tables, unchecked: for ``prepare``
    once it found them current, and for a further connection to the same database in the same pass
    (``pass_runner``: the check reads every run's fingerprint again, 0.36 s at 1M predictions, loaded)."""
    # option_probs is stored as the fact table of its name (facts.FACT_TABLES); facts_scored holds
    # `scored` plus the per-sample columns of scored_probs, which `scored` leaves out, and those
    # columns are `sample_probs` on the rows that have option scores (n_scored is NULL exactly
    # where sample_probs has no row: scored_probs joins it with a LEFT JOIN, and a sample_probs row
    # counts at least one option)
    views = "CREATE OR REPLACE TEMP VIEW option_probs AS SELECT * FROM main.facts_option_probs;\n"
    views += (
        "CREATE OR REPLACE TEMP VIEW sample_probs AS "
        f"SELECT run_id, item_id, sample_index, {', '.join(SCORED_PROBS_COLUMNS)} "
        "FROM main.facts_scored WHERE n_scored IS NOT NULL;\n"
    )
    views += (
        f"CREATE OR REPLACE TEMP VIEW scored AS SELECT * EXCLUDE ({', '.join(FACT_ONLY_COLUMNS)}) "
        "FROM main.facts_scored;\n"
        f"CREATE OR REPLACE TEMP VIEW scored_probs AS SELECT * EXCLUDE ({', '.join(POOL_FACT_COLUMNS)}) "
        "FROM main.facts_scored;\n"
    )
    con.execute(f"{views}CREATE TEMP TABLE {FACTS_MARK} (x INTEGER);")
    con.execute(f"SET VARIABLE {BASE_RELATIONS_VAR} = 'facts'")


# the memory cap of a metrics pass over current facts (see cap_pass_memory and pass_memory_cap)
PASS_PEAK_SHARE = 0.95  # the pass's peak RSS target, as a share of the store file's size
# DuckDB's memory outside its memory_limit (allocator slack, result chunks, the Parquet writers, the
# metrics' own numpy work), beyond the process's own memory when the cap is set (``own_memory``): a
# fixed part plus a share of the limit, above everything measured in stop 27 (benchmarks/RESULTS.md):
# 28-51 MiB at limits of 213-300 MiB over a freshly built 1M store (own memory 177 MiB); over a
# freshly built 10M one (own memory 201 MiB, limit 4.5 GiB) the peak stayed below own memory plus
# the limit. The 3% share is a margin for large limits, not a measured slope.
PASS_OUTSIDE_FIXED = 48 * 2**20
PASS_OUTSIDE_LIMIT = 0.03
PASS_MEMORY_SHARE = 0.5  # the cap as a share of the store where the process's RSS is unknown
# the least memory_limit a pass gets (DuckDB needs some memory whatever the data). 128 MiB, not
# the 256 MiB it was: a freshly built 1M-prediction store is a 521-532 MiB file (no free blocks
# left by refreshes), where the formula gave 185-194 MiB; the old floor raised that to 256 MiB
# and the pass peaked at 543 / 550 MiB over a 532 MiB file (benchmarks/RESULTS.md, stop 26)
PASS_MEMORY_FLOOR = 128 * 2**20
# the least own memory the cap assumes (``own_memory``): a process that has imported what a pass
# imports (Python, DuckDB, numpy, pydantic, every metric module: 60 MiB), opened a store (91 MiB)
# and checked its fingerprint (95 MiB at 1M predictions), measured at stop 32 once the pass stopped
# importing pandas and pyarrow (``columns``; with them the same steps held 130, 162-166 and 175-179
# MiB at stop 27). The metrics import nothing large on first use (no scipy, scikit-learn, pandas or
# pyarrow: tests/test_pass_runner.py checks), so this only guards a caller that measures too early.
PASS_BASELINE_MIN = 88 * 2**20


def process_rss() -> int | None:
    """This process's resident memory now (``VmRSS``, Linux), in bytes; None where unknown."""
    kib = status_kib("VmRSS")
    return None if kib is None else kib * 1024


def own_memory(con: duckdb.DuckDBPyConnection) -> int | None:
    """The process's memory outside DuckDB's buffer pool, in bytes (None where its RSS is unknown):
    its RSS less what the pool holds now (store blocks that ``facts.current`` read to check the
    fingerprint), which the pass's memory_limit governs from then on."""
    rss = process_rss()
    if rss is None:
        return None
    return max(0, rss - int(scalar(con, "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")))


def pass_memory_cap(store_bytes: int, rss_bytes: int | None) -> int:
    """DuckDB's memory_limit for a pass over a store of ``store_bytes`` by a process that holds
    ``rss_bytes`` already: what aims to keep the pass's peak RSS under ``PASS_PEAK_SHARE`` of the
    store (stores too small for the room to reach ``PASS_MEMORY_FLOOR`` get the floor, and can
    peak above their file).

    The peak is the process's own memory before the pass (``rss_bytes``: its RSS less what DuckDB's
    buffer pool holds, at least ``PASS_BASELINE_MIN``), plus the limit, plus what DuckDB and the
    metrics hold outside it. That last part is mostly fixed, not a share of the limit: 28-51 MiB
    at limits of 213-300 MiB over a freshly built 1M store, and nothing measurable at 4.5 GiB over
    a 10M one, whose peak stayed below own memory plus the limit (benchmarks/RESULTS.md, stop 27);
    ``PASS_OUTSIDE_FIXED`` + ``PASS_OUTSIDE_LIMIT`` of the limit is above every one of them. So the
    limit is the room left under the target,
    ``(PASS_PEAK_SHARE * store - rss - PASS_OUTSIDE_FIXED) / (1 + PASS_OUTSIDE_LIMIT)``, at least
    ``PASS_MEMORY_FLOOR``. Where the RSS is unknown the limit is ``PASS_MEMORY_SHARE`` of the store.

    Why 95% of the file and not less: the outside part is taken at the top of what was measured,
    so the peaks land below the target (a margin of its own), and at small stores every MiB of limit
    counts: below about 250 MiB a 1M pass evicts store blocks it reads again and spills TEMP tables
    and sorts to ``<store>.tmp`` (stop 26's limit, 181 MiB, cost 0.6-0.9 CPU s against an unbounded
    pass). That limit was small because the process held 212 MiB after its imports, 80 of them scipy
    and scikit-learn, which the metrics no longer import, and because the outside part was taken as
    15% of the limit on top of a 256 MiB floor under the process's memory.
    """
    if rss_bytes is None:
        room = store_bytes * PASS_MEMORY_SHARE
    else:
        baseline = max(rss_bytes, PASS_BASELINE_MIN)
        room = (store_bytes * PASS_PEAK_SHARE - baseline - PASS_OUTSIDE_FIXED) / (1 + PASS_OUTSIDE_LIMIT)
    return max(PASS_MEMORY_FLOOR, int(room))


def cap_pass_memory(con: duckdb.DuckDBPyConnection) -> None:
    """Lower DuckDB's memory_limit for a metrics pass over a store's fact tables to
    ``pass_memory_cap`` (a lower limit of the connection is kept, and a limit its caller chose
    through ``store.connect(memory_limit=)``, e.g. ``--memory-limit``, higher or lower, is left
    alone), for the rest of the connection; the target is the issue's: the pass's peak RSS below
    the store file's size.

    Why: with DuckDB's default (80% of RAM) nothing is ever evicted, so a pass's RSS grows metric by
    metric with every store block it read and every cache it made (1,009 MiB at 1M predictions, a
    737 MiB store, though no metric alone needs more than 785 MiB). A single metric's working set
    over the facts is a fraction of the store, so under this cap DuckDB evicts clean blocks and
    spills the rest to ``<store>.tmp``. Applied by ``prepare`` only when it reads current facts (a
    pass that materializes the base relations itself holds TEMP tables about the store's size and
    would spill them)."""
    from equipoise.evaluators.store import database_path, lower_memory_limit, memory_limit_chosen

    path = database_path(con)
    if path is None or memory_limit_chosen(con):
        return  # in memory: nowhere to spill; chosen by the caller (--memory-limit): theirs to set
    spill = Path(str(scalar(con, "SELECT current_setting('temp_directory')")))
    if not os.access(spill if spill.exists() else spill.parent, os.W_OK):
        return  # nowhere to spill (a read-only folder): a cap could fail a metric, not only slow it
    size = sum(p.stat().st_size for p in (Path(path), Path(f"{path}.wal")) if p.exists())
    lower_memory_limit(con, pass_memory_cap(size, own_memory(con)))


# the per-sample columns scored_probs adds to scored (sql/scored_probs.sql)
SCORED_PROBS_COLUMNS = (
    "n_scored",
    "brier_mc",
    "chosen_prob",
    "target_prob",
    "lac_scores",
    "lac_target",
    "aps_scores",
    "aps_target",
)
# facts_scored's integer code of item_id (facts.py, ``_item_codes_sql``): its rank among the distinct
# item_id of ``items`` in string order, so conformal's option mask joins and orders units by an integer
ITEM_CODE = "item_code"
# what a pool 'item' of conformal_sampling (``sql/sampling_pools.sql``) holds besides its keys and strata
POOL_FACT_FIELDS: tuple[str, ...] = (
    "m",
    "m_option",
    "n_targets",
    "target_option_id",
    "hit",
    "mv_correct",
    "ss",
    "st",
)
# facts_scored's columns of those (facts.py, ``conformal.pool_facts_sql``), position for position: the
# fields with a ``pool_`` prefix, on the pool's first sample row and NULL on the others; neither
# ``scored`` nor ``scored_probs`` shows them
POOL_FACT_COLUMNS: tuple[str, ...] = tuple(f"pool_{c}" for c in POOL_FACT_FIELDS)
# the columns of facts_scored that the ``scored`` relation readers see leaves out
FACT_ONLY_COLUMNS = (*SCORED_PROBS_COLUMNS, ITEM_CODE, *POOL_FACT_COLUMNS)


def scored_probs_sql() -> str:
    """The ``scored_probs`` relation (``sql/scored_probs.sql``): ``scored`` with the per-sample
    columns ``SCORED_PROBS_COLUMNS`` of ``sample_probs`` (a SELECT over those two relations)."""
    return (SQL_DIR / "scored_probs.sql").read_text(encoding="utf-8")


def sample_probs_sql() -> str:
    """The ``sample_probs`` relation (``sql/sample_probs.sql``): per-sample facts of ``option_probs``
    (a SELECT over the relations ``scored`` and ``option_probs``)."""
    return (SQL_DIR / "sample_probs.sql").read_text(encoding="utf-8")


def _check_by(by: Sequence[str]) -> list[str]:
    bad = [b for b in by if b not in STRATA]
    if bad:
        raise KeyError(f"cannot group by {bad}; allowed: {', '.join(STRATA)}")
    return list(by)


# the runs' pairing class (sql/run_pair_class.sql), a fragment every metric's SQL may include as
# {run_class}: the pairing metrics (CLEAR and robustness) number runs the same way
RUN_CLASS_SQL = (SQL_DIR / "run_pair_class.sql").read_text(encoding="utf-8").strip()


def render_sql(metric: Metric, by: Sequence[str], params: dict | None = None) -> str:
    assert metric.sql is not None
    text = (SQL_DIR / metric.sql).read_text(encoding="utf-8")
    by = _check_by(by)
    values = {**metric.params, **(params or {})}
    return text.format(
        by=", ".join(by) + ("," if by else ""),
        group_by=("GROUP BY " + ", ".join(by)) if by else "",
        by_list=", ".join(by) if by else "NULL",
        run_class=RUN_CLASS_SQL,
        **values,
    )


def _lookup(con: duckdb.DuckDBPyConnection, name: str, by: Sequence[str] | None) -> tuple[Metric, list[str]]:
    """The registered metric and its grouping (default: the metric's own), base relations ready."""
    _load_all()
    if name not in REGISTRY:
        raise KeyError(f"unknown metric '{name}'; known: {', '.join(sorted(REGISTRY))}")
    metric = REGISTRY[name]
    prepare(con)
    return metric, list(metric.default_by if by is None else by)


def _result(
    con: duckdb.DuckDBPyConnection, name: str, by: Sequence[str] | None, params: dict | None
) -> columns.Columns | pd.DataFrame:
    """Metric ``name``'s result as its function returns it: columns, or a pandas frame."""
    metric, by = _lookup(con, name, by)
    if metric.compute_fn is not None:
        return metric.compute_fn(con, _check_by(by), {**metric.params, **(params or {})})
    df = con.execute(render_sql(metric, by, params)).df()
    if metric.post is not None:
        df = metric.post(df, by)
    return df


def compute(
    con: duckdb.DuckDBPyConnection, name: str, by: Sequence[str] | None = None, params: dict | None = None
) -> pd.DataFrame:
    """Compute one registered metric, grouped by ``by`` (default: the metric's own), as a pandas
    frame (pandas is imported here, on first use, not by a metrics pass: see ``write_result``)."""
    result = _result(con, name, by, params)
    return columns.to_frame(con, result) if isinstance(result, dict) else result


def result_sql(
    con: duckdb.DuckDBPyConnection, name: str, by: Sequence[str] | None = None, params: dict | None = None
) -> str | None:
    """The single query that is the whole result of metric ``name``, or None when the metric does
    Python work on the SQL result (an exact test, a bootstrap, a fit) and has no such query."""
    metric, by = _lookup(con, name, by)
    if metric.sql_fn is not None:
        return metric.sql_fn(con, _check_by(by), {**metric.params, **(params or {})})
    if metric.compute_fn is None and metric.post is None:
        return render_sql(metric, by, params)
    return None


def write_result(
    con: duckdb.DuckDBPyConnection,
    name: str,
    path: Path,
    by: Sequence[str] | None = None,
    params: dict | None = None,
) -> int:
    """Compute metric ``name`` into a Parquet file (a CSV file when ``path`` ends in .csv); returns
    its row count.

    A metric that is one query is copied by DuckDB straight to the file (``COPY ... TO``), so no
    pandas frame of it ever exists: what makes per-item tables of a 10M-prediction store fit in a
    few GiB. The other metrics (small, aggregated results) return columns of numpy arrays, which
    DuckDB writes the same way (``columns.write``), so a pass imports neither pandas nor pyarrow;
    a result returned as a pandas frame (a metric registered from outside this package) is written
    by pandas.
    """
    sql = result_sql(con, name, by, params)
    path = Path(path)
    csv = path.suffix.lower() == ".csv"
    fmt = "FORMAT csv, HEADER true" if csv else "FORMAT parquet"
    limit = REGISTRY[name].parquet_dictionary_limit
    if not csv and limit is not None:
        fmt += f", DICTIONARY_SIZE_LIMIT {int(limit)}"
    if sql is None:
        result = _result(con, name, by, params)
        if isinstance(result, dict):
            return columns.write(con, result, path, fmt)
        if csv:
            result.to_csv(path, index=False)
        else:
            result.to_parquet(path, index=False)
        return len(result)
    quoted = sql_literal(str(path))
    copied = con.execute(f"COPY ({sql}) TO {quoted} ({fmt})").fetchone()  # (rows written,)
    return int(copied[0]) if copied else 0


def metric_names() -> list[str]:
    """Every metric's name, sorted: the metrics of a full pass (``equipoise metrics``, the report,
    the benchmarks), in the order a sequential pass writes them. Imports every metric module first,
    since a metric exists once its module is imported."""
    _load_all()
    return sorted(REGISTRY)


def _load_all() -> None:
    """Import every module of this package once: importing a module registers its metrics."""
    import importlib
    import pkgutil

    import equipoise.evaluators.metrics as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "registry":
            importlib.import_module(f"{pkg.__name__}.{info.name}")
