"""Importing predictions: documented format, strict file:line:field errors, all-or-nothing writes."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from equipoise.builders.prompts import decision_template
from equipoise.cli import app
from equipoise.evaluators.importer import ImportError_, import_predictions
from equipoise.evaluators.ingest import dataset_id, register
from equipoise.evaluators.store import connect, scalar


def _records(folder, config="plus_nota", n=10):
    con = connect(folder.parent / "scratch.duckdb")
    loaded = register(con, folder, config)
    con.close()
    tpl = decision_template("base", "mcq")
    recs = []
    for it in loaded.records[:n]:
        lp = {o.label: -3.0 for o in it.options}
        lp[it.target_label] = -0.1
        recs.append(
            {
                "model": "external-model",
                "prompt_template_id": tpl.id,
                "prompt_sha256": tpl.sha256,
                "dataset_id": dataset_id(folder),
                "config": config,
                "item_id": it.item_id,
                "sample_index": 0,
                "raw_output": f"Reasoning.\nAnswer: {it.target_label}",
                "option_logprobs": lp,
                "token_logprobs": [-0.5, -0.2, -0.1],
                "latency_ms": 12.5,
            }
        )
    return recs


def _write_jsonl(path, recs):
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def _store(tmp_path, folder):
    con = connect(tmp_path / "s.duckdb")
    register(con, folder, "plus_nota")
    return con


def test_import_twice_adds_nothing(nota, tmp_path):
    con = _store(tmp_path, nota)
    f = _write_jsonl(tmp_path / "p.jsonl", _records(nota))
    first = import_predictions(con, f)
    second = import_predictions(con, f)
    assert first.rows == first.added == 10 and second.added == 0
    assert scalar(con, "SELECT count(*) FROM option_scores") == sum(
        len(r["option_logprobs"]) for r in _records(nota)
    )
    got = con.execute("SELECT parse_method, outcome, token_logprob_sum FROM predictions LIMIT 1").fetchall()
    assert got[0][0] == "answer_line" and got[0][1] == "answered" and got[0][2] == pytest.approx(-0.8)
    con.close()


def test_parquet_import(nota, tmp_path):
    con = _store(tmp_path, nota)
    # Parquet has no dict-with-free-keys type, so this file carries no option_logprobs
    path = tmp_path / "p.parquet"
    plain = [{k: v for k, v in r.items() if k != "option_logprobs"} for r in _records(nota)]
    pq.write_table(pa.Table.from_pylist(plain), path)
    res = import_predictions(con, path)
    assert res.added == 10
    con.close()


BAD = [
    ("bad_json", lambda recs: None, "not valid JSON"),
    ("unknown_item", lambda recs: recs[4].update(item_id="nope:plus_nota"), "item_id: unknown item"),
    ("unknown_label", lambda recs: recs[4].update(parsed_label="Z"), "parsed_label: 'Z' is not an option"),
    ("nan_logprob", lambda recs: recs[4]["option_logprobs"].update(A=float("nan")), "option_logprobs"),
    ("nan_token", lambda recs: recs[4].update(token_logprobs=[-0.1, float("nan")]), "token_logprobs"),
    ("missing_field", lambda recs: recs[4].pop("raw_output"), "raw_output: Field required"),
    ("bad_dataset", lambda recs: recs[4].update(dataset_id="0" * 64), "is not in the store"),
    ("bad_sha", lambda recs: recs[4].update(prompt_sha256="xyz"), "prompt_sha256"),
]


@pytest.mark.parametrize(("name", "mutate", "needle"), BAD)
def test_bad_records_are_refused_and_store_is_untouched(nota, tmp_path, name, mutate, needle):
    con = _store(tmp_path, nota)
    good = _write_jsonl(tmp_path / "good.jsonl", _records(nota, n=3))
    import_predictions(con, good)
    before = con.execute("SELECT * FROM predictions ORDER BY ALL").fetchall()
    recs = _records(nota)
    mutate(recs)
    path = tmp_path / f"{name}.jsonl"
    _write_jsonl(path, recs)
    if name == "bad_json":
        lines = path.read_text().splitlines()
        lines[4] = lines[4][:-5]
        path.write_text("\n".join(lines) + "\n")
    # catch by hand: an ExceptionInfo kept in a local would hold the traceback (and its DuckDB
    # objects) alive past interpreter shutdown, and DuckDB's bindings then print leak warnings
    try:
        import_predictions(con, path)
    except ImportError_ as e:
        msg = str(e)
    else:
        pytest.fail("bad file was imported")
    assert f"{path}:5" in msg and needle in msg, msg
    assert con.execute("SELECT * FROM predictions ORDER BY ALL").fetchall() == before
    con.close()


def test_cli_import_registers_dataset_and_reports(nota, tmp_path):
    f = _write_jsonl(tmp_path / "p.jsonl", _records(nota))
    store = tmp_path / "cli.duckdb"
    r = CliRunner().invoke(app, ["import", str(f), "--store", str(store), "--dataset", str(nota)])
    assert r.exit_code == 0, r.output
    assert "10 new" in r.output
    r = CliRunner().invoke(app, ["import", str(f), "--store", str(store)])
    assert r.exit_code == 0 and "0 new" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": 1}\n')
    r = CliRunner().invoke(app, ["import", str(bad), "--store", str(store)])
    assert r.exit_code == 2 and f"{bad}:1" in " ".join(r.output.split())


def test_schema_command_prints_the_import_format():
    r = CliRunner().invoke(app, ["schema", "prediction"])
    schema = json.loads(r.stdout)
    assert "item_id" in schema["properties"] and "option_logprobs" in schema["properties"]


def _stored(con) -> dict[str, list[tuple]]:
    return {
        t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
        for t in ("runs", "predictions", "option_scores")
    }


def _columnar_equals_record_path(nota, tmp_path, f) -> dict[str, list[tuple]]:
    """Import ``f`` into two fresh stores, through the columnar path (which must take it) and
    through the record-by-record path; assert both stored the same rows, and return them."""
    import equipoise.evaluators.importer as imp

    fast_con, slow_con = connect(tmp_path / "fast.duckdb"), connect(tmp_path / "slow.duckdb")
    try:
        for con in (fast_con, slow_con):
            register(con, nota, "plus_nota")
        assert imp._fast_import(fast_con, f) is not None
        import_predictions(slow_con, f, fast=False)
        stored = _stored(fast_con)
        assert stored == _stored(slow_con)
        return stored
    finally:
        fast_con.close()
        slow_con.close()


def _imported_like_record_path(nota, tmp_path, monkeypatch, f, n_records: int) -> duckdb.DuckDBPyConnection:
    """``import_predictions(f)`` into a fresh store must take the columnar path, report and store
    what the record-by-record path does in another, add all ``n_records`` and, imported again,
    nothing; returns the columnar store's connection (open) for further checks."""
    import equipoise.evaluators.importer as imp

    fast_con, slow_con = connect(tmp_path / "fast.duckdb"), connect(tmp_path / "slow.duckdb")
    for con in (fast_con, slow_con):
        register(con, nota, "plus_nota")
    taken = []
    real = imp._fast_import
    monkeypatch.setattr(imp, "_fast_import", lambda con, path: taken.append(real(con, path)) or taken[-1])
    fast = import_predictions(fast_con, f)
    assert taken and taken[0] is not None  # the columnar path did the import
    slow = import_predictions(slow_con, f, fast=False)
    assert fast == slow and fast.added == n_records
    assert _stored(fast_con) == _stored(slow_con)
    slow_con.close()
    assert import_predictions(fast_con, f).added == 0  # idempotent: a resume adds nothing
    return fast_con


