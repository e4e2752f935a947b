"""Random corruption of prediction files: the import is all-or-nothing and its errors are clear.

A valid JSONL (and Parquet) prediction file is damaged by hypothesis: one byte flipped, deleted,
inserted or replaced, a line truncated, or one record given a NaN log-probability, an unknown label,
an unknown item, a value of the wrong type or an out-of-range number. A store that already holds
predictions (some of them for the same keys as the file) then imports it. The property:

* a refused import raises ``ImportError_`` whose message starts with ``<file>:<line>:`` (the line of
  the damage) and, for a record-level fault, names the field; and every table of the store is
  byte-for-byte what it was (same rows, same content hash);
* a byte change can leave a valid file (a letter of ``raw_output``, a digit of a log-probability):
  then the import succeeds, keeps every row already stored and adds exactly the rows it reports;
* nothing else: no other exception type (a traceback from deep inside) is acceptable.

Every example works on a fresh copy of one prepared store file, so examples are independent.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.builders.prompts import decision_template
from equipoise.evaluators.importer import ImportError_, import_predictions
from equipoise.evaluators.ingest import dataset_id, register
from equipoise.evaluators.store import connect

CONFIG = "plus_nota"
N_RECORDS = 8
N_PRESTORED = 3  # the first records are already in the store before the corrupted file arrives
TABLES = ("schema_version", "datasets", "items", "options", "runs", "predictions", "option_scores")

_SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _settings(max_examples: int) -> settings:
    return settings(_SETTINGS, max_examples=max_examples)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small built dataset, a store that has it registered plus a few predictions, and the valid
    records a file would carry."""
    root = tmp_path_factory.mktemp("corrupt")
    folder = root / "nota"
    build_mcq_suite("nota", folder, seed=1)
    store = root / "base.duckdb"
    con = connect(store)
    loaded = register(con, folder, CONFIG)
    tpl = decision_template("base", "mcq")
    records = []
    for k, it in enumerate(loaded.records[:N_RECORDS]):
        lp = {o.label: -3.0 for o in it.options}
        lp[it.target_label] = -0.25
        records.append(
            {
                "model": "external-model",
                "prompt_template_id": tpl.id,
                "prompt_sha256": tpl.sha256,
                "dataset_id": dataset_id(folder),
                "config": CONFIG,
                "item_id": it.item_id,
                "sample_index": 0,
                # non-ASCII text: written raw on some lines (multi-byte UTF-8) and as \u escapes,
                # including a surrogate pair, on others
                "raw_output": f"Réflexion {k} 😀.\nAnswer: {it.target_label}",
                "option_logprobs": lp,
                "token_logprobs": [-0.5, -0.25, -0.125],
                "latency_ms": 12.5,
                "n_output_tokens": 3,
            }
        )
    first = root / "first.jsonl"
    first.write_text(_jsonl(records[:N_PRESTORED]), encoding="utf-8")
    import_predictions(con, first)
    con.close()
    return {"store": store, "records": records, "labels": {it.item_id: it for it in loaded.records}}


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=(i % 2 == 0)) + "\n" for i, r in enumerate(records))


def _snapshot(con) -> dict[str, tuple[int, str]]:
    """Row count and a content hash of every table (rows in a total order)."""
    out = {}
    for t in TABLES:
        rows = con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
        out[t] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return out


def _rows(con, table: str) -> set[tuple]:
    """The table's rows as a set (list columns, the score lists of predictions, as tuples)."""
    return {
        tuple(tuple(v) if isinstance(v, list) else v for v in row)
        for row in con.execute(f"SELECT * FROM {table}").fetchall()
    }


def _import_checked(prepared: dict[str, Any], write: Callable[[Path], None], suffix: str) -> str | None:
    """Import a file into a fresh copy of the prepared store and check the all-or-nothing property.
    Returns the error message when refused, None when imported."""
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "s.duckdb"
        shutil.copy(prepared["store"], store)
        path = Path(d) / f"pred{suffix}"
        write(path)
        con = connect(store)
        try:
            before = _snapshot(con)
            old = {t: _rows(con, t) for t in ("predictions", "option_scores", "runs")}
            try:
                summary = import_predictions(con, path)
            except ImportError_ as exc:
                msg = str(exc)
            else:
                msg = None
            if msg is not None:
                assert _snapshot(con) == before, f"refused import changed the store: {msg}"
                assert msg.startswith(f"{path}:"), msg
                return msg
            # imported: nothing already stored was lost or changed, and the count adds up
            new = {t: _rows(con, t) for t in old}
            for t in old:
                assert old[t] <= new[t], f"{t}: stored rows lost or changed"
            assert len(new["predictions"]) == len(old["predictions"]) + summary.added
            assert summary.added <= summary.rows
            # a second import of the same file adds nothing (all of it is already there)
            assert import_predictions(con, path).added == 0
            return None
        finally:
            con.close()


