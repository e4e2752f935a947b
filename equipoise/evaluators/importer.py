"""Import predictions made elsewhere (JSONL or Parquet) into the store.

Format: one record per (item, sample), described by :class:`ImportedPrediction` (``equipoise schema
prediction`` prints its JSON Schema). Each record names its run (model, backend, prompt template
hash, dataset version, config) so imported rows are as traceable as native ones.

The whole file is checked before anything is written: bytes that are not UTF-8, bad JSON, a missing
or mistyped field, a number the store cannot hold, an unknown dataset version, an item not in that
dataset config, a label that is not one of the item's options, a NaN / infinite log-probability, or
a repeated (run, item, sample) each raise :class:`ImportError_` naming file, line and field. Only a
file that passes completely is inserted, in one transaction, so nothing already stored is lost
by a failed import (at most the items' derived option bits were refreshed first, where plain SQL
had changed the options), and importing the same file twice adds nothing (primary keys).

Two paths, one behaviour. A valid file is imported column by column (:func:`_fast_import`): Arrow
parses the whole JSONL or Parquet file into typed columns, DuckDB reads them in place and checks
every constraint above as a set operation (types, ranges, patterns, finiteness once per row; the
run fields once per distinct run; stored dataset / item / labels through the bitmask of each
item's options stored on ``items``, schema v4; repeated keys), then inserts the rows straight from
SQL (option scores by one UNNEST pass over the records; a run with no stored rows yet is
appended without the anti-join against stored keys, and its item / label checks run inside that
INSERT, which raises and rolls the transaction back at the first failing record); only records
without a ``parsed_label`` go through the answer parser one by one. Whenever that path is not
certain a file is valid (any check fails, a type it does not expect, a ``null`` that JSON could
mean as "absent"), it writes nothing and the record-by-record path (pydantic per record) runs
instead and names the first problem by file, line and field. Both paths write identical rows
(tested on files of every allowed shape) and refuse the same files (tested on crafted bad files).
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.compute
import pyarrow.json
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from equipoise import __version__
from equipoise.evaluators.backends.base import Decoding
from equipoise.evaluators.parsing import parse_answer
from equipoise.evaluators.runner import run_id_for
from equipoise.evaluators.store import (
    OPTION_LABEL_BITS,
    PredictionRow,
    RunRow,
    SelectInsert,
    _holds_runs,
    ensure_option_bits,
    insert_batch,
    insert_selects,
    sql_literal,
)
from equipoise.schemas.clindet import canonical_json
from equipoise.schemas.features import arrow_schema


class ImportError_(ValueError):
    """A record that cannot be imported; the message is 'file:line: field: reason'."""


_INT32_MAX = 2**31 - 1  # the store keeps sample_index and n_output_tokens as INTEGER


class ImportedPrediction(BaseModel):
    """One prediction made outside Equipoise."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="Model name as served.")
    backend: str = Field(default="import", description="Where it ran, e.g. 'import:my-harness'.")
    prompt_template_id: str = Field(min_length=1)
    prompt_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    prompt_style: str = "base"
    dataset_id: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the dataset's manifest.json")
    config: str
    item_id: str
    sample_index: int = Field(default=0, ge=0, le=_INT32_MAX)
    raw_output: str
    parsed_label: str | None = Field(
        default=None, description="If absent, Equipoise parses raw_output with its own parser."
    )
    option_logprobs: dict[str, float] | None = Field(
        default=None, description="Log-probability per option label at the answer position."
    )
    token_logprobs: list[float] | None = Field(default=None, description="Per generated token.")
    n_output_tokens: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    latency_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    @field_validator("option_logprobs")
    @classmethod
    def _finite_options(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k, x in (v or {}).items():
            if not math.isfinite(x) or x > 1e-9:
                raise ValueError(f"option_logprobs[{k!r}] = {x} is not a finite log-probability <= 0")
        return v

    @field_validator("token_logprobs")
    @classmethod
    def _finite_tokens(cls, v: list[float] | None) -> list[float] | None:
        for i, x in enumerate(v or []):
            if not math.isfinite(x):
                raise ValueError(f"token_logprobs[{i}] = {x} is not finite")
        return v


PREDICTION_FRAME = pa.DataFrameSchema(
    {
        "run_id": pa.Column(str),
        "item_id": pa.Column(str),
        "sample_index": pa.Column(int, pa.Check.ge(0)),
        "outcome": pa.Column(str, pa.Check.isin(["answered", "abstained", "unparsed", "error"])),
    },
    unique=["run_id", "item_id", "sample_index"],
)


@dataclass(frozen=True)
class ImportSummary:
    rows: int
    added: int
    runs: list[str]


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, raw record) one at a time: the file is never held whole as Python objects."""
    if path.suffix == ".parquet":
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:
            raise ImportError_(f"{path}: unreadable Parquet ({exc})") from exc
        n = 0
        batches = pf.iter_batches(batch_size=65536)
        while True:
            # a damaged page or a non-UTF-8 string surfaces only when its batch is decoded
            try:
                batch = next(batches, None)
                rows = [] if batch is None else batch.to_pylist()
            except (OSError, pyarrow.ArrowException, UnicodeDecodeError) as exc:
                raise ImportError_(f"{path}:{n + 1}: unreadable Parquet data after row {n} ({exc})") from exc
            if batch is None:
                return
            for r in rows:
                n += 1
                yield n, r
    # bytes, split on b"\n" and decoded line by line: a bad byte is reported with its line number
    # instead of escaping as a UnicodeDecodeError from the file iterator
    with path.open("rb") as f:
        for lineno, data in enumerate(f, start=1):
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ImportError_(
                    f"{path}:{lineno}: not valid UTF-8 (byte {exc.start + 1} of the line)"
                ) from exc
            if not line.strip():
                continue
            try:
                raw = json.loads(line, parse_constant=lambda c: float(c))
            except json.JSONDecodeError as exc:
                raise ImportError_(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(raw, dict):
                raise ImportError_(f"{path}:{lineno}: a record must be a JSON object")
            if "\\u" in line:  # only an escape can smuggle in a lone surrogate, which no store can hold
                bad = _unencodable(raw)
                if bad is not None:
                    raise ImportError_(f"{path}:{lineno}: {bad}: lone surrogate escape, not Unicode text")
            yield lineno, raw


def _unencodable(value: object, where: str = "") -> str | None:
    """Location of the first key or string that cannot be encoded as UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "<record>"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        loc = f"{where}.{k}" if where else str(k)
        bad = _unencodable(k, loc) if isinstance(k, str) else None
        bad = bad or _unencodable(v, loc)
        if bad is not None:
            return bad
    return None


