"""The DuckDB prediction store: a real file, versioned migrations, idempotent batched writes.

One schema serves every task. An *item* is anything a model answers: an MCQ item (options A, B, ...)
or a determinability case (options 'Met', 'Not met', 'Unable to determine'). Every option's role
(gold / distractor / abstain / nota) is stored, so SQL can classify any prediction as answered,
abstained or unparsed and join gold, targets and strata without Python.

Tables (schema v1):
- ``datasets``  one row per dataset version (manifest sha256) and config;
- ``items``     one row per item with its strata (specialty, question type, modality, system,
                criterion, condition, k, framing, variant);
- ``options``   one row per option (label, stable option_id, role, framing);
- ``runs``      model, backend, decoding, prompt template and hash, dataset version, package version;
- ``predictions`` one row per run x item x sample: raw text, parsed label, parse method, outcome,
                token log-prob summaries, output tokens, latency, error;
- ``option_scores`` one row per run x item x sample x option with the option's log-probability
                (long format so softmax, LAC and APS are plain window functions); from schema v3
                a view over the two list columns of ``predictions`` that hold them.

Writes are idempotent: a rerun after a crash adds only what is missing, and importing the same file
twice adds nothing. Small tables have primary keys and ``INSERT OR IGNORE``; from schema v2 the two
hot tables (predictions, option_scores; from v3 predictions alone) have no index and the write path
keeps their keys unique (stage, anti-join, append; :data:`HOT_KEYS`).

Schema v2 adds ``runs.parent_run_id`` (the run a derived run, e.g. a self-evaluation, was made from;
NULL otherwise) and ``store_meta`` (key/value facts about the store, e.g. the fingerprint of the
derived metric tables). A new store is created at the latest version. An existing store at an older
version is never upgraded behind the user's back: opening it raises :class:`StoreOutdatedError`
naming the one command that upgrades it (``equipoise store migrate STORE``, :func:`migrate_store`),
which works on a copy and swaps it in only when every step succeeded.

Schema v3 keeps a sample's option scores on its prediction row, as two parallel lists
(``score_labels``, ``score_logprobs``, sorted by label; NULL for a sample without scores), and
``option_scores`` becomes a view that unnests them: every query of the long table reads the same
rows. Why: a sample's scores are written with it and never alone, and as rows of their own each
repeated the sample's run and item ids, which made their append about as costly as the predictions'
own (0.63-0.72 s of a 2.0-2.4 s import of 1M records; benchmarks/RESULTS.md, stops 31-32). Writers
still hand the store ``OptionScoreRow`` rows or a long Arrow table; the store folds them into the
lists (:func:`insert_batch`, :func:`insert_table`).

Schema v4 gives each item its option labels as bits: ``items.option_bits`` has the bit of every
label the item offers and ``items.abstain_bits`` those of its abstain options, a label's bit being
its position in :data:`OPTION_LABELS` (NULL where an option's label is not in that list, or the
item has no option). Why: every import checks each record's labels against its item's options, and
grouping the options per item on every import cost about a fifth of a 1M-record import (0.34 of
1.84 s; benchmarks/RESULTS.md, stop 41); the bits are derived once, when options are written
(:func:`insert_batch` refreshes those of the items a batch touches). They are a cache of
``options``, never an input, and ``store_meta`` records how many option rows they were computed
from (key :data:`OPTION_BITS_KEY`): the importer and the next write batch refresh them all
(:func:`ensure_option_bits`) whenever ``options`` holds another number of rows, which a plain-SQL
insert or delete causes. A plain-SQL edit that keeps the count (an ``UPDATE`` of an option's
label or role, or as many rows deleted as inserted) is not seen: after one, call
:func:`refresh_option_bits`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import duckdb
from pydantic import BaseModel, ConfigDict, Field, model_validator

from equipoise.schemas.features import to_table

if TYPE_CHECKING:  # the writers get Arrow tables from their callers; a reader never imports pyarrow
    import pyarrow as pa

SCHEMA_VERSION = 4

# The labels an item's options may carry with a bit of their own (schema v4, ``items.option_bits``):
# the letters of MCQ options, then the three answers of a determinability case. Append only: a
# label's bit is its position, stored in every item row, so reordering would need a migration that
# recomputes them (appending one only leaves the items that use it NULL until they are refreshed).
OPTION_LABELS: tuple[str, ...] = (
    *(chr(ord("A") + i) for i in range(26)),
    "Met",
    "Not met",
    "Unable to determine",
)
OPTION_LABEL_BITS: dict[str, int] = {label: 1 << b for b, label in enumerate(OPTION_LABELS)}
# an option's bit in SQL (NULL for a label without one)
_LABEL_BIT = "CASE label " + " ".join(f"WHEN '{k}' THEN {v}" for k, v in OPTION_LABEL_BITS.items()) + " END"


def option_bits_sql(where: str = "") -> str:
    """The option bits of each item that has options, from ``options`` filtered by ``where`` (a
    ``WHERE`` clause or ""): both columns NULL when any of the item's labels has no bit."""
    known = f"count(*) = count({_LABEL_BIT})"
    return f"""
        SELECT dataset_id, config, item_id,
               CASE WHEN {known} THEN bit_or({_LABEL_BIT}) END AS option_bits,
               CASE WHEN {known} THEN coalesce(bit_or({_LABEL_BIT}) FILTER (WHERE role = 'abstain'), 0)
               END AS abstain_bits
        FROM options {where}
        GROUP BY dataset_id, config, item_id"""


def _update_bits_sql(where: str = "") -> str:
    """Set the option bits of the items that ``where`` selects (a ``WHERE`` clause on dataset_id,
    config and item_id, applied to items and options alike; "" for every item): NULL for an item
    left without options."""
    return f"""
        UPDATE items SET option_bits = b.option_bits, abstain_bits = b.abstain_bits
        FROM (SELECT k.dataset_id, k.config, k.item_id, g.option_bits, g.abstain_bits
              FROM (SELECT dataset_id, config, item_id FROM items {where}) k
              LEFT JOIN ({option_bits_sql(where)}) g USING (dataset_id, config, item_id)) b
        WHERE items.dataset_id = b.dataset_id AND items.config = b.config AND items.item_id = b.item_id"""


# Columns derived from other stored rows (the option bits from ``options``): left out of the store's
# content fingerprint (metrics.facts), which already covers what they are derived from. So adding
# them (the v4 migration) or refreshing them leaves the facts current: while they counted, the
# v4 migration of a 10M-prediction store took 704 s, nearly all of it the facts refresh that
# `store migrate` runs after it (benchmarks/RESULTS.md, stop 42).
DERIVED_COLUMNS: dict[str, tuple[str, ...]] = {"items": ("option_bits", "abstain_bits")}

# the store_meta key under which the number of option rows the option bits were computed from is kept
OPTION_BITS_KEY = "option_bits_rows"
_RECORD_BITS = (
    f"INSERT OR REPLACE INTO store_meta VALUES ('{OPTION_BITS_KEY}', (SELECT count(*) FROM options)::VARCHAR)"
)

# the view that shows the option scores of schema v3 as the long table of v1 / v2
OPTION_SCORES_VIEW = """
        CREATE VIEW option_scores AS
        SELECT run_id, item_id, sample_index, unnest(score_labels) AS label, unnest(score_logprobs) AS logprob
        FROM predictions
        WHERE score_labels IS NOT NULL"""
