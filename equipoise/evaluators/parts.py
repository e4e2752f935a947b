"""Parquet part files: the store's rows written by shards and Ray workers, merged idempotently.

A worker that cannot share the DuckDB file (DuckDB allows one writer) writes each committed batch as
one *part*: a folder ``DIR/<name>/`` holding one Parquet file per store table it has rows for
(``predictions.parquet``, ``option_scores.parquet``, and for a run's first part also ``runs``,
``datasets``, ``items``, ``options``). Column names and Arrow types come from the row models in
:mod:`store` (``features.to_table``), so a part has exactly the store's row layout and nothing is
copied by hand.

Atomicity: a part is written into a hidden ``DIR/.tmp-<name>`` folder and renamed into place in one
``os.rename`` (atomic on POSIX), so a worker killed mid-write leaves only a hidden folder that every
reader ignores; the items it held are missing, and the next run of that shard asks for them again.
A prediction and its option scores are in the same part, so they are visible together or not at all.

Ingest (:func:`ingest_parts`) goes through :func:`store.insert_batch` (``INSERT OR IGNORE`` on the
store's primary keys), so ingesting the same part twice adds nothing. One rule comes from the
runner: an ``error`` row records a request that got no answer and is asked again on resume, so an
answer for the same (run, item, sample) in a later part replaces a stored error row, never the
other way round.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from equipoise.evaluators.store import (
    SCORE_COLUMNS,
    TABLE_MODELS,
    connect_memory,
    count_rows,
    insert_batch,
    primary_key,
    scalar,
)
from equipoise.schemas.features import to_table

# order of ingest inside one transaction: what predictions refer to comes first
TABLE_ORDER = ("datasets", "items", "options", "runs", "predictions", "option_scores")
TMP_PREFIX = ".tmp-"


def part_dirs(root: Path) -> list[Path]:
    """Committed parts under ``root`` in name order (hidden in-progress folders excluded)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def write_part(root: Path, name: str, rows: dict[str, Sequence[BaseModel] | pa.Table]) -> Path | None:
    """Write one part atomically; returns its folder (None when every table was empty).

    ``rows`` maps a store table name to validated row models (or an Arrow table already in the
    store layout). An existing part of the same name is left as it is: part names are derived from
    content keys, so a rewrite would hold the same rows."""
    final = root / name
    if final.exists():
        return final
    tables: dict[str, pa.Table] = {}
    for table, data in rows.items():
        t = data if isinstance(data, pa.Table) else to_table(TABLE_MODELS[table], list(data))
        if t.num_rows:
            tables[table] = t
    if not tables:
        return None
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for table, t in tables.items():
            pq.write_table(t, tmp / f"{table}.parquet")
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.exists():  # another worker wrote the same part first
            return final
        raise
    return final


def read_part_table(part: Path, table: str) -> pa.Table | None:
    """One table of a part, checked against the store's row layout (one-line error naming the file)."""
    f = part / f"{table}.parquet"
    if not f.exists():
        return None
    t = pq.read_table(f)
    want = to_table(TABLE_MODELS[table], []).schema
    if table == "predictions" and t.schema.names == [n for n in want.names if n not in SCORE_COLUMNS]:
        # a part written before store schema v3: its option scores are in option_scores.parquet,
        # which the ingest folds into these rows' (here empty) score lists
        for name in SCORE_COLUMNS:
            t = t.append_column(name, pa.nulls(t.num_rows, want.field(name).type))
    if t.schema.names != want.names:
        raise ValueError(f"{f}: columns {t.schema.names} are not the store's {table} columns {want.names}")
    try:
        return t.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"{f}: column types differ from the store's {table} table ({exc})") from exc


@dataclass
class IngestSummary:
    parts: int = 0
    added: dict[str, int] = field(default_factory=dict)
    replaced_errors: int = 0

    @property
    def predictions_added(self) -> int:
        return self.added.get("predictions", 0)


def ingest_parts(
    con: duckdb.DuckDBPyConnection, root: Path, only: Sequence[Path] | None = None
) -> IngestSummary:
    """Merge the committed parts under ``root`` (or just ``only``) into the store ``con``."""
    parts = list(only) if only is not None else part_dirs(root)
    out = IngestSummary(parts=len(parts))
    if not parts:
        return out
    incoming: dict[str, pa.Table] = {}
    for table in TABLE_ORDER:
        got = [t for p in parts if (t := read_part_table(p, table)) is not None]
        if got:
            incoming[table] = pa.concat_tables(got)
    # count_rows: the view option_scores counted from its list lengths, not by unnesting every score
    before = {t: count_rows(con, t) for t in incoming}
    if "predictions" in incoming:
        incoming["predictions"], out.replaced_errors = _answers_first(con, incoming["predictions"])
    insert_batch(con, [], tables=[(t, incoming[t]) for t in TABLE_ORDER if t in incoming])
    out.added = {t: count_rows(con, t) - before[t] for t in incoming}
    return out


def _answers_first(con: duckdb.DuckDBPyConnection, preds: pa.Table) -> tuple[pa.Table, int]:
    """One row per prediction key, an answer preferred to an error row; stored error rows that an
    incoming answer supersedes are deleted (the runner's resume rule, applied across parts)."""
    key = ", ".join(primary_key(con, "predictions"))
    con.register("_parts_preds", preds)
    try:
        best = con.sql(
            f"SELECT * FROM _parts_preds QUALIFY row_number() OVER "
            f"(PARTITION BY {key} ORDER BY (outcome = 'error'), raw_output) = 1"
        ).to_arrow_table()
        con.register("_parts_best", best)
        cond = " AND ".join(f"p.{k} = b.{k}" for k in primary_key(con, "predictions"))
        n = int(
            scalar(
                con,
                f"SELECT count(*) FROM predictions p JOIN _parts_best b ON {cond} "
                "WHERE p.outcome = 'error' AND b.outcome <> 'error'",
            )
        )
        if n:
            con.execute(
                f"DELETE FROM predictions p USING _parts_best b WHERE {cond} "
                "AND p.outcome = 'error' AND b.outcome <> 'error'"
            )
        con.unregister("_parts_best")
    finally:
        con.unregister("_parts_preds")
    return best.cast(preds.schema), n


def open_parts(root: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory store holding every committed part under ``root``: metrics and SQL run on it
    exactly as on a store file, without merging the parts into one."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder of parts")
    if not part_dirs(root):
        raise FileNotFoundError(f"{root}: no Parquet parts here (write some with equipoise eval --parts)")
    con = connect_memory()
    ingest_parts(con, root)
    return con