# ---------------------------------------------------------------------------------------------
# columnar fast path
# ---------------------------------------------------------------------------------------------
_SCALARS = pyarrow.schema(
    [
        ("model", pyarrow.string()),
        ("backend", pyarrow.string()),
        ("prompt_template_id", pyarrow.string()),
        ("prompt_sha256", pyarrow.string()),
        ("prompt_style", pyarrow.string()),
        ("dataset_id", pyarrow.string()),
        ("config", pyarrow.string()),
        ("item_id", pyarrow.string()),
        ("sample_index", pyarrow.int64()),
        ("raw_output", pyarrow.string()),
        ("parsed_label", pyarrow.string()),
        ("n_output_tokens", pyarrow.int64()),
        ("latency_ms", pyarrow.float64()),
        ("temperature", pyarrow.float64()),
    ]
)
# JSON can say `null` or leave a key out, Arrow cannot tell them apart. For these fields the two
# differ (a default vs a validation error), so a file that writes such a null takes the checked path.
_AMBIGUOUS_NULL = re.compile(
    rb'"(?:backend|prompt_style|sample_index)"\s*:\s*null|"option_logprobs"\s*:\s*\{[^}]*null'
)
_NULL = re.compile(rb"null")  # a plain literal: a fast scan that spares most files the regex above
_RUN_KEY = (
    "model",
    "backend",
    "prompt_style",
    "prompt_template_id",
    "prompt_sha256",
    "temperature",
    "dataset_id",
    "config",
)


def _fast_table(path: Path) -> tuple[pyarrow.Table, list[str]] | None:
    """:func:`_read_columns`, with anything unexpected (a damaged key, bytes that are not UTF-8 in
    a field name) meaning: take the checked path."""
    try:
        return _read_columns(path)
    except (OSError, pyarrow.ArrowException, UnicodeError, ValueError, TypeError, KeyError):
        return None


_SAMPLE_BYTES = 1 << 20
_DEFAULTED = ("backend", "prompt_style", "sample_index")
# Parquet string columns read as dictionaries: the run key's and parsed_label (few values each;
# the read takes only the string ones, so the run key's float temperature never is one)
_DICTIONARY_COLUMNS = frozenset({*_RUN_KEY, "parsed_label"})


def _parse_jsonl(path: Path) -> pyarrow.Table:
    """JSONL text as an Arrow table: the scalar fields typed by :data:`_SCALARS`, the nested ones
    (``option_logprobs`` with its free keys, ``token_logprobs``) inferred.

    Why two tries: inferring the nested types over a whole large file costs about a third of the
    parse. So the types are inferred on the first MiB of lines and the whole file is parsed with
    them and no inference, any field they do not name being an error (a label first seen later, a
    float where the sample had integers, a key left out of the whole sample). Any such error
    means: parse again with inference, exactly as a small file is parsed. A defaulted field
    (``backend``, ``prompt_style``, ``sample_index``) that is null in the whole sample is left out
    of the schema, so a successful parse also proves the key never occurs, which spares the
    null-vs-absent scan of the text.

    The file is read as a stream of blocks (an ``OSFile``), not mapped into memory: Arrow parses
    it block by block either way, and a mapping would keep every page it touched resident until
    the parse ends (about the file's size on top of the parsed table: parsing 1M records, a 452 MB
    file, peaked at 989 MiB mapped vs 668 MiB streamed). Only the head is read as Python bytes.
    No compression is guessed from the file name: the record-by-record path reads the bytes as
    they are, and so does this one.

    Why Arrow and not DuckDB's ``read_json`` (measured at 1M records: about 1.5 CPU-s against
    Arrow's 2.3): with explicit column types DuckDB converts instead of refusing (``"1"`` and
    ``true`` become the integer 1, ``1.5`` becomes 2, a number or an object becomes text, ``"nan"``
    a NaN float) and drops keys it was not told about; ``json_transform_strict`` converts the
    same way. A file the record-by-record path refuses could then be imported, and no check on
    the converted columns can tell. Arrow with an explicit schema refuses every such value.

    Looked at again in stop 24 (DuckDB 2.0.1): the typed ``read_json`` still converts and drops
    unknown keys, and each strict alternative measured (full type inference, each record as a
    ``MAP`` or its fields as ``JSON``, a regular expression per line, ``msgspec``) cost more CPU
    than Arrow's parse; the figures are in benchmarks/RESULTS.md (issue 13, stop 24)."""
    infer = pyarrow.json.ParseOptions(explicit_schema=_SCALARS, unexpected_field_behavior="infer")
    pool = _parse_pool()
    size = path.stat().st_size
    with path.open("rb") as f:
        sample = f.read(_SAMPLE_BYTES)
    cut = sample.rfind(b"\n")
    if 0 < cut < size - 1:
        try:
            head = pyarrow.json.read_json(pyarrow.BufferReader(sample[: cut + 1]), parse_options=infer)
            schema = pyarrow.schema(
                [
                    f
                    for f in head.schema
                    if not (f.name in _DEFAULTED and head[f.name].null_count == head.num_rows)
                ]
            )
            strict = pyarrow.json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
            # the streaming reader, not read_json: with every type fixed they parse alike, but
            # it converts and frees each block as it goes where read_json keeps the raw blocks
            # until the end (1M records, parse alone, alternated four times under load: 2.23-2.30
            # CPU-s and about 405 MiB peak RSS against 2.47-2.50 and 500 MiB). It cannot stand
            # in for the inferring parse below: it fixes the types on the first block
            with pyarrow.OSFile(str(path), memory_pool=pool) as f:
                if hasattr(pyarrow.json, "open_json"):
                    return pyarrow.json.open_json(f, parse_options=strict, memory_pool=pool).read_all()
                # a pyarrow without the streaming reader's Python binding (it came after 15,
                # the oldest this package allows): the same table, with read_json's memory
                return pyarrow.json.read_json(f, parse_options=strict, memory_pool=pool)
        except pyarrow.ArrowException:
            pass  # whatever the sample did not foresee: the inferring parse below decides
    del sample
    with pyarrow.OSFile(str(path), memory_pool=pool) as f:
        return pyarrow.json.read_json(f, parse_options=infer, memory_pool=pool)