def _variety(nota) -> list[dict]:
    """Valid records in every shape the format allows: parser-labelled and given labels, an
    abstain option, no scores, no token log-probs, defaults given and left out, a temperature,
    integer log-probabilities, two samples, two models."""
    recs = _records(nota, n=10)
    recs[0]["parsed_label"] = recs[0]["raw_output"][-1]
    recs[1].update(raw_output="I cannot answer this.", option_logprobs=None)
    recs[2].pop("token_logprobs")
    recs[3].update(backend="import:harness", prompt_style="cot", temperature=0.7, n_output_tokens=9)
    recs[4]["option_logprobs"] = {k: (0 if i == 0 else -4) for i, k in enumerate(recs[4]["option_logprobs"])}
    recs[5].update(raw_output="no letter here", latency_ms=None)
    recs[6]["parsed_label"] = next(iter(recs[6]["option_logprobs"]))
    extra = dict(recs[7], sample_index=1, raw_output="Answer: A", token_logprobs=[])
    other = dict(recs[8], model="second-model")
    return [*recs, extra, other]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_columnar_import_writes_what_the_checked_path_writes(nota, tmp_path, monkeypatch, fmt):

    recs = _variety(nota)
    if fmt == "jsonl":
        f = _write_jsonl(tmp_path / "p.jsonl", recs)
    else:  # Parquet has no dict-with-free-keys type: no option_logprobs, explicit defaults
        f = tmp_path / "p.parquet"
        rows = [{k: v for k, v in r.items() if k != "option_logprobs"} for r in recs]
        for r in rows:
            r.setdefault("backend", "import")
            r.setdefault("prompt_style", "base")
        pq.write_table(pa.Table.from_pylist(rows), f)
    fast_con = _imported_like_record_path(nota, tmp_path, monkeypatch, f, len(recs))
    outcomes = {r[0] for r in fast_con.execute("SELECT DISTINCT outcome FROM predictions").fetchall()}
    fast_con.close()
    assert {"answered", "unparsed"} <= outcomes


