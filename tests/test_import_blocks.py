"""Importing a JSONL file larger than the typed head and than one Arrow parse block.

The columnar path types a file from its first MiB (``importer._SAMPLE_BYTES``) and Arrow parses
it in blocks of 1 MiB, so a fault past the head and in a later block reaches code that small
files never exercise: the strict parse of the later blocks, then the record-by-record path that
must still name the exact line and field. These tests use a file of several blocks (asserted,
so the file cannot silently shrink below what they are about) and faults in a middle block and in
the very last record, and check that a refused file leaves a store's earlier rows untouched and
that a valid one imports through the columnar path, writes what the record path writes, and
imports idempotently.
"""

from __future__ import annotations

import copy

import pytest

from equipoise.evaluators.importer import ImportError_, import_predictions
from tests.test_import import _imported_like_record_path, _records, _store, _stored, _write_jsonl

_SAMPLES = 500  # per item, 10 items: about 2.6 MB of JSONL, i.e. the head plus two more blocks
_BLOCK = 1 << 20  # Arrow's default JSON block size (the importer does not change it)


@pytest.fixture(scope="module")
def big(nota) -> list[dict]:
    """``_big``'s records, built once for the module (a test that changes a record copies it first)."""
    return _big(nota)


def _big(folder) -> list[dict]:
    """``_SAMPLES`` samples of each of 10 items (test_import's records, every field the format has),
    each sample's distractor log-probabilities, text, token log-probabilities and latency its own."""
    base = _records(folder, "plus_nota", n=10)
    recs = []
    for s in range(_SAMPLES):
        for r in base:
            lp = {k: v if v == -0.1 else v - s / 1000 for k, v in r["option_logprobs"].items()}
            recs.append(
                {
                    **r,
                    "sample_index": s,
                    "raw_output": r["raw_output"].replace("Reasoning.", f"Reasoning for sample {s}."),
                    "option_logprobs": lp,
                    "token_logprobs": [-0.5, -0.2, -0.1 - s / 1e4],
                    "latency_ms": 12.5 + s,
                }
            )
    return recs


def _write(path, recs):
    _write_jsonl(path, recs)
    assert path.stat().st_size > 2 * _BLOCK  # past the typed head and more than one block after it
    return path


def test_a_multi_block_file_imports_columnar_like_the_record_path(nota, big, tmp_path, monkeypatch):
    recs = big
    f = _write(tmp_path / "big.jsonl", recs)
    _imported_like_record_path(nota, tmp_path, monkeypatch, f, len(recs)).close()


_FAULTS = [
    ("unknown_key", lambda r: r.update(confidence=0.9), "confidence: Extra inputs are not permitted"),
    ("number_as_text", lambda r: r.update(raw_output=5), "raw_output: Input should be a valid string"),
    ("text_as_index", lambda r: r.update(sample_index="x"), "sample_index: "),
    ("nan_logprob", lambda r: r["option_logprobs"].update(A=float("nan")), "option_logprobs: "),
    ("unknown_label", lambda r: r["option_logprobs"].update(Z=-1.0), "option_logprobs: unknown label 'Z'"),
    ("unknown_parsed_label", lambda r: r.update(parsed_label="Z"), "parsed_label: 'Z' is not an option"),
    ("missing_field", lambda r: r.pop("item_id"), "item_id: Field required"),
]


@pytest.mark.parametrize("where", ["middle_block", "last_record"])
@pytest.mark.parametrize(("name", "mutate", "needle"), _FAULTS, ids=[f[0] for f in _FAULTS])
def test_a_fault_past_the_head_names_its_line_and_stores_nothing(
    nota, big, tmp_path, name, mutate, needle, where
):
    """One bad record among thousands, after the typed head (in a later parse block, or the very
    last line): the import is refused naming that line and field, and the rows an earlier import
    stored are exactly as they were (nothing added, nothing lost)."""
    line = len(big) if where == "last_record" else 3 * len(big) // 4
    recs = list(big)
    recs[line - 1] = copy.deepcopy(big[line - 1])  # the one record mutated below
    con = _store(tmp_path, nota)
    earlier = _write_jsonl(tmp_path / "earlier.jsonl", [dict(r, model="earlier-model") for r in recs[:25]])
    assert import_predictions(con, earlier).added == 25
    before = _stored(con)
    mutate(recs[line - 1])
    f = _write(tmp_path / f"{name}.jsonl", recs)
    assert f.read_bytes()[:_BLOCK].count(b"\n") < line - 1  # the bad record lies past the typed head
    try:  # caught by hand: a kept ExceptionInfo would hold DuckDB objects past shutdown
        import_predictions(con, f)
    except ImportError_ as e:
        msg = str(e)
    else:
        pytest.fail("a bad file was imported")
    assert msg.startswith(f"{f}:{line}: ") and needle in msg, msg
    assert _stored(con) == before
    con.close()