def _parse_pool() -> pyarrow.MemoryPool:
    """The Arrow memory pool the JSON parse allocates from, the file's read buffers included:
    jemalloc where this pyarrow has it.

    Why not the default (mimalloc in the wheels): the parse fills many short-lived buffers (the
    blocks read from the file, the parser's scratch), and mimalloc hands their pages back to the
    kernel and faults fresh zeroed ones in for the next blocks; at 1M records (452 MB) the kernel's
    page zeroing was 13-15% of the parse's profile. jemalloc reuses the freed buffers. Measured on
    that file with ``read_json`` under load (CPU-s, peak RSS of the parse alone; the streaming
    reader used now takes less of both, see :func:`_parse_jsonl`): every buffer in the default pool
    2.72-3.26 and 517-673 MiB; the parse in jemalloc but the reads in the default pool 2.36-2.75
    and 629-834 MiB; both in jemalloc (this) 2.39-2.42 and 499-512 MiB. A memory-mapped file
    measured 2.16-2.29 CPU-s but 838-846 MiB (the mapped pages stay resident until the parse
    ends), so the file is still streamed. With the streaming reader, one ``import_bench.py``
    run each: 5.85 CPU-s for the whole import with this pool, 6.29 with the default one. The
    parsed table lives in that pool, which is process-wide and never freed, so that is safe."""
    try:
        return pyarrow.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pyarrow.default_memory_pool()


def _null_may_be_ambiguous(table: pyarrow.Table) -> bool:
    """Whether a null in ``table`` may stand for an explicit JSON ``null`` where the two paths
    would differ: a defaulted field that is null somewhere, or a scored label missing from a
    record that has scores (absent: fine; ``null``: a validation error)."""
    for name in _DEFAULTED:
        if name in table.column_names and table[name].null_count:
            return True
    if "option_logprobs" in table.column_names and pyarrow.types.is_struct(table["option_logprobs"].type):
        col = table["option_logprobs"]
        for i in range(col.type.num_fields):
            if pyarrow.compute.struct_field(col, [i]).null_count > col.null_count:
                return True
    return False


def _read_columns(path: Path) -> tuple[pyarrow.Table, list[str]] | None:
    """The file as one Arrow table of the import format, or None when only the record-by-record
    path can judge it (any parse problem, an unexpected field or type, an ambiguous null)."""
    allowed = set(ImportedPrediction.model_fields)
    try:
        if path.suffix == ".parquet":
            # the run columns and parsed_label hold a handful of values in any real file: read
            # as dictionaries (Arrow keeps Parquet's dictionary pages instead of writing a 64-char
            # dataset id out a million times: about 0.25 of 0.35 CPU-s of the read at 1M rows),
            # which DuckDB scans as they are. Free text (item_id, raw_output) is read plain: a
            # dictionary of unique values would only cost a hash per row.
            schema = pq.read_schema(path)
            table = pq.read_table(
                path,
                read_dictionary=[
                    f.name
                    for f in schema
                    if f.name in _DICTIONARY_COLUMNS and pyarrow.types.is_string(f.type)
                ],
            )
        else:
            table = _parse_jsonl(path)
            # the null-vs-absent regex over the whole text runs only when the columns leave it
            # open; only then is the file mapped (Arrow buffer: no copy as Python bytes)
            if _null_may_be_ambiguous(table):
                with pyarrow.memory_map(str(path)) as f:
                    data = f.read_buffer()
                    text = memoryview(data)
                    ambiguous = bool(_NULL.search(text) and _AMBIGUOUS_NULL.search(text))
                    del text, data
                if ambiguous:
                    return None
    except (OSError, pyarrow.ArrowException, UnicodeDecodeError, ValueError):
        return None
    if not set(table.column_names) <= allowed:
        return None
    try:
        table.validate(full=True)  # Arrow's JSON reader does not check that strings are UTF-8
    except pyarrow.ArrowException:
        return None
    for name in ("backend", "prompt_style", "sample_index"):
        if path.suffix == ".parquet" and name in table.column_names and table[name].null_count:
            return None  # Parquet nulls are explicit: the checked path names the error
    cols = {}
    defaults = {"backend": "import", "prompt_style": "base", "sample_index": 0}
    for field in _SCALARS:
        if field.name in table.column_names:
            col = table[field.name]
            if (
                pyarrow.types.is_dictionary(col.type)
                and col.type.value_type == field.type == pyarrow.string()
            ):
                pass  # a Parquet dictionary column (see above): DuckDB reads it as VARCHAR
            elif col.type != field.type:
                if not (pyarrow.types.is_integer(col.type) and pyarrow.types.is_integer(field.type)) and not (
                    pyarrow.types.is_floating(field.type)
                    and (pyarrow.types.is_integer(col.type) or pyarrow.types.is_floating(col.type))
                ):
                    return None
                col = col.cast(field.type)
            if field.name in defaults and col.null_count:
                col = pyarrow.compute.fill_null(col, defaults[field.name])
        elif field.name in defaults:
            col = _repeated(defaults[field.name], field.type, table.num_rows)
        else:
            col = _repeated(None, field.type, table.num_rows)
        cols[field.name] = col
    cols["tl"] = _repeated(None, pyarrow.list_(pyarrow.float64()), table.num_rows)
    if "token_logprobs" in table.column_names:
        t = table["token_logprobs"].type
        if not (
            pyarrow.types.is_list(t)
            and (pyarrow.types.is_floating(t.value_type) or pyarrow.types.is_integer(t.value_type))
        ):
            if not pyarrow.types.is_null(t):
                return None
        else:
            cols["tl"] = table["token_logprobs"].cast(pyarrow.list_(pyarrow.float64()))
    labels, values = [], []
    if "option_logprobs" in table.column_names:
        t = table["option_logprobs"].type
        if pyarrow.types.is_struct(t):
            col = table["option_logprobs"]
            for i in range(t.num_fields):
                f = t.field(i)
                if not (pyarrow.types.is_floating(f.type) or pyarrow.types.is_integer(f.type)):
                    return None
                # each chunk's child as it is (no copy of the struct into one chunk first)
                child = pyarrow.chunked_array([c.field(i) for c in col.chunks], type=f.type)
                child = child.cast(pyarrow.float64())
                if path.suffix == ".parquet" and (child.null_count != col.null_count):
                    return None  # a key present with no value: the checked path names it
                labels.append(f.name)
                values.append(child)
        elif not pyarrow.types.is_null(t):
            return None
    for i, v in enumerate(values):
        cols[f"lp_{i}"] = v  # positional names: a label never becomes an SQL identifier
    return pyarrow.table(cols), labels