def test_one_options_scan_for_many_datasets_writes_the_same_rows(nota, tmp_path, monkeypatch):
    """The options of a file's items are read one (dataset, config) pair at a time up to
    _PAIR_SCANS pairs, in one scan beyond: both ways write what the checked path writes."""
    import equipoise.evaluators.importer as imp

    f = _write_jsonl(tmp_path / "p.jsonl", _variety(nota))
    stored = {}
    for name, limit in (("per_pair", 16), ("one_scan", 0)):
        monkeypatch.setattr(imp, "_PAIR_SCANS", limit)
        con = connect(tmp_path / f"{name}.duckdb")
        register(con, nota, "plus_nota")
        assert imp._fast_import(con, f) is not None
        stored[name] = _stored(con)
        con.close()
    slow_con = connect(tmp_path / "slow.duckdb")
    register(slow_con, nota, "plus_nota")
    import_predictions(slow_con, f, fast=False)
    assert stored["per_pair"] == stored["one_scan"] == _stored(slow_con)
    slow_con.close()


def test_a_partly_stored_run_gets_only_its_missing_rows(nota, tmp_path):
    """A run with rows already stored is written through the anti-join; a run with none is
    appended directly. Both in one file: only the missing keys are added, nothing is doubled."""
    import equipoise.evaluators.importer as imp

    recs = _records(nota)
    other = [dict(r, model="second-model") for r in recs[:3]]
    con = _store(tmp_path, nota)
    assert imp._fast_import(con, _write_jsonl(tmp_path / "half.jsonl", recs[:4])).added == 4
    done = imp._fast_import(con, _write_jsonl(tmp_path / "all.jsonl", recs + other))
    assert done is not None and done.rows == 13 and done.added == 9
    assert scalar(con, "SELECT count(*) FROM predictions") == 13
    n_scores = sum(len(r["option_logprobs"]) for r in recs + other)
    assert scalar(con, "SELECT count(*) FROM option_scores") == n_scores
    assert (
        scalar(
            con,
            "SELECT count(*) FROM (SELECT DISTINCT run_id, item_id, sample_index, label FROM option_scores)",
        )
        == n_scores
    )
    con.close()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.update(backend=None),  # explicit null where a default exists: a validation error
        lambda r: r.update(sample_index="1"),  # a string the checked path coerces
        lambda r: r.update(extra_field=1),
        lambda r: r["option_logprobs"].update(A=0.5),  # a positive log-probability
    ],
    ids=["null_backend", "string_index", "extra_field", "positive_logprob"],
)
def test_anything_uncertain_takes_the_checked_path(nota, tmp_path, mutate):
    import equipoise.evaluators.importer as imp

    recs = _records(nota)
    mutate(recs[3])
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    con = _store(tmp_path, nota)
    assert imp._fast_import(con, f) is None
    assert scalar(con, "SELECT count(*) FROM predictions") == 0
    con.close()