def _line_of(msg: str, path_len: int) -> int:
    m = re.match(r":(\d+): \S", msg[path_len:])
    assert m, f"no line number in: {msg}"
    return int(m.group(1))


# -- byte-level damage -------------------------------------------------------------------------------------
@st.composite
def byte_damage(draw: st.DrawFn, size: int) -> tuple[str, int, int]:
    op = draw(st.sampled_from(["flip", "delete", "insert", "replace"]))
    pos = draw(st.integers(0, size if op == "insert" else size - 1))
    value = draw(st.integers(0, 7) if op == "flip" else st.integers(0, 255))
    return op, pos, value


def _apply(data: bytes, op: str, pos: int, value: int) -> bytes:
    b = bytearray(data)
    if op == "flip":
        b[pos] ^= 1 << value
    elif op == "delete":
        del b[pos]
    elif op == "insert":
        b.insert(pos, value)
    else:
        b[pos] = value
    return bytes(b)


@_settings(max_examples=35)
@given(data=st.data())
def test_byte_damage_to_jsonl_is_refused_with_its_line_or_imported_whole(prepared, data) -> None:
    original = _jsonl(prepared["records"]).encode("utf-8")
    op, pos, value = data.draw(byte_damage(len(original)), label="damage")
    damaged = _apply(original, op, pos, value)
    line = original[:pos].count(b"\n") + 1  # line of the damaged byte (1-based)
    written: list[Path] = []

    def write(p: Path) -> None:
        p.write_bytes(damaged)
        written.append(p)

    msg = _import_checked(prepared, write, ".jsonl")
    if msg is None:
        return
    reported = _line_of(msg, len(str(written[0])))
    # a damaged first byte can empty the line (it is then skipped) and move the fault to the next
    # one; a repeated key names the later of the two lines and mentions the other
    assert reported in (line, line + 1) or f"line {line}" in msg, (op, pos, value, msg)


# -- record-level faults ------------------------------------------------------------------------------------
def _nan_logprob(r: dict, labels: list[str]) -> str:
    r["option_logprobs"][labels[0]] = float("nan")
    return "option_logprobs"


def _nan_token(r: dict, labels: list[str]) -> str:
    r["token_logprobs"][1] = float("nan")
    return "token_logprobs"


def _positive_logprob(r: dict, labels: list[str]) -> str:
    r["option_logprobs"][labels[-1]] = 0.5
    return "option_logprobs"


def _unknown_option(r: dict, labels: list[str]) -> str:
    r["option_logprobs"]["Z"] = -1.0
    return "option_logprobs"


def _unknown_parsed_label(r: dict, labels: list[str]) -> str:
    r["parsed_label"] = "Q"
    return "parsed_label"


def _unknown_item(r: dict, labels: list[str]) -> str:
    r["item_id"] = "no-such-item:" + CONFIG
    return "item_id"


def _unknown_dataset(r: dict, labels: list[str]) -> str:
    r["dataset_id"] = "f" * 64
    return "dataset_id"


def _extra_field(r: dict, labels: list[str]) -> str:
    r["confidence_score"] = 0.9
    return "confidence_score"


def _missing_field(r: dict, labels: list[str]) -> str:
    del r["raw_output"]
    return "raw_output"


def _duplicate_key(r: dict, labels: list[str]) -> str:
    r["item_id"] = "__FIRST__"  # replaced by the first record's item id below
    return "item_id"


WRONG_TYPES: list[tuple[str, Any]] = [
    ("raw_output", 17),
    ("raw_output", ["Answer: A"]),
    ("model", None),
    ("item_id", {"id": 1}),
    ("sample_index", "first"),
    ("sample_index", -1),
    ("sample_index", 1.5),
    ("sample_index", 2**40),
    ("n_output_tokens", 2**70),
    ("option_logprobs", [-0.1, -2.0]),
    ("option_logprobs", "A"),
    ("token_logprobs", {"t": -0.1}),
    ("token_logprobs", ["x"]),
    ("latency_ms", "fast"),
    ("latency_ms", float("inf")),
    ("temperature", -1.0),
    ("prompt_sha256", "not-a-hash"),
]

FAULTS: list[Callable[[dict, list[str]], str]] = [
    _nan_logprob,
    _nan_token,
    _positive_logprob,
    _unknown_option,
    _unknown_parsed_label,
    _unknown_item,
    _unknown_dataset,
    _extra_field,
    _missing_field,
    _duplicate_key,
]


@st.composite
def record_fault(draw: st.DrawFn) -> tuple[int, Callable[[dict, list[str]], str] | tuple[str, Any]]:
    index = draw(st.integers(1, N_RECORDS - 1))  # 0 is the record a duplicate copies
    fault = draw(st.one_of(st.sampled_from(FAULTS), st.sampled_from(WRONG_TYPES)))
    return index, fault