_REPEAT_BLOCK = 1 << 16


def _repeated(value: object, type_: pyarrow.DataType, n: int) -> pyarrow.ChunkedArray:
    """``n`` copies of ``value`` (None: ``n`` nulls) of ``type_``, as one block of at most
    :data:`_REPEAT_BLOCK` values repeated, every chunk sharing its buffers. Why: a field the file
    leaves out (a default, or a column of nulls) is a column DuckDB reads like any other, and
    one array of ``n`` values costs a write of every page it fills (0.05-0.1 s at 1M records
    for the three float columns and the two defaulted strings of a typical file), spent before
    DuckDB starts, on one core."""
    block = pyarrow.repeat(pyarrow.scalar(value, type_), min(n, _REPEAT_BLOCK))
    whole, rest = divmod(n, len(block)) if n else (0, 0)
    return pyarrow.chunked_array([block] * whole + ([block.slice(0, rest)] if rest else []), type=type_)


def _fast_import(con: duckdb.DuckDBPyConnection, path: Path) -> ImportSummary | None:
    """Import a valid file column by column: Arrow parses it, DuckDB checks every record against the
    stored items in a few set operations and writes the rows without them ever becoming Python
    objects. Returns None (nothing written) as soon as anything is not certainly valid; the
    record-by-record path then finds and names the problem, so both paths accept exactly the same
    files and write the same rows."""
    got = _fast_table(path)
    if got is None or got[0].num_rows == 0:
        return None
    table, labels = got
    # the record number travels as a column: DuckDB's row_number() OVER () is a single-threaded
    # window over the whole file, and a numpy range costs nothing
    table = table.append_column("rn", pyarrow.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
    con.register("_imp", table)  # read in place (Arrow scan), never copied into a DuckDB table
    try:
        # the run columns holding one value (or only nulls) in the whole file, as a one-row table:
        # the run keys are then grouped on the others only (hashing a 64-character dataset id a
        # million times to find one group cost about 0.15 of the 0.25 CPU-s of the grouping at 1M
        # records)
        const = [c for c in _RUN_KEY if _constant(table[c])]
        if const:
            con.register("_imp_const", table.select(const).slice(0, 1))
        # a file without token log-probabilities (tl all null) spares every row the list functions
        # and a file that gives every parsed_label (the column's null count, known without a scan)
        # spares the query for records the parser must read
        return _fast_checked(
            con,
            labels,
            tokens=table["tl"].null_count < table.num_rows,
            unparsed=table["parsed_label"].null_count > 0,
            rows=table.num_rows,
            const=const,
        )
    except duckdb.Error:
        return None  # anything DuckDB refuses is left to the checked path to name
    finally:
        con.unregister("_imp")
        for name in ("_imp_const", "_imp_runs", "_imp_pairs", "_imp_parsed"):
            con.unregister(name)
        for name in ("_imp_keys", "_imp_rows", "_imp_opts"):
            con.execute(f"DROP TABLE IF EXISTS {name}")


def _constant(col: pyarrow.ChunkedArray) -> bool:
    """Whether ``col`` holds one value throughout: all null, or no null and every value equal to
    the first (a float column with a NaN is never constant: NaN is unequal to itself, so such a
    column is grouped like any other)."""
    if col.null_count == len(col):
        return True
    if col.null_count:
        return False
    if pyarrow.types.is_dictionary(col.type) and not pyarrow.types.is_floating(col.type.value_type):
        # a Parquet dictionary column: one value iff each chunk uses one dictionary entry (its
        # least index equals its greatest) and those entries are equal; found on the indices in
        # one pass, without the boolean column an equality test builds over the decoded values
        # (about 0.1 CPU-s at 1M records over the run columns, spent on one core before DuckDB
        # starts). A dictionary that repeats a value falls back to the equality test. Plain
        # strings keep that test: their min / max cost more than it
        used = set()
        for chunk in col.chunks:
            if len(chunk):
                ends = pyarrow.compute.min_max(chunk.indices)
                if ends["min"] != ends["max"]:
                    break
                used.add(chunk.dictionary[ends["min"].as_py()].as_py())
        else:
            return len(used) == 1
    return bool(pyarrow.compute.all(pyarrow.compute.equal(col, col[0])).as_py())


_PAIR_SCANS = 16  # above this many (dataset, config) pairs, one scan of items for all of them


def _fast_checked(
    con: duckdb.DuckDBPyConnection,
    labels: list[str],
    *,
    tokens: bool,
    unparsed: bool,
    rows: int,
    const: list[str],
) -> ImportSummary | None:
    """The set checks and the bulk write of :func:`_fast_import` (``_imp`` is the parsed file, of
    ``rows`` records: the caller's count of the table it registered, not counted again here).

    Each check is the SQL twin of a rule of :class:`ImportedPrediction` or of the record-by-record
    loop; tests feed both paths the same crafted files. Checks that depend only on the run
    columns run once per distinct run key, not once per record. ``tokens``: whether any record
    has token log-probabilities (when none has, the token columns are written as NULL directly);
    ``unparsed``: whether any record has no ``parsed_label`` (only those go through the parser);
    ``const``: the run columns with one value in the whole file, registered as the one-row
    ``_imp_const``."""
    lp = [f"lp_{i}" for i in range(len(labels))]
    row_ok = " AND ".join(
        [
            "item_id IS NOT NULL AND raw_output IS NOT NULL",
            "sample_index IS NOT NULL AND sample_index BETWEEN 0 AND 2147483647",
            "(n_output_tokens IS NULL OR n_output_tokens BETWEEN 0 AND 2147483647)",
            "(latency_ms IS NULL OR (isfinite(latency_ms) AND latency_ms >= 0))",
            "(tl IS NULL OR list_bool_and(list_transform(tl, lambda x: x IS NOT NULL AND isfinite(x))))",
            *(f"({c} IS NULL OR (isfinite({c}) AND {c} <= 1e-9))" for c in lp),
        ]
    )
    # run keys: one row per distinct key, first appearance first (the order the record-by-record
    # path names runs in); the per-run field rules are checked on these few rows. The per-record
    # rules above are counted by the same scan (per key: one pass over the records, not two)
    cols = ", ".join(_RUN_KEY)
    # grouped on the run columns that are not constant, joined to the one row of those that are
    # (``const``): the same keys as grouping on all of them (with none varying, GROUP BY ALL over
    # aggregates alone gives one row: the one key)
    grouped = "".join(f"{c}, " for c in _RUN_KEY if c not in const)
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _imp_keys AS
            SELECT {cols}, first, bad_rows FROM (
                SELECT {grouped}min(rn) AS first, count(*) FILTER (WHERE NOT ({row_ok})) AS bad_rows
                FROM _imp GROUP BY ALL) {"CROSS JOIN _imp_const" if const else ""}"""
    )
    if _one(
        con,
        """SELECT count(*) FILTER (WHERE bad_rows > 0 OR NOT (
                model IS NOT NULL AND length(model) >= 1
            AND prompt_template_id IS NOT NULL AND length(prompt_template_id) >= 1
            AND backend IS NOT NULL AND prompt_style IS NOT NULL AND config IS NOT NULL
            AND regexp_full_match(coalesce(prompt_sha256, ''), '[0-9a-f]{64}')
            AND regexp_full_match(coalesce(dataset_id, ''), '[0-9a-f]{64}')
            AND (temperature IS NULL OR (isfinite(temperature) AND temperature >= 0))))
           FROM _imp_keys""",
    ):
        return None
    keys = con.execute(f"SELECT {cols} FROM _imp_keys ORDER BY first").fetchall()
    runs: dict[str, RunRow] = {}
    key_runs: list[str] = []
    for model, backend, style, tpl, sha, temp, did, cfg in keys:
        decoding = Decoding(temperature=temp or 0.0, logprobs=False, top_logprobs=0)
        rid = run_id_for(model, backend, style, sha, decoding, did, cfg)
        key_runs.append(rid)
        runs.setdefault(
            rid,
            RunRow(
                run_id=rid,
                model=model,
                backend=backend,
                prompt_style=style,
                prompt_template_id=tpl,
                prompt_sha256=sha,
                decoding_json=canonical_json(decoding.model_dump()),
                dataset_id=did,
                config=cfg,
                package_version=__version__,
            ),
        )
    run_list = list(runs)
    # each record's run, as a small integer: joined on the run columns that differ between keys
    # only (a column with one value in the whole file tells no record apart)
    varying = [i for i, _ in enumerate(_RUN_KEY) if len({k[i] for k in keys}) > 1]
    # each (dataset, config) pair of the file as a small integer too: a record finds its item's
    # options by (pair, item_id), not by hashing and comparing the 64-character dataset id
    pix_of: dict[tuple[str, str], int] = {}
    for k in keys:
        pix_of.setdefault((k[6], k[7]), len(pix_of))
    if varying:
        rix = [run_list.index(r) for r in key_runs]
        runs_t = pyarrow.table(
            {
                **{
                    f"k{i}": pyarrow.array([k[i] for k in keys], _SCALARS.field(_RUN_KEY[i]).type)
                    for i in varying
                },
                "rix": pyarrow.array(rix, pyarrow.int32()),
                "run_id": key_runs,
                "pix": pyarrow.array([pix_of[k[6], k[7]] for k in keys], pyarrow.int32()),
            }
        )
        con.register("_imp_runs", runs_t)
        # every run column but temperature was checked non-null above: plain equality hashes
        on = " AND ".join(
            f"k.k{i} {'IS NOT DISTINCT FROM' if _RUN_KEY[i] == 'temperature' else '='} i.{_RUN_KEY[i]}"
            for i in varying
        )
        run_join, rix_col, pix_col = f"JOIN _imp_runs k ON {on}", "k.rix", "k.pix"
    else:
        run_join, rix_col, pix_col = "", "0", "0"
    # the labels this file names (scored or given as parsed_label), each with its bit in the
    # items' option bits (store schema v4); a label without one gets 0, which no check accepts:
    # such a record goes to the record-by-record path, which names it
    named = list(labels)
    named += [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT parsed_label FROM _imp WHERE parsed_label IS NOT NULL"
        ).fetchall()
        if r[0] not in labels
    ]
    bit_of = {lab: OPTION_LABEL_BITS.get(lab, 0) for lab in named}
    # a record's parsed label as its bit (pbit)
    whens = " ".join(f"WHEN {sql_literal(k)} THEN {v}" for k, v in bit_of.items())
    pbit = f"CASE i.parsed_label {whens} END" if bit_of else "NULL::BIGINT"
    # the option bits of each stored item of the file's datasets (and those of its abstain
    # options), stored with the item: a record whose item is not there, or whose item's bits are
    # NULL (a label without a bit), gets NULL and fails the checks. The bits are refreshed first
    # if ``options`` changed behind the store's back (store.ensure_option_bits). A file names few
    # (dataset, config) pairs: one scan per pair, filtered on constants (DuckDB skips the other
    # datasets' row groups). The rows are stored first (a temporary table of one small row per
    # item), not fed to the join as a subquery: DuckDB builds a join's hash table on the side it
    # estimates smaller, and over a subquery it may guess that side larger than the records and
    # build on the records, copying every record's text columns into the hash table and out
    # again; over the stored table (exact counts) it builds on its few columns and streams the
    # records through (measured at stop 41 over the grouped options, which this table replaced:
    # 1.63-1.78 CPU-s against 1.78-1.97 for the INSERT over the subquery; kept for the filtered
    # items scan without measuring it again). Reading the stored bits instead of grouping the
    # options on every import: 0.07-0.10 s against 0.27-0.36 s at 1M records
    # (benchmarks/RESULTS.md, stops 41-42).
    ensure_option_bits(con)
    bits = "option_bits AS has, abstain_bits AS abstain"
    if len(pix_of) <= _PAIR_SCANS:
        opt_sql = " UNION ALL ".join(
            f"""SELECT {pix}::INTEGER AS pix, item_id, {bits} FROM items
                WHERE dataset_id = {sql_literal(did)} AND config = {sql_literal(cfg)}"""
            for (did, cfg), pix in pix_of.items()
        )
    else:
        con.register(
            "_imp_pairs",
            pyarrow.table(
                {
                    "dataset_id": [d for d, _ in pix_of],
                    "config": [c for _, c in pix_of],
                    "pix": pyarrow.array(list(pix_of.values()), pyarrow.int32()),
                }
            ),
        )
        opt_sql = f"""SELECT p.pix, o.item_id, {bits}
                      FROM items o JOIN _imp_pairs p ON p.dataset_id = o.dataset_id AND p.config = o.config"""
    # Where the stored options are matched. A run none of whose rows is stored yet (a first import:
    # the common case) is appended with no anti-join, so the item / label checks ride on the
    # insert itself: the predictions INSERT reads the records joined to their items' option bits
    # and raises (DuckDB's error(), which aborts the statement and with it the transaction) at the
    # first record that fails one; no joined record is stored and no second pass reads the join. A
    # run with stored rows goes through the anti-join, whose filter DuckDB may apply before the
    # projection (a failing record whose key is stored would then never be looked at), so there
    # the joined rows are stored first and checked by their own query.
    run_col = "k.run_id" if varying else sql_literal(run_list[0])
    on_opts = f"LEFT JOIN _imp_opts o ON o.pix = {pix_col} AND o.item_id = i.item_id"
    bits_of_lp = [bit_of[lab] for lab in labels]
    # no (run, item, sample) repeats, counted on the parsed records; by run, not by run key: two
    # keys can name one run (a template id the run id leaves out, temperature null or 0).
    # Distinct 64-bit hashes of the keys, not the keys (about half the CPU): equal keys hash
    # equal, so a repeat is never missed; two keys that collide (odds about n^2 / 2^65) only send
    # the file to the checked path, which finds no repeat and imports it. One check for both
    # write paths below
    key = f"{rix_col}, i.item_id, i.sample_index"
    if _one(con, f"SELECT count(*) - count(DISTINCT hash({key})) FROM _imp i {run_join}"):
        return None
    con.execute(f"CREATE OR REPLACE TEMP TABLE _imp_opts AS {opt_sql}")
    fused = not _holds_runs(con, "predictions", run_list)
    if fused:
        rows_src = f"_imp i {run_join} {on_opts}"
        has, abstain, pb = "o.has", "o.abstain", pbit
    else:
        keep = ", ".join(
            f"i.{c}"
            for c in (
                "rn",
                "item_id",
                "sample_index",
                "raw_output",
                "parsed_label",
                "tl",
                "n_output_tokens",
                "latency_ms",
                *lp,
            )
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _imp_rows AS
                SELECT {keep}, {run_col} AS run_id, o.has, o.abstain, {pbit} AS pbit
                FROM _imp i {run_join} {on_opts}"""
        )
        label_ok = _labels_ok("has", "pbit", lp, bits_of_lp)
        if _one(con, f"SELECT count(*) FILTER (WHERE NOT ({label_ok})) FROM _imp_rows"):
            return None
        run_col = "i.run_id"
        rows_src = "_imp_rows i"
        has, abstain, pb = "i.has", "i.abstain", "i.pbit"
    # records without a parsed_label: Equipoise's own parser, one by one (it is Python), given
    # the item's labels in stored order as the record-by-record path gives them
    todo = []
    if unparsed:
        todo = con.execute(
            "SELECT rn, raw_output, dataset_id, config, item_id FROM _imp"
            " WHERE parsed_label IS NULL ORDER BY rn"
        ).fetchall()
    if todo:
        options: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        out: dict[str, list] = {"rn": [], "label": [], "method": [], "outcome": []}
        for rn, raw, did, cfg, item in todo:
            if (did, cfg) not in options:
                options[did, cfg] = _item_options(con, did, cfg)
            labs = options[did, cfg].get(item)
            if labs is None:
                return None  # not stored (the fused path checks later): the checked path names it
            got = parse_answer(raw, tuple(labs))
            out["rn"].append(rn)
            out["label"].append(got.label)
            out["method"].append(got.method)
            if got.label is None:
                out["outcome"].append("abstained" if got.method == "refusal" else "unparsed")
            else:
                out["outcome"].append("abstained" if labs[got.label] == "abstain" else "answered")
        con.register(
            "_imp_parsed",
            pyarrow.table(
                {
                    "rn": pyarrow.array(out["rn"], pyarrow.int64()),
                    **{k: pyarrow.array(out[k], pyarrow.string()) for k in ("label", "method", "outcome")},
                }
            ),
        )
        parsed_join = "LEFT JOIN _imp_parsed q ON q.rn = i.rn"
    else:  # every record gave its label
        parsed_join = (
            "LEFT JOIN (SELECT NULL::BIGINT, NULL, NULL, NULL) q(rn, label, method, outcome) ON q.rn = i.rn"
        )
    outcome = f"""CASE WHEN i.parsed_label IS NULL THEN q.outcome
                       WHEN ({abstain} & {pb}) <> 0 THEN 'abstained' ELSE 'answered' END"""
    if fused:
        label_ok = _labels_ok(has, pb, [f"i.{c}" for c in lp], bits_of_lp, parsed="i.parsed_label")
        outcome = f"CASE WHEN NOT ({label_ok}) THEN error({sql_literal(_LABEL_FAULT)}) ELSE {outcome} END"
    if tokens:
        token_cols = """list_sum(i.tl) AS token_logprob_sum, list_avg(i.tl) AS token_logprob_mean,
               list_min(i.tl) AS token_logprob_min,
               coalesce(i.n_output_tokens, nullif(len(i.tl), 0))::INTEGER AS n_output_tokens"""
    else:  # what the list functions give for a null list, without running them
        token_cols = """NULL::DOUBLE AS token_logprob_sum, NULL::DOUBLE AS token_logprob_mean,
               NULL::DOUBLE AS token_logprob_min, i.n_output_tokens::INTEGER AS n_output_tokens"""
    # the record's option scores as the row's two lists (schema v3): the labels sorted, each with its
    # log-probability, those the record did not score left out; NULL for a record that scored none
    if labels:
        order = sorted(range(len(labels)), key=labels.__getitem__)
        lps = "[" + ", ".join(f"i.{lp[k]}" for k in order) + "]"
        names = "[" + ", ".join(sql_literal(labels[k]) for k in order) + "]"
        # a record that scores every label (the usual case) takes the two lists as they are: the
        # filters give the same lists and cost about 0.1 s more at 1M records
        every = " AND ".join(f"i.{c} IS NOT NULL" for c in lp)
        some_labels = f"nullif(list_filter({names}, lambda x, k: {lps}[k] IS NOT NULL), [])"
        some_lps = f"nullif(list_filter({lps}, lambda x: x IS NOT NULL), [])"
        score_cols = f"""CASE WHEN {every} THEN {names} ELSE {some_labels} END AS score_labels,
               CASE WHEN {every} THEN {lps} ELSE {some_lps} END AS score_logprobs"""
    else:
        score_cols = "NULL::VARCHAR[] AS score_labels, NULL::DOUBLE[] AS score_logprobs"
    pred_sql = f"""
        SELECT {run_col} AS run_id, i.item_id, i.sample_index::INTEGER AS sample_index, i.raw_output,
               coalesce(i.parsed_label, q.label) AS parsed_label,
               CASE WHEN i.parsed_label IS NULL THEN q.method ELSE 'imported' END AS parse_method,
               {outcome} AS outcome,
               {token_cols},
               i.latency_ms, NULL::VARCHAR AS error,
               {score_cols}
        FROM {rows_src}
        {parsed_join}"""
    # the store appends the predictions the way this query was built for (fused: a plain append,
    # so the error() check above runs on every row), not on a second look at the table
    selects = [SelectInsert("predictions", list(PredictionRow.model_fields), pred_sql, append_only=fused)]
    before = _one(con, "SELECT count(*) FROM predictions")
    insert_selects(con, [(RunRow, list(runs.values()))], selects, run_ids=run_list)
    after = _one(con, "SELECT count(*) FROM predictions")
    return ImportSummary(rows=int(rows), added=int(after - before), runs=sorted(runs))