def _dup_key(recs: list[dict]) -> None:
    recs[4].update(item_id=recs[0]["item_id"], sample_index=recs[0]["sample_index"])


# Crafted bad files: each breaks one rule, in a way the columnar checks must see themselves (no
# parse error does it for them). Both paths must refuse every one; the message is the record
# path's, so it is the same whichever path runs first.
CRAFTED = [
    ("unknown_option_label", lambda recs: recs[4]["option_logprobs"].update(Z=-1.0)),
    ("unknown_parsed_label", lambda recs: recs[4].update(parsed_label="Z")),
    ("positive_logprob", lambda recs: recs[4]["option_logprobs"].update(A=0.5)),
    ("missing_column", lambda recs: recs[4].pop("raw_output")),
    ("null_raw_output", lambda recs: recs[4].update(raw_output=None)),
    ("unknown_dataset", lambda recs: recs[4].update(dataset_id="0" * 64)),
    ("unknown_config", lambda recs: recs[4].update(config="no_such_config")),
    ("unknown_item", lambda recs: recs[4].update(item_id="nope:plus_nota")),
    ("repeated_key", _dup_key),
    ("negative_sample", lambda recs: recs[4].update(sample_index=-1)),
    ("huge_sample", lambda recs: recs[4].update(sample_index=2**31)),
    ("huge_tokens", lambda recs: recs[4].update(n_output_tokens=2**31)),
    ("negative_latency", lambda recs: recs[4].update(latency_ms=-1.0)),
    ("negative_temperature", lambda recs: recs[4].update(temperature=-0.5)),
    ("bad_sha", lambda recs: recs[4].update(prompt_sha256="A" * 64)),
    ("empty_model", lambda recs: recs[4].update(model="")),
    ("empty_template", lambda recs: recs[4].update(prompt_template_id="")),
    ("null_config", lambda recs: recs[4].update(config=None)),
]