# the message of the v3 migration when option scores name a sample that is not stored
ORPHAN_SCORES = (
    "option scores of samples that have no prediction row: schema v3 keeps a sample's scores on its "
    "prediction row; delete those scores (or restore their predictions) and migrate again"
)
_ORPHAN_SCORES_SQL = ORPHAN_SCORES.replace("'", "''")

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE datasets (
            dataset_id VARCHAR NOT NULL,          -- sha256 of manifest.json
            config VARCHAR NOT NULL,
            suite VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            location VARCHAR NOT NULL,             -- folder or repo@revision it was loaded from
            builder_version VARCHAR NOT NULL,
            seed BIGINT NOT NULL,
            source_name VARCHAR,
            source_revision VARCHAR,
            PRIMARY KEY (dataset_id, config)
        );
        CREATE TABLE items (
            dataset_id VARCHAR NOT NULL,
            config VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            base_id VARCHAR NOT NULL,
            task VARCHAR NOT NULL,                 -- mcq | determinability
            suite VARCHAR NOT NULL,
            variant VARCHAR NOT NULL,
            target_label VARCHAR NOT NULL,
            target_role VARCHAR NOT NULL,
            has_gold BOOLEAN NOT NULL,
            abstain_expected BOOLEAN NOT NULL,
            n_options INTEGER NOT NULL,
            k INTEGER,                              -- number of distractors offered
            framing VARCHAR,                        -- abstain framings offered, e.g. 'NA+IDK'
            specialty VARCHAR,
            question_type VARCHAR,
            imaging_modality VARCHAR,
            difficulty VARCHAR,
            system_id VARCHAR,
            criterion_id VARCHAR,
            condition VARCHAR,
            PRIMARY KEY (dataset_id, config, item_id)
        );
        CREATE TABLE options (
            dataset_id VARCHAR NOT NULL,
            config VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            label VARCHAR NOT NULL,
            option_id VARCHAR NOT NULL,
            role VARCHAR NOT NULL,
            framing VARCHAR,
            PRIMARY KEY (dataset_id, config, item_id, label)
        );
        CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            model VARCHAR NOT NULL,
            backend VARCHAR NOT NULL,
            prompt_style VARCHAR NOT NULL,
            prompt_template_id VARCHAR NOT NULL,
            prompt_sha256 VARCHAR NOT NULL,
            decoding_json VARCHAR NOT NULL,
            dataset_id VARCHAR NOT NULL,
            config VARCHAR NOT NULL,
            package_version VARCHAR NOT NULL
        );
        CREATE TABLE predictions (
            run_id VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            sample_index INTEGER NOT NULL,
            raw_output VARCHAR NOT NULL,
            parsed_label VARCHAR,                   -- NULL = unparseable, kept and counted
            parse_method VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL,               -- answered | abstained | unparsed | error
            token_logprob_sum DOUBLE,
            token_logprob_mean DOUBLE,
            token_logprob_min DOUBLE,
            n_output_tokens INTEGER,
            latency_ms DOUBLE,
            error VARCHAR,
            PRIMARY KEY (run_id, item_id, sample_index)
        );
        CREATE TABLE option_scores (
            run_id VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            sample_index INTEGER NOT NULL,
            label VARCHAR NOT NULL,
            logprob DOUBLE NOT NULL,
            PRIMARY KEY (run_id, item_id, sample_index, label)
        );
        """,
    ),
    (
        2,
        """
        ALTER TABLE runs ADD COLUMN parent_run_id VARCHAR;
        CREATE TABLE store_meta (
            key VARCHAR PRIMARY KEY,
            value VARCHAR NOT NULL
        );
        -- the two hot tables lose their primary key (an ART index costs ~4x a plain append); their
        -- key is kept unique by the write path (see HOT_KEYS): stage, anti-join, append
        CREATE TABLE predictions_v2 (
            run_id VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            sample_index INTEGER NOT NULL,
            raw_output VARCHAR NOT NULL,
            parsed_label VARCHAR,
            parse_method VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL,
            token_logprob_sum DOUBLE,
            token_logprob_mean DOUBLE,
            token_logprob_min DOUBLE,
            n_output_tokens INTEGER,
            latency_ms DOUBLE,
            error VARCHAR
        );
        INSERT INTO predictions_v2 SELECT * FROM predictions;
        DROP TABLE predictions;
        ALTER TABLE predictions_v2 RENAME TO predictions;
        CREATE TABLE option_scores_v2 (
            run_id VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            sample_index INTEGER NOT NULL,
            label VARCHAR NOT NULL,
            logprob DOUBLE NOT NULL
        );
        INSERT INTO option_scores_v2 SELECT * FROM option_scores;
        DROP TABLE option_scores;
        ALTER TABLE option_scores_v2 RENAME TO option_scores;
        """,
    ),
    (
        3,
        f"""
        -- a sample's option scores move onto its prediction row (module docstring); a score whose
        -- sample has no prediction row stops the migration (error() aborts the transaction)
        SELECT CASE WHEN count(*) > 0 THEN error('{_ORPHAN_SCORES_SQL}') END
        FROM (SELECT DISTINCT run_id, item_id, sample_index FROM option_scores) s
        WHERE NOT EXISTS (SELECT 1 FROM predictions p WHERE p.run_id = s.run_id AND p.item_id = s.item_id
                                                      AND p.sample_index = s.sample_index);
        CREATE TABLE predictions_v3 (
            run_id VARCHAR NOT NULL,
            item_id VARCHAR NOT NULL,
            sample_index INTEGER NOT NULL,
            raw_output VARCHAR NOT NULL,
            parsed_label VARCHAR,
            parse_method VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL,
            token_logprob_sum DOUBLE,
            token_logprob_mean DOUBLE,
            token_logprob_min DOUBLE,
            n_output_tokens INTEGER,
            latency_ms DOUBLE,
            error VARCHAR,
            score_labels VARCHAR[],                 -- the scored options' labels, sorted; NULL: none
            score_logprobs DOUBLE[]                 -- their log-probabilities, position for position
        );
        INSERT INTO predictions_v3
        SELECT p.*, s.score_labels, s.score_logprobs
        FROM predictions p
        LEFT JOIN (
            SELECT run_id, item_id, sample_index, list(label ORDER BY label) AS score_labels,
                   list(logprob ORDER BY label) AS score_logprobs
            FROM option_scores
            GROUP BY run_id, item_id, sample_index
        ) s USING (run_id, item_id, sample_index)
        ORDER BY p.rowid;  -- the rows in their stored order: the join would shuffle the file's layout
        DROP TABLE predictions;
        ALTER TABLE predictions_v3 RENAME TO predictions;
        DROP TABLE option_scores;
        {OPTION_SCORES_VIEW};
        """,
    ),
    (
        4,
        f"""
        -- each item's option labels as bits (module docstring), computed from the stored options
        ALTER TABLE items ADD COLUMN option_bits BIGINT;   -- bit of every offered label
        ALTER TABLE items ADD COLUMN abstain_bits BIGINT;  -- bits of the abstain options' labels
        {_update_bits_sql()};
        {_RECORD_BITS};
        """,
    ),
]

# Tables without a primary key whose rows are still unique on these columns: every write through
# this module stages the batch, drops rows whose key is already stored (anti-join) or repeated in
# the batch, and appends the rest. Idempotent like INSERT OR IGNORE, without an index to maintain.
HOT_KEYS: dict[str, tuple[str, ...]] = {
    "predictions": ("run_id", "item_id", "sample_index"),
}
# the columns of ``predictions`` that hold a sample's option scores (schema v3)
SCORE_COLUMNS: tuple[str, str] = ("score_labels", "score_logprobs")


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetRow(_Row):
    dataset_id: str
    config: str
    suite: str
    name: str
    location: str
    builder_version: str
    seed: int
    source_name: str | None = None
    source_revision: str | None = None


class ItemRow(_Row):
    dataset_id: str
    config: str
    item_id: str
    base_id: str
    task: Literal["mcq", "determinability"]
    suite: str
    variant: str
    target_label: str
    target_role: str
    has_gold: bool
    abstain_expected: bool
    n_options: int
    k: int | None = None
    framing: str | None = None
    specialty: str | None = None
    question_type: str | None = None
    imaging_modality: str | None = None
    difficulty: str | None = None
    system_id: str | None = None
    criterion_id: str | None = None
    condition: str | None = None


class OptionRow(_Row):
    dataset_id: str
    config: str
    item_id: str
    label: str
    option_id: str
    role: str
    framing: str | None = None


class RunRow(_Row):
    run_id: str
    model: str
    backend: str
    prompt_style: str
    prompt_template_id: str
    prompt_sha256: str
    decoding_json: str
    dataset_id: str
    config: str
    package_version: str
    parent_run_id: str | None = None


Outcome = Literal["answered", "abstained", "unparsed", "error"]


class PredictionRow(_Row):
    run_id: str
    item_id: str
    sample_index: int = Field(ge=0)
    raw_output: str
    parsed_label: str | None
    parse_method: str
    outcome: Outcome
    token_logprob_sum: float | None = None
    token_logprob_mean: float | None = None
    token_logprob_min: float | None = None
    n_output_tokens: int | None = None
    latency_ms: float | None = None
    error: str | None = None
    # the sample's option scores (schema v3): labels sorted, log-probabilities in the same order;
    # both None when none was scored. Writers usually leave them None and hand the store
    # ``OptionScoreRow`` rows, which :func:`insert_batch` folds in.
    score_labels: list[str] | None = None
    score_logprobs: list[float] | None = None

    @model_validator(mode="after")
    def _scores_paired(self) -> PredictionRow:
        labels, logprobs = self.score_labels, self.score_logprobs
        if (labels is None) != (logprobs is None):
            raise ValueError("score_labels and score_logprobs are given together or not at all")
        if labels is not None and logprobs is not None:
            if not labels or len(labels) != len(logprobs):
                raise ValueError("score_labels and score_logprobs need the same, non-zero length")
            if labels != sorted(set(labels)):
                raise ValueError("score_labels must be distinct and sorted")
        return self


class OptionScoreRow(_Row):
    run_id: str
    item_id: str
    sample_index: int = Field(ge=0)
    label: str
    logprob: float


_TABLES: dict[type[BaseModel], str] = {
    DatasetRow: "datasets",
    ItemRow: "items",
    OptionRow: "options",
    RunRow: "runs",
    PredictionRow: "predictions",
    OptionScoreRow: "option_scores",
}

# table name -> row model: the one definition of a table's columns and Arrow types, shared by the
# store and the Parquet parts that shards write (``evaluators/parts.py``)
TABLE_MODELS: dict[str, type[BaseModel]] = {name: model for model, name in _TABLES.items()}


def primary_key(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """The key columns of ``table``: :data:`HOT_KEYS` for the hot tables (kept unique by the write
    path, without an index), else the primary key read from the store itself."""
    if table in HOT_KEYS:
        return list(HOT_KEYS[table])
    rows = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'",
        [table],
    ).fetchall()
    if not rows:
        raise KeyError(f"table '{table}' has no primary key")
    return list(rows[0][0])


class StoreError(RuntimeError):
    """A store cannot be used as asked, for a reason its message names along with the fix (an old
    DuckDB, another writer holding the file, another schema version): what a command reports in
    one line instead of a traceback. The subclasses say which."""


# the oldest DuckDB the store works with. DuckDB 1.x cannot open a store file that 2.0 wrote, and
# its parser refuses the SQL of the option conformal metrics (1.4.4 and 1.5.6 both failed
# conformal_aps, conformal_lac and conformal_coverage_by with a syntax error at the calibration
# mask's last CTE; benchmarks/RESULTS.md, stop 30). pyproject.toml pins the same bound.
MIN_DUCKDB = (2, 0)


class DuckDBVersionError(StoreError):
    """The installed DuckDB is older than :data:`MIN_DUCKDB`."""


def check_duckdb_version(version: str | None = None) -> None:
    """Raise :class:`DuckDBVersionError` naming the installed version and the command that fixes it
    when DuckDB (``version``, default the imported module's) is older than :data:`MIN_DUCKDB`.

    Why: pip honours the package's pin, but an environment built with ``--no-deps`` or by another
    tool can hold an older DuckDB, which would fail much later, inside a metric, with a parser
    error that says nothing about versions. Every store connection is opened after this check."""
    text = duckdb.__version__ if version is None else version
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None or (int(found.group(1)), int(found.group(2))) < MIN_DUCKDB:
        need = ".".join(map(str, MIN_DUCKDB))
        raise DuckDBVersionError(
            f"equipoise needs DuckDB >= {need} (installed: {text}); run: pip install 'duckdb>={need},<3'"
        )


def connect_memory() -> duckdb.DuckDBPyConnection:
    """A store in memory with the current schema (parts are read into it for metrics and SQL)."""
    check_duckdb_version()
    con = duckdb.connect(":memory:")
    migrate(con)
    return con


def scalar(con: duckdb.DuckDBPyConnection, query: str, params: list | None = None) -> Any:
    """First column of the first row. Fetches everything: DuckDB 2.0 refuses new work on a
    connection while a result is still partly unread."""
    rows = con.execute(query, params or []).fetchall()
    return rows[0][0] if rows else None


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, for a one-line report (DuckDB's messages go on with
    context lines); the error's type name where its message is empty."""
    return next(iter(str(exc).splitlines()), "") or type(exc).__name__


def sql_literal(text: str) -> str:
    """``text`` as a SQL string literal (single quotes doubled): for values spliced into SQL that
    DuckDB cannot take as parameters (a COPY target, an IN list built once for several queries)."""
    return "'" + text.replace("'", "''") + "'"


_UNITS = {
    "b": 1,
    "bytes": 1,
    "byte": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def memory_bytes(text: str, midpoint: bool = False) -> int:
    """A DuckDB memory size (``'18.8 GiB'``, ``'2GB'``, ``'134217728B'``, ``'0 bytes'``) in bytes;
    with ``midpoint``, the middle of the sizes that show as ``text`` (DuckDB truncates to the last
    shown digit: ``'18.8 GiB'`` is 18.8 to 18.9 GiB), so a limit set from it shows the same."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    unit = (m.group(2) or "b").lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"memory size {text!r}: expected a number and a unit such as MiB or GB")
    number = m.group(1)
    half_step = 0.5 * 10 ** -len(number.partition(".")[2]) if midpoint else 0.0
    return int((float(number) + half_step) * _UNITS[unit])


def database_path(con: duckdb.DuckDBPyConnection) -> str | None:
    """The file of the connection's database; None for an in-memory one."""
    return scalar(con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()")


def file_backed(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's database is a file (so DuckDB can spill to ``<file>.tmp``)."""
    return database_path(con) is not None


@contextlib.contextmanager
def memory_capped(
    con: duckdb.DuckDBPyConnection, cap_bytes: int, preserve_insertion_order: bool | None = None
) -> Iterator[None]:
    """Within the block, DuckDB's ``memory_limit`` is at most ``cap_bytes`` (a lower limit the
    connection already has is kept) and, when given, ``preserve_insertion_order`` is set; both are
    restored after it. Why: DuckDB's default limit is 80% of RAM and its buffer pool keeps every
    block it read or wrote until that limit presses, so a long job's RSS grows with the data it
    touches, not with what it needs; under a cap it evicts clean blocks and spills operators to the
    store's temporary folder. Only for file-backed databases (an in-memory one has no such folder);
    elsewhere it changes nothing. A lowered limit is restored to within 0.05 of the unit DuckDB
    shows it in (it shows no more: ``'18.8 GiB'``)."""
    if not file_backed(con):
        yield
        return
    order = scalar(con, "SELECT current_setting('preserve_insertion_order')")
    limit = lower_memory_limit(con, cap_bytes)
    try:
        if preserve_insertion_order is not None:
            con.execute(f"SET preserve_insertion_order = {str(preserve_insertion_order).lower()}")
        yield
    finally:
        if limit is not None:  # DuckDB shows the limit truncated: restore the middle of what it shows
            con.execute(f"SET memory_limit = '{memory_bytes(limit, midpoint=True)}B'")
        con.execute(f"SET preserve_insertion_order = {str(bool(order)).lower()}")


def lower_memory_limit(con: duckdb.DuckDBPyConnection, cap_bytes: int) -> str | None:
    """Set DuckDB's ``memory_limit`` to ``cap_bytes`` where it is higher now; returns the limit it
    replaced (as DuckDB shows it), or None where it kept the connection's lower limit."""
    limit = str(scalar(con, "SELECT current_setting('memory_limit')"))
    if memory_bytes(limit) <= cap_bytes:
        return None
    con.execute(f"SET memory_limit = '{int(cap_bytes)}B'")
    return limit


# connection variable set by ``connect`` when its caller chose the memory limit (see ``connect``)
MEMORY_LIMIT_VAR = "equipoise_memory_limit_chosen"


def memory_limit_chosen(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's memory limit was chosen by its caller (``connect(memory_limit=)``)."""
    return bool(scalar(con, f"SELECT coalesce(getvariable('{MEMORY_LIMIT_VAR}'), false)"))


class StoreLockedError(StoreError):
    """Another process holds the store's write lock (DuckDB allows one writer per file)."""


def _lock_error(path: Path, exc: duckdb.IOException) -> StoreLockedError | None:
    """The plain error for a DuckDB IO error that says another process holds ``path``'s lock (None
    for any other IO error): what ``connect`` and ``_open_for_upkeep`` raise instead."""
    if "lock" not in str(exc).lower():
        return None
    return StoreLockedError(
        f"{path}: another process is writing this store; wait for it to finish and run again"
    )


def connect(
    path: Path, read_only: bool = False, memory_limit: str | None = None
) -> duckdb.DuckDBPyConnection:
    """Open the store; a writable connection brings the schema up to the latest migration.

    DuckDB lets one process write a file at a time; a second writer (or a reader while a writer
    holds it) gets :class:`StoreLockedError` with a plain message instead of a low-level IO error,
    and nothing in the file is touched.

    ``memory_limit`` (DuckDB syntax, e.g. ``"2GB"``) caps DuckDB's buffer memory for this
    connection; what does not fit (materialized metric tables, sorts, hash tables) spills to
    ``<store>.tmp`` next to the store and is removed when the connection closes. Without it DuckDB
    takes 80% of RAM, and a metrics pass over current facts then caps itself at the room left
    under 95% of the store file after the process's own memory (``registry.pass_memory_cap``:
    about half of a freshly built store at 1M predictions, 88% at 10M, at least 128 MiB); a limit
    given here is the caller's choice, higher or lower, and the pass keeps it (the connection
    variable ``MEMORY_LIMIT_VAR`` records it). An invalid value raises ``ValueError`` naming it.
    """
    check_duckdb_version()
    config: dict[str, str] = {}
    if memory_limit is not None:
        config = {"memory_limit": memory_limit, "temp_directory": f"{path}.tmp"}
    if read_only and not path.exists():
        raise FileNotFoundError(f"{path}: no such store")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=config)
    except (duckdb.InvalidInputException, duckdb.ParserException) as exc:
        raise ValueError(f"memory limit {memory_limit!r}: {first_line(exc)}") from exc
    except duckdb.IOException as exc:
        locked = _lock_error(path, exc)
        if locked is not None:
            raise locked from exc
        raise
    if memory_limit is not None:
        con.execute(f"SET VARIABLE {MEMORY_LIMIT_VAR} = true")
    try:
        current = store_version(con)
        if current > SCHEMA_VERSION:
            raise StoreOutdatedError(
                f"{path}: store schema v{current} is newer than this package (v{SCHEMA_VERSION}); "
                "upgrade equipoise"
            )
        if 0 < current < SCHEMA_VERSION:
            raise StoreOutdatedError(
                f"{path}: store schema v{current} is older than this package (v{SCHEMA_VERSION}); "
                f"upgrade it with: equipoise store migrate {path}"
            )
        if not read_only:
            migrate(con)
    except BaseException:
        con.close()
        raise
    return con


class StoreOutdatedError(StoreError):
    """The store was written by another schema version; the message names the fix."""


def store_version(con: duckdb.DuckDBPyConnection) -> int:
    """The store's schema version; 0 for an empty file (no ``schema_version`` table yet)."""
    exists = scalar(
        con,
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = 'schema_version'",
    )
    if not exists:
        return 0
    return int(scalar(con, "SELECT coalesce(max(version), 0) FROM main.schema_version"))


def migrate_store(path: Path) -> tuple[int, int]:
    """Upgrade the store file at ``path`` to :data:`SCHEMA_VERSION`, atomically.

    Why a copy: a migration that fails half-way (disk full, a kill, a bug) must leave the user's
    store exactly as it was. The store is first checkpointed (its write-ahead log folded into the
    file, no content change) and closed, which releases DuckDB's lock; this process then takes the
    same ``fcntl`` lock itself (``_file_locked``), checks that no other process wrote the store in
    between (``_check_unchanged``) and, holding the lock, copies it to ``<store>.migrating``, runs
    the migrations on the copy, checkpoints and closes it, and renames it over the original
    (``os.replace``, atomic on one file system). Under the lock no other process can open the store,
    so no write can land in the original while the copy is made from it and then be lost under the
    rename. The copy is made and, on any error, removed only while the lock is held, so a second
    migration started meanwhile cannot delete this one's copy (it fails on the lock). The original
    is untouched by any error. Returns (version before, version after); a store already at the
    latest version is left alone.

    The stamp check (size, mtime, no WAL) is stricter than the copy needs, as the copy is made
    under the lock anyway; it refuses rather than copy a store another process wrote moments before.
    Not covered: another connection to the same store open in *this* process (DuckDB shares one
    database per file within a process, so its lock outlives ``close`` here, and POSIX locks do not
    conflict within a process); that connection would go on writing the replaced file. Close every
    connection to the store before migrating it, as the CLI, a process of its own, always has.
    """
    path = Path(path)
    con = _open_for_upkeep(path)
    try:
        before = store_version(con)
        if before > SCHEMA_VERSION:
            raise StoreOutdatedError(
                f"{path}: store schema v{before} is newer than this package (v{SCHEMA_VERSION}); "
                "upgrade equipoise"
            )
        if before == SCHEMA_VERSION:
            return before, before
        con.execute("CHECKPOINT")
        stamp = _stamp(path)
    finally:
        con.close()
    tmp = path.with_name(path.name + ".migrating")
    with _file_locked(path, "migration") as fd:
        try:
            _check_unchanged(path, stamp, "migration")
            _remove_copy(tmp)  # a killed run's leftover: only a process holding the lock touches it
            if fd is None:  # no fcntl (Windows): nothing to lock, nor sendfile / pread to copy with
                shutil.copyfile(path, tmp)
            else:
                _copy_from(fd, tmp)
            con = duckdb.connect(str(tmp))
            try:
                after = migrate(con)
                con.execute("CHECKPOINT")
            finally:
                con.close()
            os.replace(tmp, path)
        except BaseException:
            _remove_copy(tmp)
            raise
    return before, after


def _remove_copy(tmp: Path, only: tuple[int, ...] | None = None) -> None:
    """Delete the working copy ``tmp`` of an upkeep command and its write-ahead log, where they exist.

    ``only``: None (the default) for a caller that holds the store, which deletes whatever is there
    (a killed run's leftover, or its own copy); else the ``_file_id`` of the caller's own copy,
    deleted only while ``tmp`` still is that file, for a caller that no longer holds the store.
    Why: ``store compact`` makes its copy under DuckDB's lock and renames it after closing its
    connection, and a second compaction that opened the store in between removes the first one's
    copy as a leftover and makes its own under the same name. The first one then fails (on the
    lock, or its copy gone) and must not delete the second one's copy. The check and the unlink
    are two steps, so a copy made again between them is still deleted; that second compaction then
    fails on its missing copy and the store stays as it was."""
    if only is not None and _file_id(tmp) != only:
        return
    for leftover in (tmp, Path(f"{tmp}.wal")):
        leftover.unlink(missing_ok=True)


def _open_for_upkeep(path: Path) -> duckdb.DuckDBPyConnection:
    """A writable connection to the existing store file at ``path``, opened as DuckDB finds it (no
    migration, no version check: ``migrate_store`` and ``compact_store`` do their own); a store
    another process holds is :class:`StoreLockedError`, a missing one ``FileNotFoundError``."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such store")
    check_duckdb_version()
    try:
        return duckdb.connect(str(path))
    except duckdb.IOException as exc:
        locked = _lock_error(path, exc)
        if locked is not None:
            raise locked from exc
        raise


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _tables_of(con: duckdb.DuckDBPyConnection, database: str) -> list[tuple[str, str]]:
    """(schema, table) of every table of the catalog ``database`` attached to ``con``, sorted."""
    return [
        (str(r[0]), str(r[1]))
        for r in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY ALL",
            [database],
        ).fetchall()
    ]


def _contents(con: duckdb.DuckDBPyConnection, database: str) -> dict[str, object]:
    """What a faithful copy of ``database`` (a catalog attached to ``con``) must hold: per table the
    columns (name, type, nullability, default), the row count and the sum of the rows' hashes
    (DuckDB ``hash`` over every column: order-free, one scan per table), plus the definitions of
    its views, key / check constraints, sequences and macros."""

    def rows(sql: str) -> list[tuple]:
        return [tuple(r) for r in con.execute(sql, [database]).fetchall()]

    out: dict[str, object] = {}
    for schema, table in _tables_of(con, database):
        cols = con.execute(
            "SELECT column_name, data_type, is_nullable, column_default FROM duckdb_columns() "
            "WHERE database_name = ? AND schema_name = ? AND table_name = ? ORDER BY column_index",
            [database, schema, table],
        ).fetchall()
        hashed = ", ".join(_ident(c[0]) for c in cols)
        count, total = con.execute(
            f"SELECT count(*), coalesce(sum(hash({hashed})), 0) "
            f"FROM {_ident(database)}.{_ident(schema)}.{_ident(table)}"
        ).fetchall()[0]
        out[f"table {schema}.{table}"] = ([tuple(c) for c in cols], count, total)
    out["views"] = rows(
        "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE database_name = ? AND NOT internal "
        "ORDER BY ALL"
    )
    out["constraints"] = rows(
        "SELECT schema_name, table_name, constraint_type, constraint_text FROM duckdb_constraints() "
        "WHERE database_name = ? AND constraint_type IN ('PRIMARY KEY', 'UNIQUE', 'CHECK', 'FOREIGN KEY') "
        "ORDER BY ALL"
    )
    out["sequences"] = rows(
        "SELECT schema_name, sequence_name, start_value, increment_by FROM duckdb_sequences() "
        "WHERE database_name = ? ORDER BY ALL"
    )
    out["macros"] = rows(
        "SELECT DISTINCT schema_name, function_name, macro_definition FROM duckdb_functions() "
        "WHERE database_name = ? AND NOT internal ORDER BY ALL"
    )
    return out


# DuckDB's memory_limit while a store is compacted, unless the caller gives one: the store file's
# size, at least this much (see compact_store)
COMPACT_MEMORY_FLOOR = 1 << 30


def _copy_table(con: duckdb.DuckDBPyConnection, source: str, target: str, schema: str, table: str) -> None:
    """Append every row of ``source``.``schema``.``table`` to the same table of ``target`` (matched
    by column name, in the order a scan reads them) and checkpoint ``target``: one transaction per
    table, so what a table's copy holds in memory is freed before the next."""
    name = f"{_ident(schema)}.{_ident(table)}"
    con.execute(f"INSERT INTO {_ident(target)}.{name} BY NAME SELECT * FROM {_ident(source)}.{name}")
    con.execute(f"CHECKPOINT {_ident(target)}")


@contextlib.contextmanager
def _file_locked(path: Path, what: str) -> Iterator[int | None]:
    """Hold an exclusive ``fcntl`` lock on the file ``path`` (the whole-file lock DuckDB takes to
    open it, shared for a reader) for the ``with`` block, which gets the locked file descriptor; a
    process that holds the file already is :class:`StoreLockedError`, its message naming ``what``
    this process was doing (the compaction, the migration). Where ``fcntl`` does not exist
    (Windows) the block runs unlocked and gets None: no descriptor is opened, since Windows
    refuses to rename a file over one that is open.

    Read the file through the descriptor given, never by opening it again: POSIX drops every lock a
    process holds on a file when it closes *any* descriptor of that file, so a second open and close
    (``shutil.copyfile``, ``path.read_bytes()``) would end the lock silently."""
    try:
        import fcntl
    except ImportError:  # not on POSIX
        yield None
        return
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise StoreLockedError(
                f"{path}: another process opened this store during the {what}; "
                "the store was left as it was, run again when it is free"
            ) from exc
        yield fd
    finally:
        os.close(fd)


def _stamp(path: Path) -> tuple[int, int]:
    """The size and modification time of the file ``path``: what any write to it changes."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _check_unchanged(path: Path, stamp: tuple[int, int], what: str) -> None:
    """Raise :class:`StoreLockedError` where the store ``path`` no longer has the ``_stamp`` it had
    when this process closed it, or has a write-ahead log: another process opened it for writing
    in between, and a copy made earlier (or made now, of a store mid-write) would lose its rows."""
    if _stamp(path) != stamp or Path(f"{path}.wal").exists():
        raise StoreLockedError(
            f"{path}: another process wrote this store during the {what}; "
            "the store was left as it was, run again"
        )


def _copy_from(fd: int, target: Path) -> None:
    """Copy the whole file open as ``fd`` to a new file ``target``, flushed to disk; ``fd`` stays
    open and its offset unmoved (``_file_locked``). In the kernel where it can (``os.sendfile``, as
    ``shutil.copyfile`` does on Linux, and as fast: a 4 GiB store took 9-14 s read and written
    through Python, benchmarks/RESULTS.md, stop 35), else by ``os.pread`` from where it stopped."""
    size = os.fstat(fd).st_size
    done = 0
    out_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with contextlib.suppress(AttributeError, OSError):  # no sendfile, or not for files here
            while done < size:
                sent = os.sendfile(out_fd, fd, done, min(size - done, _COPY_CHUNK))
                if sent == 0:
                    break
                done += sent
        while done < size:  # both paths write at out_fd's own offset, which is `done` bytes in
            chunk = memoryview(os.pread(fd, min(size - done, _COPY_CHUNK), done))
            if not chunk:
                raise OSError(f"{target}: the store ended at {done} of {size} bytes while it was copied")
            while chunk:
                written = os.write(out_fd, chunk)
                chunk = chunk[written:]
                done += written
        os.fsync(out_fd)
    finally:
        os.close(out_fd)


_COPY_CHUNK = 64 << 20  # bytes per call while a locked store is copied (``_copy_from``)


def compact_store(path: Path, memory_limit: str | None = None) -> tuple[int, int]:
    """Rewrite the store file at ``path`` without its free space, atomically; returns the file's
    size in bytes (before, after).

    Why: DuckDB reuses the free blocks of a file but never returns them to the file system. When the
    fact tables are rewritten in place (``facts.refresh`` after a package upgrade that changes
    their definitions, with ``force``, or per changed run) their old rows become free blocks, so a
    store refreshed once can stay much larger than the same content written fresh (at 1M
    predictions 687 against 417 MiB, benchmarks/RESULTS.md, stop 33). Backups copy the dead
    blocks, and a metrics pass sizes its memory cap by the file (``registry.pass_memory_cap``).

    How: a writable connection (DuckDB's lock: no other process can open the store meanwhile)
    checkpoints the store (its write-ahead log folded in), creates the schema in a fresh file
    ``<store>.compacting`` (DuckDB ``COPY FROM DATABASE ... (SCHEMA)``: tables with their keys,
    views, sequences, macros) and copies the rows table by table (``_copy_table``). The copy is
    then closed, attached again read-only and compared with the original: per table the columns,
    the row count and the sum of the rows' hashes, and the views, constraints, sequences and macros
    by definition (``_contents``). The connection is closed, which releases DuckDB's lock; this
    process then takes the same ``fcntl`` lock itself (``_file_locked``; a process that got in
    between fails it) and checks that the store's size and modification time are those it had
    after the checkpoint and that no write-ahead log appeared, before renaming the copy over it
    (``os.replace``, atomic on one file system). Any error or difference removes the copy (once
    the store is let go, only while the file under the copy's name is still this run's:
    ``_remove_copy``, ``_file_id``) and leaves the store as it was (:class:`StoreError` names a
    difference). The content is the same, so the facts' fingerprint still matches it and no
    refresh follows. Needs free disk space for the compacted size.

    Memory: ``memory_limit`` (DuckDB syntax), by default the store file's size and at least
    ``COMPACT_MEMORY_FLOOR``, with spills to ``<store>.tmp``. Why table by table and capped: one
    ``COPY FROM DATABASE`` is one transaction, and over a 10M-prediction store (4.0 GiB) under
    DuckDB's default limit (80% of RAM) it held 8.3 GiB at its peak (101 s); table by table under
    the default here it peaked at 4.2 GiB (74 s). The limit cannot go far below the store: the
    primary-key index of ``options`` is rebuilt in memory (a prototype of this copy failed at 10M
    under 1 GB and peaked at 3.0 GiB under 3 GB).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".compacting")
    mine: tuple[int, ...] | None = None  # _file_id of this run's copy, once it is finished
    started = False  # whether this run has cleared the copy's name and begun its copy there
    con = _open_for_upkeep(path)
    try:
        try:
            con.execute("CHECKPOINT")
            before = path.stat().st_size
            limit = f"{max(before, COMPACT_MEMORY_FLOOR)}B" if memory_limit is None else memory_limit
            try:
                con.execute(f"SET memory_limit = {sql_literal(limit)}")
            except (duckdb.InvalidInputException, duckdb.ParserException) as exc:
                raise ValueError(f"memory limit {memory_limit!r}: {first_line(exc)}") from exc
            con.execute(f"SET temp_directory = {sql_literal(f'{path}.tmp')}")
            con.execute("SET enable_progress_bar = false")
            _remove_copy(tmp)  # a leftover (a killed run's, or another compaction's: see there)
            started = True
            source = str(scalar(con, "SELECT current_database()"))
            target = "equipoise_compacted" if source != "equipoise_compacted" else "equipoise_compacted_2"
            con.execute(f"ATTACH {sql_literal(str(tmp))} AS {_ident(target)}")
            try:
                con.execute(f"COPY FROM DATABASE {_ident(source)} TO {_ident(target)} (SCHEMA)")
                for schema, table in _tables_of(con, source):
                    _copy_table(con, source, target, schema, table)
            finally:
                con.execute(f"DETACH {_ident(target)}")
            # the copy as a reader will find it on disk, not as the writer's memory holds it
            con.execute(f"ATTACH {sql_literal(str(tmp))} AS {_ident(target)} (READ_ONLY)")
            try:
                same = _contents(con, target) == _contents(con, source)
            finally:
                con.execute(f"DETACH {_ident(target)}")
            if not same:
                raise StoreError(
                    f"{path}: the compacted copy differs from the store; the store was left as it was"
                )
            stamp = _stamp(path)
            mine = _file_id(tmp)  # the finished copy: the only one this run may rename or delete
        except BaseException as exc:
            if started:  # the store still held: what is under the copy's name is this run's
                _remove_copy(tmp)
            if isinstance(exc, duckdb.OutOfMemoryException):
                raise StoreError(
                    f"{path}: out of memory while copying ({first_line(exc)}); "
                    "raise --memory-limit; the store was left as it was"
                ) from exc
            raise
        finally:
            con.close()
        with _file_locked(path, "compaction"):
            _check_unchanged(path, stamp, "compaction")
            if _file_id(tmp) != mine:  # e.g. another compaction, holding the store meanwhile, removed it
                raise StoreLockedError(
                    f"{path}: another process removed or replaced the compacted copy {tmp.name} "
                    "before it could replace the store; the store was left as it was, run again"
                )
            os.replace(tmp, path)
    except BaseException:
        if mine is not None:  # made, and no longer under DuckDB's lock: deleted only if still this run's
            _remove_copy(tmp, mine)
        raise
    return before, path.stat().st_size


def _file_id(path: Path) -> tuple[int, ...] | None:
    """The identity of the file ``path`` (device, inode, size, modification time), None where there
    is none: what tells this run's copy from one another process made again under the same name.
    Not the inode alone: file systems reuse a freed inode number at once (ext4 did in 2,000 of
    2,000 tries here), and two copies of one store can have the same size, so the later copy is
    told apart by its modification time. That needs timestamps finer than the time between the two
    copies: nanoseconds on ext4, XFS, btrfs and APFS; on a file system with 1-2 s timestamps (FAT,
    ext3) two copies of a small store made within one tick could look the same."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply every migration newer than the store's version, each in its own transaction."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
    current = int(scalar(con, "SELECT coalesce(max(version), 0) FROM schema_version"))
    if current > SCHEMA_VERSION:
        raise RuntimeError(f"store schema v{current} is newer than this package (v{SCHEMA_VERSION})")
    for version, sql in MIGRATIONS:
        if version > current:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(sql)
                con.execute("INSERT INTO schema_version VALUES (?)", [version])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            current = version
    return current


def insert_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> int:
    """Insert an Arrow table in one transaction; existing keys are left untouched. Returns rows added.
    ``option_scores`` (long rows: run_id, item_id, sample_index, label, logprob) is folded into the
    score lists of the stored predictions (:func:`insert_batch`); the rows added are then the
    scores attached."""
    if table.num_rows == 0:
        return 0
    before = count_rows(con, name)
    insert_batch(con, [], tables=[(name, table)])
    return count_rows(con, name) - before


def count_rows(con: duckdb.DuckDBPyConnection, name: str, run_id: str | None = None) -> int:
    """The rows of table ``name`` (those of run ``run_id`` only, where given: DuckDB then reads
    only that run's row groups); for the view ``option_scores``, its scores, counted from the list
    lengths without unnesting them."""
    where = "" if run_id is None else f" WHERE run_id = {sql_literal(run_id)}"
    if name == "option_scores":
        return int(scalar(con, f"SELECT coalesce(sum(len(score_labels)), 0) FROM predictions{where}"))
    return int(scalar(con, f"SELECT count(*) FROM {name}{where}"))


def _append_sql(
    name: str,
    columns: Sequence[str],
    source: str,
    unique: bool = False,
    run_ids: Sequence[str] | None = None,
) -> str:
    """The idempotent insert of ``source`` into table ``name``: INSERT OR IGNORE where the table
    has a primary key; for a hot table (:data:`HOT_KEYS`) the rows whose key is not stored yet,
    the first of any key repeated within the batch (``unique``: the caller checked there is none).
    ``run_ids`` (with ``unique``): the caller already knows every run id ``source`` holds, so the
    stored rows to compare against are picked by that list instead of a second pass over
    ``source`` (which may be a query, not a table)."""
    cols = ", ".join(columns)
    key = HOT_KEYS.get(name)
    if key is None:
        return f"INSERT OR IGNORE INTO {name} ({cols}) SELECT {cols} FROM {source}"
    keys = ", ".join(key)
    on = " AND ".join(f"t.{k} = s.{k}" for k in key)
    if unique:
        among = ", ".join(map(sql_literal, run_ids)) if run_ids else f"SELECT DISTINCT run_id FROM {source}"
        return f"""
        INSERT INTO {name} ({cols})
        SELECT {cols} FROM {source} s
        WHERE NOT EXISTS (
            SELECT 1 FROM {name} t
            WHERE {on} AND t.run_id IN ({among})
        )
    """
    return f"""
        INSERT INTO {name} ({cols})
        SELECT {cols} FROM (
            SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY _pos) AS _nth
            FROM (SELECT *, row_number() OVER () AS _pos FROM {source}) s
            WHERE NOT EXISTS (
                SELECT 1 FROM {name} t
                WHERE {on}
                  AND t.run_id IN (SELECT DISTINCT run_id FROM {source})
            )
        )
        WHERE _nth = 1
    """


def _holds_runs(con: duckdb.DuckDBPyConnection, name: str, run_ids: Sequence[str]) -> bool:
    """Whether hot table ``name`` already holds a row of any of ``run_ids``: when it does not, a
    batch whose keys are known unique can be appended without the anti-join (which would hash
    every incoming key only to find nothing)."""
    among = ", ".join(map(sql_literal, run_ids))
    return bool(con.execute(f"SELECT 1 FROM {name} WHERE run_id IN ({among}) LIMIT 1").fetchall())


def insert(con: duckdb.DuckDBPyConnection, model: type[BaseModel], rows: Sequence[BaseModel]) -> int:
    """Insert validated rows (pydantic) in one transaction; returns rows added."""
    if not rows:
        return 0
    return insert_table(con, _TABLES[model], to_table(model, list(rows)))


class SelectInsert(NamedTuple):
    """Rows DuckDB computes itself, appended to hot table ``table`` by :func:`insert_selects`.

    ``append_only`` is the caller's own answer to whether ``table`` holds no row of the batch's
    run ids: True appends plainly, False compares against the stored keys (the anti-join), None
    asks the table. It is carried by each select, not inferred from the table's name, because a
    caller may have built its query on that answer: the importer's first-import query checks
    every record inside the INSERT, which only a plain append runs on every row, so the choice
    here must be the one the query was built for, not a second look that could differ."""

    table: str
    columns: Sequence[str]
    query: str
    append_only: bool | None = None


def insert_batch(
    con: duckdb.DuckDBPyConnection,
    batches: list[tuple[type[BaseModel], Sequence[BaseModel]]],
    tables: list[tuple[str, pa.Table]] | None = None,
    unique: bool = False,
    selects: Sequence[SelectInsert] = (),
    run_ids: Sequence[str] | None = None,
) -> None:
    """Insert several tables' rows in ONE transaction: a prediction and its option scores are
    committed together or not at all, so a kill between them can never leave half a sample.
    ``tables`` takes already-built Arrow tables (bulk paths that skip per-row objects).
    ``unique=True`` says the caller has already checked that no key repeats within ``tables``
    (the importer does), which spares the hot tables the in-batch de-duplication. ``selects``
    (see :func:`insert_selects`) are queries whose rows are appended last, in the same transaction,
    each plainly or through the anti-join as its ``append_only`` says (None: as the table says).
    A batch that adds items or options also refreshes the option bits (schema v4) of the items it
    touched, or of every item where the bits were stale before it, in the same transaction."""
    # (table, rows, keys known unique, rows validated by their pydantic model)
    todo = [(_TABLES[m], to_table(m, list(rows)), False, True) for m, rows in batches if rows]
    todo += [(name, t, unique, False) for name, t in (tables or []) if t.num_rows]
    # option scores are not a table of their own (schema v3): they ride on their predictions
    scores = [t for name, t, _, _ in todo if name == "option_scores"]
    todo = [row for row in todo if row[0] != "option_scores"]
    # the batch's items and options tables, whose items' option bits it refreshes; whether the
    # bits matched the options before this batch (read before it adds any): if not (an edit by
    # plain SQL), refreshing only the batch's items would record the new count over stale bits
    # elsewhere, so the whole table is refreshed instead
    shared = [t for name, t, _, _ in todo if name in ("items", "options")]
    bits_current = not shared or option_bits_current(con)
    # rows the batch added to items and options: none added and the bits current, nothing to refresh
    added_shared = 0
    con.execute("BEGIN TRANSACTION")
    try:
        if scores:
            _stage_scores(con, scores)
        # whether every incoming prediction row was appended (then the staged scores of its samples
        # went in with it, and only the other samples' scores are left to attach)
        all_appended = True
        for i, (name, table, known_unique, validated) in enumerate(todo):
            view = f"_incoming_{i}"
            con.register(view, table)
            source = view
            if name == "predictions":
                if not validated:  # PredictionRow checked a model's lists already
                    _check_score_lists(con, view, table.column_names)
                if scores or not set(SCORE_COLUMNS) <= set(table.column_names):
                    source = _with_scores(view, table.column_names, bool(scores))
            added = con.execute(
                _append_sql(name, _stored_columns(name, table.column_names), source, unique=known_unique)
            ).fetchall()
            if name == "predictions" and (not added or added[0][0] < table.num_rows):
                all_appended = False
            if name in ("items", "options") and added:
                added_shared += int(added[0][0])
            con.unregister(view)
        if scores:
            predictions = [t for name, t, _, _ in todo if name == "predictions"]
            _attach_remaining_scores(con, predictions if all_appended else [])
        # the option bits of every item the batch wrote or gave options to, in the same transaction
        if shared and not bits_current:
            _refresh_bits(con)
        elif shared and added_shared:
            import pyarrow as pa  # a writer's import (module note on pyarrow)

            string = pa.schema([(c, pa.string()) for c in _ITEM_KEY])
            con.register(
                "_touched_items", pa.concat_tables([t.select(_ITEM_KEY).cast(string) for t in shared])
            )
            try:
                # each key column among the touched ones: a superset of the touched items (an item
                # of another config with a touched id), each recomputed from its own options
                among = " AND ".join(f"{c} IN (SELECT {c} FROM _touched_items)" for c in _ITEM_KEY)
                _refresh_bits(con, f"WHERE {among}")
            finally:
                con.unregister("_touched_items")
        for name, columns, query, append_only in selects:
            if append_only is not None:
                plain = append_only
            else:
                plain = bool(run_ids) and not _holds_runs(con, name, run_ids)
            if plain:
                # no stored row of these runs: nothing to compare against, a plain append
                con.execute(f"INSERT INTO {name} ({', '.join(columns)}) {query}")
            else:
                con.execute(_append_sql(name, columns, f"({query})", unique=True, run_ids=run_ids))
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


_ITEM_KEY = ["dataset_id", "config", "item_id"]  # an item's key, in items and in options


def option_bits_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``options`` holds the number of rows the option bits were last computed from (a
    count DuckDB answers from its metadata: no scan)."""
    query = "SELECT value = (SELECT count(*) FROM options)::VARCHAR FROM store_meta WHERE key = ?"
    got = con.execute(query, [OPTION_BITS_KEY]).fetchall()
    return bool(got and got[0][0])


def refresh_option_bits(con: duckdb.DuckDBPyConnection) -> None:
    """Recompute every item's option bits from ``options`` and record the rows they came from."""
    _refresh_bits(con)


def _refresh_bits(con: duckdb.DuckDBPyConnection, where: str = "") -> None:
    """Recompute the option bits of the items ``where`` selects (every item for "") and record the
    options' row count. Only for all items, or for the items a batch wrote over bits that were
    current before it: the count says every item's bits are current. The count is recorded after
    the bits are written: a crash between the two only means another refresh next time."""
    con.execute(_update_bits_sql(where)).fetchall()
    con.execute(_RECORD_BITS).fetchall()


def ensure_option_bits(con: duckdb.DuckDBPyConnection) -> bool:
    """Refresh the option bits unless :func:`option_bits_current`; returns whether it refreshed.
    Every writer in this module keeps the bits current, so this costs a metadata count except
    after ``options`` was edited by other means (then one full refresh: about 1.6 s for 1M items
    of four options, stop 42)."""
    if option_bits_current(con):
        return False
    refresh_option_bits(con)
    return True


_SCORE_KEY = HOT_KEYS["predictions"]  # a sample's key: its scores are keyed as its prediction row


def _stored_columns(name: str, columns: Sequence[str]) -> list[str]:
    """The columns an append of ``name`` writes: for predictions, the score lists too (folded in
    from the batch's option scores where the rows do not carry them)."""
    cols = list(columns)
    if name == "predictions":
        cols += [c for c in SCORE_COLUMNS if c not in cols]
    return cols


def _stage_scores(con: duckdb.DuckDBPyConnection, tables: list[pa.Table]) -> None:
    """The batch's long option scores as one row per sample (TEMP ``_scores_in``: the key and the
    two lists, sorted by label). A label repeated for one sample keeps its first score, as the
    long table's anti-join kept the first row of a repeated key."""
    parts = []
    for i, table in enumerate(tables):
        con.register(f"_scores_{i}", table)
        parts.append(f"SELECT run_id, item_id, sample_index, label, logprob, {i} AS _t FROM _scores_{i}")
    union = " UNION ALL ".join(f"SELECT *, row_number() OVER () AS _pos FROM ({part})" for part in parts)
    try:
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _scores_in AS
                SELECT run_id, item_id, sample_index::INTEGER AS sample_index,
                       list(label ORDER BY label) AS score_labels,
                       list(logprob ORDER BY label) AS score_logprobs
                FROM (SELECT *, row_number() OVER (PARTITION BY run_id, item_id, sample_index, label
                                                   ORDER BY _t, _pos) AS _nth
                      FROM ({union}))
                WHERE _nth = 1
                GROUP BY run_id, item_id, sample_index"""
        )
    finally:
        for i in range(len(tables)):
            con.unregister(f"_scores_{i}")


_SCORE_TYPES = {"score_labels": "VARCHAR[]", "score_logprobs": "DOUBLE[]"}


def _with_scores(view: str, columns: Sequence[str], staged: bool) -> str:
    """The incoming predictions ``view`` with their score lists: those the rows carry, else the
    staged scores of their samples (``staged``: ``_scores_in`` exists), else NULL (rows written
    without the columns, e.g. a Parquet part from before schema v3)."""
    keep = ", ".join(f"p.{c}" for c in columns if c not in SCORE_COLUMNS)

    def value(c: str) -> str:
        own = f"p.{c}" if c in columns else f"NULL::{_SCORE_TYPES[c]}"
        return f"coalesce({own}, s.{c})" if staged else own

    lists = ", ".join(f"{value(c)} AS {c}" for c in SCORE_COLUMNS)
    if not staged:
        return f"(SELECT {keep}, {lists} FROM {view} p)"
    on = " AND ".join(f"p.{k} = s.{k}" for k in _SCORE_KEY)
    return f"(SELECT {keep}, {lists} FROM {view} p LEFT JOIN _scores_in s ON {on})"


def _check_score_lists(con: duckdb.DuckDBPyConnection, view: str, columns: Sequence[str]) -> None:
    """Refuse incoming prediction rows whose own score lists break the layout that
    ``PredictionRow`` checks (rows that arrive as an Arrow table, e.g. a Parquet part, skip it):
    the two lists together or not at all, of one non-zero length, the labels distinct and sorted."""
    if not set(SCORE_COLUMNS) <= set(columns):
        return
    bad = con.execute(
        f"""SELECT run_id, item_id, sample_index FROM {view}
            WHERE (score_labels IS NULL) <> (score_logprobs IS NULL)
               OR len(score_labels) = 0 OR len(score_labels) <> len(score_logprobs)
               OR score_labels <> list_sort(list_distinct(score_labels))
            LIMIT 1"""
    ).fetchall()
    if bad:
        run_id, item_id, sample = bad[0]
        raise ValueError(
            f"prediction run {run_id} item {item_id} sample {sample}: score_labels and score_logprobs must "
            "be given together, of one non-zero length, the labels distinct and sorted"
        )


def _attach_remaining_scores(con: duckdb.DuckDBPyConnection, predictions: list[pa.Table]) -> None:
    """Give the staged scores whose samples were not among ``predictions`` (the batch's prediction
    rows, all of them appended with their scores; empty when some were already stored) to the
    stored predictions that have none yet. A stored sample's scores are never replaced, so a
    label sent later for a sample stored with scores is not added (idempotent, like the other
    writes). Scores of a sample that is not stored at all are refused (ValueError naming it), and
    the caller's transaction is rolled back with them; the TEMP tables go with that rollback, so
    they are dropped here only on success (a DROP in an aborted transaction would replace the
    error that aborted it)."""
    rest = "_scores_in"
    if predictions:
        for i, table in enumerate(predictions):
            con.register(f"_batch_{i}", table.select(list(_SCORE_KEY)))
        batch = " UNION ALL ".join(f"SELECT * FROM _batch_{i}" for i in range(len(predictions)))
        on = " AND ".join(f"b.{k} = s.{k}" for k in _SCORE_KEY)
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _scores_rest AS SELECT * FROM _scores_in s
                WHERE NOT EXISTS (SELECT 1 FROM ({batch}) b WHERE {on})"""
        )
        for i in range(len(predictions)):
            con.unregister(f"_batch_{i}")
        rest = "_scores_rest"
    if scalar(con, f"SELECT count(*) FROM {rest}"):
        # the runs as literals: DuckDB prunes the predictions' row groups on them, which a subquery
        # would not let it do
        runs = ", ".join(
            sql_literal(r[0]) for r in con.execute(f"SELECT DISTINCT run_id FROM {rest}").fetchall()
        )
        on = " AND ".join(f"t.{k} = s.{k}" for k in _SCORE_KEY)
        con.execute(
            f"""UPDATE predictions t SET score_labels = s.score_labels, score_logprobs = s.score_logprobs
                FROM {rest} s WHERE {on} AND t.score_labels IS NULL AND t.run_id IN ({runs})"""
        )
        missing = con.execute(
            f"""SELECT run_id, item_id, sample_index FROM {rest} s
                WHERE NOT EXISTS (SELECT 1 FROM predictions t WHERE {on} AND t.run_id IN ({runs}))
                ORDER BY ALL LIMIT 1"""
        ).fetchall()
        if missing:
            run_id, item_id, sample = missing[0]
            raise ValueError(
                f"option scores for run {run_id} item {item_id} sample {sample}, which has no prediction: "
                "a sample's scores are stored on its prediction row, so write the prediction with them"
            )
    con.execute("DROP TABLE IF EXISTS _scores_in")
    con.execute("DROP TABLE IF EXISTS _scores_rest")


def insert_selects(
    con: duckdb.DuckDBPyConnection,
    batches: list[tuple[type[BaseModel], Sequence[BaseModel]]],
    selects: Sequence[SelectInsert],
    run_ids: Sequence[str],
) -> None:
    """Like :func:`insert_batch`, for bulk rows that DuckDB computes itself: each
    :class:`SelectInsert` inserts the rows of ``query`` (SQL whose result has ``columns``) that are not
    stored yet, all in ONE transaction with ``batches``. The caller vouches that no key repeats
    within a query and that ``run_ids`` are all the runs the queries write (the importer checks
    both), so the rows never leave DuckDB: no Arrow copy out and back in. Each select's
    ``append_only`` (see :class:`SelectInsert`) says whether its table is known to hold no row of
    ``run_ids``; None asks the table."""
    if any(sel.table not in HOT_KEYS for sel in selects):
        raise ValueError("insert_selects writes the hot table only (predictions, with its option scores)")
    insert_batch(con, batches, selects=selects, run_ids=run_ids)