# the message of the error() the fused predictions INSERT raises (never shown: the checked path
# then runs and names the record)
_LABEL_FAULT = "equipoise import: a record's item or label is not stored"


def _labels_ok(has: str, pbit: str, lp: list[str], bits: list[int], parsed: str = "parsed_label") -> str:
    """SQL truth of: the record's item is stored (``has``, its option bits, is not NULL), and its
    parsed label (bit ``pbit``) and every label it scores (columns ``lp``, bits ``bits``) are
    options of that item."""
    return " AND ".join(
        [
            f"{has} IS NOT NULL",
            f"({parsed} IS NULL OR ({has} & {pbit}) <> 0)",
            *(f"({c} IS NULL OR ({has} & {b}) <> 0)" for c, b in zip(lp, bits, strict=True)),
        ]
    )


def _one(con: duckdb.DuckDBPyConnection, query: str) -> object:
    """The single value of ``query`` (fetched whole: DuckDB refuses new work while a result is
    partly unread)."""
    return con.execute(query).fetchall()[0][0]


def _item_options(con: duckdb.DuckDBPyConnection, dataset_id: str, config: str) -> dict[str, dict[str, str]]:
    """{item_id: {label: role}} in the store's option order (what the parser is given)."""
    rows = con.execute(
        "SELECT item_id, label, role FROM options WHERE dataset_id = ? AND config = ?", [dataset_id, config]
    ).fetchall()
    per_item: dict[str, dict[str, str]] = defaultdict(dict)
    for item_id, label, role in rows:
        per_item[item_id][label] = role
    return per_item