@pytest.mark.parametrize(("name", "mutate"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_columnar_and_record_paths_refuse_the_same_crafted_files(nota, tmp_path, name, mutate):
    import equipoise.evaluators.importer as imp

    con = _store(tmp_path, nota)
    import_predictions(con, _write_jsonl(tmp_path / "good.jsonl", _records(nota, n=3)))
    before = _stored(con)
    recs = _records(nota)
    mutate(recs)
    f = _write_jsonl(tmp_path / f"{name}.jsonl", recs)
    assert imp._fast_import(con, f) is None  # the columnar checks refuse it on their own
    messages = []
    for fast in (False, True):
        try:
            import_predictions(con, f, fast=fast)
        except ImportError_ as e:
            messages.append(str(e))
        else:
            pytest.fail(f"{name} was imported (fast={fast})")
    assert messages[0] == messages[1] and f"{f}:5" in messages[0], messages
    assert _stored(con) == before
    con.close()


@pytest.mark.parametrize("fault", ["unknown_item", "negative_sample", "missing_column", "bad_sha"])
def test_parquet_crafted_files_are_refused_by_both_paths(nota, tmp_path, fault):
    import equipoise.evaluators.importer as imp

    recs = [{k: v for k, v in r.items() if k != "option_logprobs"} for r in _records(nota)]
    dict(CRAFTED)[fault](recs)
    f = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(recs), f)
    con = _store(tmp_path, nota)
    assert imp._fast_import(con, f) is None
    with pytest.raises(ImportError_, match=rf"{f}:5: "):
        import_predictions(con, f)
    assert scalar(con, "SELECT count(*) FROM predictions") == 0
    con.close()


@pytest.mark.parametrize(
    "late",
    [
        lambda r: r["option_logprobs"].pop(next(iter(r["option_logprobs"]))),  # a label absent later
        lambda r: r.update(backend="import:late"),  # a defaulted key first seen after the sample
        lambda r: r.update(token_logprobs=[-1, -2]),  # integers where the sample had floats
        lambda r: r.update(temperature=0.3),
    ],
    ids=["fewer_labels", "late_backend", "int_tokens", "late_temperature"],
)
def test_types_taken_from_the_head_of_the_file_never_change_the_result(nota, tmp_path, monkeypatch, late):
    """The columnar parse types a large file from its first lines (``_SAMPLE_BYTES``); whatever
    the later lines hold, it writes what the record path writes."""
    import equipoise.evaluators.importer as imp

    monkeypatch.setattr(imp, "_SAMPLE_BYTES", 1500)  # a few records: the rest is "later"
    recs = _records(nota)
    for r in recs[6:]:
        late(r)
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    _columnar_equals_record_path(nota, tmp_path, f)


def test_a_pyarrow_without_the_streaming_json_reader_parses_the_same_table(nota, tmp_path, monkeypatch):
    """The typed parse streams with ``pyarrow.json.open_json`` where this pyarrow has it (its Python
    binding is newer than the oldest pyarrow allowed) and falls back to ``read_json``: one table."""
    import equipoise.evaluators.importer as imp

    monkeypatch.setattr(imp, "_SAMPLE_BYTES", 1500)  # typed from the head, as a large file is
    f = _write_jsonl(tmp_path / "p.jsonl", _records(nota))
    opened = []
    real = imp.pyarrow.json.open_json
    monkeypatch.setattr(imp.pyarrow.json, "open_json", lambda *a, **k: opened.append(1) or real(*a, **k))
    streamed = imp._parse_jsonl(f)
    assert opened  # the typed parse ran, streamed
    monkeypatch.delattr(imp.pyarrow.json, "open_json")
    assert imp._parse_jsonl(f).equals(streamed)
    assert streamed.num_rows == len(_records(nota))


def test_an_explicit_null_after_the_sample_is_still_refused(nota, tmp_path, monkeypatch):
    """``"backend": null`` is a validation error, an absent backend is the default: a null that
    only appears after the typed head of the file must still be judged as a null."""
    import equipoise.evaluators.importer as imp

    monkeypatch.setattr(imp, "_SAMPLE_BYTES", 1500)
    recs = _records(nota)
    recs[8]["backend"] = None
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    con = _store(tmp_path, nota)
    assert imp._fast_import(con, f) is None
    with pytest.raises(ImportError_, match=rf"{f}:9: backend"):
        import_predictions(con, f)
    con.close()


def test_the_columnar_parse_maps_the_file_only_for_the_null_scan(nota, tmp_path, monkeypatch):
    """A JSONL file is parsed from a stream of blocks, never memory-mapped whole (a mapping keeps
    every page it touched resident: about the file's size of extra peak memory). The map is
    taken only when the columns leave a null-vs-absent question open, and then the scan still
    decides: a file without scores needs no scan; one where a record scores fewer labels (absent,
    fine) is scanned and imported columnar."""
    import equipoise.evaluators.importer as imp

    maps = []
    real_map = imp.pyarrow.memory_map

    def counting_map(*args, **kwargs):
        maps.append(args[0])
        return real_map(*args, **kwargs)

    monkeypatch.setattr(imp.pyarrow, "memory_map", counting_map)
    # typed from the head (as a large file is): a small file is parsed with every defaulted
    # column present and null, which always leaves the question open
    monkeypatch.setattr(imp, "_SAMPLE_BYTES", 1500)
    recs = _records(nota)
    plain = _write_jsonl(tmp_path / "plain.jsonl", [{**r, "option_logprobs": None} for r in recs])
    recs[4]["option_logprobs"].pop(next(iter(recs[4]["option_logprobs"])))  # absent: not a null
    fewer = _write_jsonl(tmp_path / "fewer.jsonl", recs)
    for f, mapped in ((plain, []), (fewer, [str(fewer)])):
        maps.clear()
        stores = tmp_path / f.stem  # each file's own pair of stores
        stores.mkdir()
        # the record path never maps (it does not parse columnar), so the maps seen are the columnar path's
        _columnar_equals_record_path(nota, stores, f)
        assert maps == mapped


def _same_run_other_template(recs: list[dict]) -> None:
    """Record 5 repeats record 1's item and sample under another prompt_template_id: a different
    run key, but the same run (the run id leaves the template id out), so a repeated key."""
    recs[4].update(
        item_id=recs[0]["item_id"], sample_index=recs[0]["sample_index"], prompt_template_id="other"
    )


@pytest.mark.parametrize(
    ("name", "mutate"),
    [*CRAFTED, ("same_run_other_template", _same_run_other_template)],
    ids=[*(c[0] for c in CRAFTED), "same_run_other_template"],
)
def test_a_first_import_refuses_crafted_files_and_stores_nothing(nota, tmp_path, name, mutate):
    """A run with no stored rows is appended with its item / label checks inside the predictions
    INSERT (a failing record raises there and the transaction rolls back). Into an empty store
    (that path) every crafted file is refused by the columnar path on its own, with the record
    path's message, and leaves no row behind: no prediction, no score, no run."""
    import equipoise.evaluators.importer as imp

    con = _store(tmp_path, nota)
    recs = _records(nota)
    mutate(recs)
    f = _write_jsonl(tmp_path / f"{name}.jsonl", recs)
    assert imp._fast_import(con, f) is None
    with pytest.raises(ImportError_, match=rf"{f}:5: "):
        import_predictions(con, f)
    for table in ("runs", "predictions", "option_scores"):
        assert scalar(con, f"SELECT count(*) FROM {table}") == 0, table
    con.close()


@pytest.mark.parametrize("fault", ["unknown_option_label", "unknown_parsed_label", "unknown_item"])
def test_a_label_fault_on_a_first_import_is_caught_by_the_insert(nota, tmp_path, monkeypatch, fault):
    """The fused first-import path really checks labels inside the INSERT: the label fault reaches
    the predictions INSERT (no earlier check refuses the file) and DuckDB's error() stops it."""
    import equipoise.evaluators.importer as imp

    raised = []
    real = imp.insert_selects

    def spy(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except imp.duckdb.Error as exc:
            raised.append(str(exc))
            raise

    monkeypatch.setattr(imp, "insert_selects", spy)
    con = _store(tmp_path, nota)
    recs = _records(nota)
    for r in recs:  # labels given: no record needs the parser, which would look its item up first
        r["parsed_label"] = r["raw_output"][-1]
    dict(CRAFTED)[fault](recs)
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    assert imp._fast_import(con, f) is None
    assert len(raised) == 1 and imp._LABEL_FAULT in raised[0]
    assert scalar(con, "SELECT count(*) FROM runs") == 0
    con.close()


def test_a_first_import_and_a_resume_write_the_same_rows(nota, tmp_path):
    """The fused path (no stored rows of the run) and the checked-then-appended path (a run with
    stored rows) write identical rows: the same file imported whole into an empty store, and in
    two halves (the second half a resume), gives the same tables, which are the record path's."""
    import equipoise.evaluators.importer as imp

    recs = _variety(nota)
    whole = _write_jsonl(tmp_path / "whole.jsonl", recs)
    head = _write_jsonl(tmp_path / "head.jsonl", recs[:3])
    one = connect(tmp_path / "one.duckdb")
    two = connect(tmp_path / "two.duckdb")
    slow = connect(tmp_path / "slow.duckdb")
    for con in (one, two, slow):
        register(con, nota, "plus_nota")
    assert imp._fast_import(one, whole).added == len(recs)
    assert imp._fast_import(two, head).added == 3
    assert imp._fast_import(two, whole).added == len(recs) - 3
    import_predictions(slow, whole, fast=False)
    assert _stored(one) == _stored(two) == _stored(slow)
    # neither path leaves its working tables (the item option bits, the joined rows) behind
    for con in (one, two):
        assert not scalar(con, "SELECT count(*) FROM duckdb_tables() WHERE starts_with(table_name, '_imp')")
    for con in (one, two, slow):
        con.close()


def test_parquet_run_columns_are_read_as_dictionaries(nota, tmp_path):
    """The columnar path reads a Parquet file's run columns and parsed_label as dictionaries (a
    near-constant 64-character id is not written out once per row) and free text plain; the rows
    it writes from them are the record path's."""
    import equipoise.evaluators.importer as imp

    recs = [{k: v for k, v in r.items() if k != "option_logprobs"} for r in _records(nota)]
    for r in recs:
        r["parsed_label"] = r["raw_output"][-1]
    f = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(recs), f)
    table, _ = imp._read_columns(f)
    for name in ("model", "dataset_id", "config", "prompt_sha256", "parsed_label"):
        assert pa.types.is_dictionary(table[name].type), name
    assert table["item_id"].type == pa.string() and table["raw_output"].type == pa.string()
    _columnar_equals_record_path(nota, tmp_path, f)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_file_without_token_logprobs_writes_what_the_checked_path_writes(nota, tmp_path, fmt):
    """No record has token_logprobs: the columnar path writes the token columns as NULL without
    the list functions (and n_output_tokens as given); the rows are the record path's."""

    recs = _records(nota)
    for i, r in enumerate(recs):
        r.pop("token_logprobs")
        if i % 2:
            r["n_output_tokens"] = 7
    if fmt == "jsonl":
        f = _write_jsonl(tmp_path / "p.jsonl", recs)
    else:
        f = tmp_path / "p.parquet"
        # every key in the first row (from_pylist takes the columns from it): null where absent
        rows = [
            {"n_output_tokens": None, **{k: v for k, v in r.items() if k != "option_logprobs"}} for r in recs
        ]
        pq.write_table(pa.Table.from_pylist(rows), f)
    stored = _columnar_equals_record_path(nota, tmp_path, f)
    # n_output_tokens: given (7) or absent (NULL); a column of predictions
    con = connect(tmp_path / "fast.duckdb", read_only=True)
    try:
        tokens = con.execute("SELECT DISTINCT n_output_tokens FROM predictions ORDER BY 1").fetchall()
    finally:
        con.close()
    assert stored["predictions"] and tokens == [(7,), (None,)]


def test_constant_run_columns_are_told_apart_from_varying_ones():
    """The run keys are grouped only on the run columns that are not constant: a column is
    constant when all null, or null-free with every value equal (NaN never equals itself),
    across chunks and dictionary chunks alike."""
    from equipoise.evaluators.importer import _constant

    assert _constant(pa.chunked_array([pa.array(["a", "a"]), pa.array(["a"])]))
    assert not _constant(pa.chunked_array([pa.array(["a", "a"]), pa.array(["b"])]))
    assert _constant(pa.chunked_array([pa.array([None, None], pa.float64())]))
    assert not _constant(pa.chunked_array([pa.array([0.7, None])]))
    assert not _constant(pa.chunked_array([pa.array([None, 0.7])]))
    assert not _constant(pa.chunked_array([pa.array([float("nan"), float("nan")])]))
    assert _constant(pa.chunked_array([pa.array([0.3, 0.3])]))
    dicts = [pa.array(v).dictionary_encode() for v in (["x", "x"], ["y", "x"])]
    assert not _constant(pa.chunked_array(dicts))
    assert _constant(pa.chunked_array([dicts[0], pa.array(["x"]).dictionary_encode()]))
    # a dictionary that repeats a value: different indices, one value
    twice = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["x", "x"]))
    assert _constant(pa.chunked_array([twice, pa.array(["x"]).dictionary_encode()]))
    assert not _constant(pa.chunked_array([twice, pa.array(["y"]).dictionary_encode()]))
    assert _constant(pa.chunked_array([pa.array([], pa.string()).dictionary_encode(), dicts[0]]))
    assert _constant(pa.chunked_array([pa.array([3, 3], pa.int64())]))
    assert not _constant(pa.chunked_array([pa.array([3, 4], pa.int64())]))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_run_keys_with_every_column_constant_or_one_varying(nota, tmp_path, fmt):
    """Grouping the run keys on the varying columns only writes what the record path writes: a
    file whose every run column is constant (a temperature given in all records), and one whose
    only varying run column is the temperature (one run per value)."""
    for name, temps in (("all_constant", [0.5] * 10), ("temperature_varies", [0.5] * 5 + [0.25] * 5)):
        recs = [dict(r, temperature=t) for r, t in zip(_records(nota), temps, strict=True)]
        folder = tmp_path / f"{name}_{fmt}"
        folder.mkdir()
        if fmt == "jsonl":
            f = _write_jsonl(folder / "p.jsonl", recs)
        else:
            f = folder / "p.parquet"
            rows = [{k: v for k, v in r.items() if k != "option_logprobs"} for r in recs]
            pq.write_table(pa.Table.from_pylist(rows), f)
        stored = _columnar_equals_record_path(nota, folder, f)
        runs = {row[0] for row in stored["predictions"]}
        assert len(runs) == len(set(temps))