def _damaged_records(prepared: dict[str, Any], index: int, fault: Any) -> tuple[list[dict], str]:
    records = json.loads(json.dumps(prepared["records"]))  # deep copy
    r = records[index]
    if isinstance(fault, tuple):
        field, value = fault
        r[field] = value
    else:
        field = fault(r, sorted(r["option_logprobs"]))
        if r["item_id"] == "__FIRST__":
            r["item_id"] = records[0]["item_id"]
    return records, field


def _json_line(r: dict, i: int) -> str:
    """NaN / Infinity come out as the bare tokens json.dumps (and many other tools) write."""
    return json.dumps(r, ensure_ascii=(i % 2 == 0)) + "\n"


@_settings(max_examples=25)
@given(fault=record_fault())
def test_record_faults_are_refused_naming_file_line_and_field(prepared, fault) -> None:
    index, kind = fault
    records, field = _damaged_records(prepared, index, kind)
    text = "".join(_json_line(r, i) for i, r in enumerate(records))
    written: list[Path] = []

    def write(p: Path) -> None:
        p.write_text(text, encoding="utf-8")
        written.append(p)

    msg = _import_checked(prepared, write, ".jsonl")
    assert msg is not None, f"fault {kind} on record {index + 1} was imported"
    assert _line_of(msg, len(str(written[0]))) == index + 1, msg
    assert f": {field}" in msg, f"field {field!r} not named: {msg}"


@_settings(max_examples=20)
@given(index=st.integers(0, N_RECORDS - 1), cut=st.floats(0.0, 0.98))
def test_truncated_line_is_refused_at_that_line(prepared, index: int, cut: float) -> None:
    lines = _jsonl(prepared["records"]).splitlines(keepends=True)
    body = lines[index].rstrip("\n")
    lines[index] = body[: int(len(body) * cut)] + "\n"
    written: list[Path] = []

    def write(p: Path) -> None:
        p.write_text("".join(lines), encoding="utf-8")
        written.append(p)

    msg = _import_checked(prepared, write, ".jsonl")
    if lines[index].strip() == "":  # cut to nothing: a blank line, skipped; the rest imports
        assert msg is None
        return
    assert msg is not None and _line_of(msg, len(str(written[0]))) == index + 1, msg


def test_file_cut_mid_record_is_refused(prepared) -> None:
    """The classic partial download: the last line stops mid-record."""
    text = _jsonl(prepared["records"])
    written: list[Path] = []

    def write(p: Path) -> None:
        p.write_text(text[: len(text) - 40], encoding="utf-8")
        written.append(p)

    msg = _import_checked(prepared, write, ".jsonl")
    assert msg is not None and _line_of(msg, len(str(written[0]))) == N_RECORDS, msg
    assert "not valid JSON" in msg


def test_the_undamaged_file_imports(prepared) -> None:
    """Control: without damage the same file imports, so the refusals above come from the damage."""
    assert _import_checked(prepared, lambda p: p.write_text(_jsonl(prepared["records"])), ".jsonl") is None


# -- Parquet -----------------------------------------------------------------------------------------------
def _parquet_bytes(records: list[dict]) -> bytes:
    """Parquet has no map with free keys here, so the file carries no option_logprobs. Columns are
    the union of the records' keys (a key only one record has becomes a mostly-null column)."""
    keys = list(dict.fromkeys(k for r in records for k in r if k != "option_logprobs"))
    plain = [{k: r.get(k) for k in keys} for r in records]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(plain), sink)
    return sink.getvalue().to_pybytes()


@_settings(max_examples=20)
@given(data=st.data())
def test_byte_damage_to_parquet_is_refused_cleanly_or_imported_whole(prepared, data) -> None:
    original = _parquet_bytes(prepared["records"])
    op, pos, value = data.draw(byte_damage(len(original)), label="damage")
    damaged = _apply(original, op, pos, value)
    _import_checked(prepared, lambda p: p.write_bytes(damaged), ".parquet")


@pytest.mark.parametrize(
    ("name", "size"), [("footer", -6), ("magic", -2), ("truncated", None)], ids=["footer", "magic", "cut"]
)
def test_parquet_structural_damage_is_refused(prepared, name: str, size: int | None) -> None:
    data = bytearray(_parquet_bytes(prepared["records"]))
    if size is None:
        data = data[: len(data) // 2]
    else:
        data[size] ^= 0xFF
    msg = _import_checked(prepared, lambda p: p.write_bytes(bytes(data)), ".parquet")
    assert msg is not None and "Parquet" in msg, msg


@pytest.mark.parametrize(
    "fault", [_unknown_item, _unknown_parsed_label, ("sample_index", -1), ("latency_ms", float("nan"))]
)
def test_parquet_record_faults_name_row_and_field(prepared, fault) -> None:
    index = 5
    records, field = _damaged_records(prepared, index, fault)
    written: list[Path] = []

    def write(p: Path) -> None:
        p.write_bytes(_parquet_bytes(records))
        written.append(p)

    msg = _import_checked(prepared, write, ".parquet")
    assert msg is not None and _line_of(msg, len(str(written[0]))) == index + 1, msg
    assert f": {field}" in msg, msg