def import_predictions(con: duckdb.DuckDBPyConnection, path: Path, fast: bool = True) -> ImportSummary:
    """Import ``path`` (JSONL or Parquet); see the module docstring for what is checked.

    ``fast`` (default) first tries the columnar path (:func:`_fast_import`), which handles any
    valid file; whatever it is not sure of goes through the record-by-record path, which names
    the file, line and field of the first problem. ``fast=False`` forces the record-by-record path
    (tests compare the two)."""
    if fast:
        done = _fast_import(con, path)
        if done is not None:
            return done
    options: dict[tuple[str, str], dict[str, dict[str, str]]] = {}

    def item_options(dataset_id: str, config: str) -> dict[str, dict[str, str]]:
        key = (dataset_id, config)
        if key not in options:
            rows = con.execute(
                "SELECT item_id, label, role FROM options WHERE dataset_id = ? AND config = ?", list(key)
            ).fetchall()
            per_item: dict[str, dict[str, str]] = defaultdict(dict)
            for item_id, label, role in rows:
                per_item[item_id][label] = role
            options[key] = per_item
        return options[key]

    # One streaming pass: each record is validated, checked against the stored items and turned
    # into column values; nothing is written until the whole file has passed. Rows are built as
    # Arrow columns (no per-row pydantic row objects): at a million rows the object churn, not the
    # checks, is what costs.
    cols: dict[str, list] = {f: [] for f in PredictionRow.model_fields}
    linenos: list[int] = []  # source line of each row, for error messages
    runs: dict[str, RunRow] = {}
    run_cache: dict[tuple, str] = {}
    for lineno, raw in _records(path):
        try:
            p = ImportedPrediction.model_validate(raw)
        except ValidationError as exc:
            e = exc.errors()[0]
            loc = ".".join(str(x) for x in e["loc"]) or "<record>"
            raise ImportError_(f"{path}:{lineno}: {loc}: {e['msg']}") from exc
        per_item = item_options(p.dataset_id, p.config)
        if not per_item:
            raise ImportError_(
                f"{path}:{lineno}: dataset_id: {p.dataset_id[:12]}…/{p.config} is not in the store "
                "(register it first: equipoise import FILE --dataset DIR)"
            )
        labels = per_item.get(p.item_id)
        if labels is None:
            raise ImportError_(f"{path}:{lineno}: item_id: unknown item {p.item_id!r} in {p.config}")
        if p.parsed_label is not None and p.parsed_label not in labels:
            raise ImportError_(
                f"{path}:{lineno}: parsed_label: {p.parsed_label!r} is not an option of {p.item_id} "
                f"({sorted(labels)})"
            )
        for lab in p.option_logprobs or {}:
            if lab not in labels:
                raise ImportError_(f"{path}:{lineno}: option_logprobs: unknown label {lab!r} for {p.item_id}")
        key = (
            p.model,
            p.backend,
            p.prompt_style,
            p.prompt_template_id,
            p.prompt_sha256,
            p.temperature,
            p.dataset_id,
            p.config,
        )
        rid = run_cache.get(key)
        if rid is None:
            decoding = Decoding(temperature=p.temperature or 0.0, logprobs=False, top_logprobs=0)
            rid = run_id_for(
                p.model, p.backend, p.prompt_style, p.prompt_sha256, decoding, p.dataset_id, p.config
            )
            run_cache[key] = rid
            runs.setdefault(
                rid,
                RunRow(
                    run_id=rid,
                    model=p.model,
                    backend=p.backend,
                    prompt_style=p.prompt_style,
                    prompt_template_id=p.prompt_template_id,
                    prompt_sha256=p.prompt_sha256,
                    decoding_json=canonical_json(decoding.model_dump()),
                    dataset_id=p.dataset_id,
                    config=p.config,
                    package_version=__version__,
                ),
            )
        if p.parsed_label is not None:
            label, method = p.parsed_label, "imported"
        else:
            got = parse_answer(p.raw_output, tuple(labels))
            label, method = got.label, got.method
        if label is None:
            outcome = "abstained" if method == "refusal" else "unparsed"
        else:
            outcome = "abstained" if labels[label] == "abstain" else "answered"
        tl = p.token_logprobs or []
        scored = sorted((p.option_logprobs or {}).items())
        linenos.append(lineno)
        for name, value in (
            ("run_id", rid),
            ("item_id", p.item_id),
            ("sample_index", p.sample_index),
            ("raw_output", p.raw_output),
            ("parsed_label", label),
            ("parse_method", method),
            ("outcome", outcome),
            # left to right, as DuckDB's list_sum adds on the columnar path (Python 3.12's sum()
            # compensates, which would make the two paths differ in the last bit)
            ("token_logprob_sum", reduce(operator.add, tl) if tl else None),
            ("token_logprob_mean", reduce(operator.add, tl) / len(tl) if tl else None),
            ("token_logprob_min", min(tl) if tl else None),
            ("n_output_tokens", p.n_output_tokens if p.n_output_tokens is not None else (len(tl) or None)),
            ("latency_ms", p.latency_ms),
            ("error", None),
            # the scores as the row's sorted lists (schema v3), as the columnar path writes them
            ("score_labels", [lab for lab, _ in scored] or None),
            ("score_logprobs", [lp for _, lp in scored] or None),
        ):
            cols[name].append(value)
    frame = pd.DataFrame({k: cols[k] for k in ("run_id", "item_id", "sample_index", "outcome")})
    try:
        PREDICTION_FRAME.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        key = ["run_id", "item_id", "sample_index"]
        again = frame.index[frame.duplicated(key)]
        if len(again):
            i = int(again[0])
            first = int(frame.index[(frame[key] == frame.loc[i, key]).all(axis=1)][0])
            raise ImportError_(
                f"{path}:{linenos[i]}: item_id: {frame.at[i, 'item_id']!r} sample_index "
                f"{frame.at[i, 'sample_index']} repeats line {linenos[first]} (same run)"
            ) from exc
        dup = exc.failure_cases.head(1).to_dict("records")
        raise ImportError_(f"{path}: records fail the prediction checks: {dup}") from exc
    pred_table = pyarrow.table(cols, schema=arrow_schema(PredictionRow))
    before = con.execute("SELECT count(*) FROM predictions").fetchall()[0][0]
    insert_batch(
        con,
        [(RunRow, list(runs.values()))],
        tables=[("predictions", pred_table)],
    )
    after = con.execute("SELECT count(*) FROM predictions").fetchall()[0][0]
    return ImportSummary(rows=pred_table.num_rows, added=int(after - before), runs=sorted(runs))


def prediction_json_schema() -> dict:
    return ImportedPrediction.model_json_schema()
