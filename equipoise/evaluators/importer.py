"""Import predictions made elsewhere (JSONL or Parquet) into the store.

Format: one record per (item, sample), described by :class:`ImportedPrediction` (``equipoise schema
prediction`` prints its JSON Schema). Each record names its run (model, backend, prompt template
hash, dataset version, config) so imported rows are as traceable as native ones.

The whole file is checked before anything is written: bytes that are not UTF-8, bad JSON, a missing
or mistyped field, a number the store cannot hold, an unknown dataset version, an item not in that
dataset config, a label that is not one of the item's options, a NaN / infinite log-probability, or
a repeated (run, item, sample) each raise :class:`ImportError_` naming file, line and field. Only a
file that passes completely is inserted, in one transaction, so nothing already stored is touched
by a failed import, and importing the same file twice adds nothing (primary keys).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from equipoise import __version__
from equipoise.evaluators.backends.base import Decoding
from equipoise.evaluators.parsing import parse_answer
from equipoise.evaluators.runner import run_id_for
from equipoise.evaluators.store import OptionScoreRow, PredictionRow, RunRow, insert_batch
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


def import_predictions(con: duckdb.DuckDBPyConnection, path: Path) -> ImportSummary:
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
    sc: dict[str, list] = {f: [] for f in OptionScoreRow.model_fields}
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
        linenos.append(lineno)
        for name, value in (
            ("run_id", rid),
            ("item_id", p.item_id),
            ("sample_index", p.sample_index),
            ("raw_output", p.raw_output),
            ("parsed_label", label),
            ("parse_method", method),
            ("outcome", outcome),
            ("token_logprob_sum", sum(tl) if tl else None),
            ("token_logprob_mean", sum(tl) / len(tl) if tl else None),
            ("token_logprob_min", min(tl) if tl else None),
            ("n_output_tokens", p.n_output_tokens if p.n_output_tokens is not None else (len(tl) or None)),
            ("latency_ms", p.latency_ms),
            ("error", None),
        ):
            cols[name].append(value)
        for lab, lp in (p.option_logprobs or {}).items():
            sc["run_id"].append(rid)
            sc["item_id"].append(p.item_id)
            sc["sample_index"].append(p.sample_index)
            sc["label"].append(lab)
            sc["logprob"].append(lp)
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
    score_table = pyarrow.table(sc, schema=arrow_schema(OptionScoreRow))
    before = con.execute("SELECT count(*) FROM predictions").fetchall()[0][0]
    insert_batch(
        con,
        [(RunRow, list(runs.values()))],
        tables=[("predictions", pred_table), ("option_scores", score_table)],
    )
    after = con.execute("SELECT count(*) FROM predictions").fetchall()[0][0]
    return ImportSummary(rows=pred_table.num_rows, added=int(after - before), runs=sorted(runs))


def prediction_json_schema() -> dict:
    return ImportedPrediction.model_json_schema()
