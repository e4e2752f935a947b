"""Schema v4's per-item option bits: always what the stored options say, whichever way the options
got there (a write batch in either order, the v3 -> v4 migration, plain SQL), and the importer's
checks on them accept and refuse exactly what the record-by-record path does."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

import equipoise.evaluators.importer as imp
from equipoise.cli import app
from equipoise.evaluators import store as st
from equipoise.evaluators.importer import ImportError_, import_predictions
from equipoise.evaluators.ingest import register
from equipoise.evaluators.metrics import facts
from equipoise.evaluators.store import ItemRow, OptionRow, connect, insert_batch
from tests.test_import import _records, _stored, _write_jsonl
from tests.test_store_migrate import _all_metrics, _v1_store


def _expected_bits(
    con: duckdb.DuckDBPyConnection,
) -> dict[tuple[str, str, str], tuple[int | None, int | None]]:
    """Each item's bits computed in Python from its option rows, independently of the SQL: the
    bit of a label is 2 ** (its position in OPTION_LABELS); an item with a label outside that
    list, or without options, has none."""
    opts: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for did, cfg, item, label, role in con.execute(
        "SELECT dataset_id, config, item_id, label, role FROM options"
    ).fetchall():
        opts.setdefault((did, cfg, item), []).append((label, role))
    out: dict[tuple[str, str, str], tuple[int | None, int | None]] = {}
    for key in con.execute("SELECT dataset_id, config, item_id FROM items").fetchall():
        got = opts.get(tuple(key), [])
        if not got or any(label not in st.OPTION_LABELS for label, _ in got):
            out[tuple(key)] = (None, None)
            continue
        every = sum(2 ** st.OPTION_LABELS.index(label) for label, _ in got)
        abstain = sum(2 ** st.OPTION_LABELS.index(label) for label, role in got if role == "abstain")
        out[tuple(key)] = (every, abstain)
    return out


def _stored_bits(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str], tuple[int | None, int | None]]:
    rows = con.execute("SELECT dataset_id, config, item_id, option_bits, abstain_bits FROM items").fetchall()
    return {(d, c, i): (b, a) for d, c, i, b, a in rows}


def test_the_label_list_gives_each_label_its_own_bit() -> None:
    assert len(set(st.OPTION_LABELS)) == len(st.OPTION_LABELS) < 63
    assert st.OPTION_LABELS[:4] == ("A", "B", "C", "D") and "Unable to determine" in st.OPTION_LABELS
    assert sorted(st.OPTION_LABEL_BITS.values()) == [1 << b for b in range(len(st.OPTION_LABELS))]


def test_a_registered_suite_stores_the_bits_of_its_options(nota, tmp_path) -> None:
    con = connect(tmp_path / "s.duckdb")
    register(con, nota, "plus_nota")
    register(con, nota, "minus_correct_plus_nota")
    bits = _stored_bits(con)
    assert bits == _expected_bits(con)
    assert all(b is not None for b, _ in bits.values())
    con.close()


@pytest.mark.parametrize("order", ["items_first", "options_first", "one_batch"])
def test_bits_follow_the_options_in_any_write_order(tmp_path, order) -> None:
    con = connect(tmp_path / "s.duckdb")
    common = dict(dataset_id="d", config="c", base_id="b", task="mcq", suite="s", variant="v")
    items = [
        ItemRow(**common, item_id=f"i{n}", target_label="A", target_role="gold", has_gold=True,
                abstain_expected=False, n_options=n)
        for n in (2, 3)
    ]  # fmt: skip
    roles = ["gold", "distractor", "abstain"]
    options = [
        OptionRow(dataset_id="d", config="c", item_id=f"i{n}", label=chr(65 + k), option_id=f"o{n}{k}",
                  role=roles[k])
        for n in (2, 3)
        for k in range(n)
    ]  # fmt: skip
    if order == "one_batch":
        insert_batch(con, [(ItemRow, items), (OptionRow, options)])
    else:
        first, second = ((ItemRow, items), (OptionRow, options))[:: 1 if order == "items_first" else -1]
        insert_batch(con, [first])
        insert_batch(con, [second])
    assert _stored_bits(con) == {("d", "c", "i2"): (0b11, 0), ("d", "c", "i3"): (0b111, 0b100)}
    # an option added later (another batch) updates its item's bits; a repeated batch changes nothing
    insert_batch(con, [(OptionRow, [OptionRow(dataset_id="d", config="c", item_id="i2", label="Met",
                                              option_id="m", role="abstain")])])  # fmt: skip
    insert_batch(con, [(OptionRow, options)])
    met = st.OPTION_LABEL_BITS["Met"]
    assert _stored_bits(con) == {("d", "c", "i2"): (0b11 | met, met), ("d", "c", "i3"): (0b111, 0b100)}
    con.close()


def test_the_v4_migration_keeps_the_facts_current(tmp_path) -> None:
    """The bits are derived from options, which the store's fingerprint covers: they are left out
    of it, so a v3 store's facts stay current through the migration (no full refresh), and
    rewriting the bits never invalidates them either."""
    path = _v1_store(tmp_path, version=3)
    con = duckdb.connect(str(path))
    facts.refresh(con)
    fp = facts.current(con)
    con.close()
    assert fp is not None
    r = CliRunner().invoke(app, ["store", "migrate", str(path)])
    assert r.exit_code == 0, r.output
    con = st.connect(path)
    assert facts.current(con) == fp
    assert not facts.refresh(con)  # nothing to write
    con.execute("UPDATE items SET option_bits = NULL, abstain_bits = NULL").fetchall()
    assert facts.current(con) == fp
    st.refresh_option_bits(con)
    assert _stored_bits(con) == _expected_bits(con) and facts.current(con) == fp
    con.close()


def test_the_v4_migration_computes_the_bits_and_keeps_every_metric(tmp_path) -> None:
    path = _v1_store(tmp_path, version=3)
    con = duckdb.connect(str(path))
    # one item offered a label without a bit (plain SQL, as another tool might write it)
    con.execute(
        "INSERT INTO options SELECT * REPLACE ('Yes' AS label, option_id || '-yes' AS option_id) "
        "FROM options WHERE label = 'A' AND item_id = (SELECT min(item_id) FROM items)"
    ).fetchall()
    before = _all_metrics(con)
    con.close()
    assert st.migrate_store(path) == (3, st.SCHEMA_VERSION)
    con = st.connect(path, read_only=True)
    bits = _stored_bits(con)
    assert bits == _expected_bits(con)
    assert (
        sum(b is None for b, _ in bits.values()) >= 1 and sum(b is not None for b, _ in bits.values()) > 100
    )
    assert st.option_bits_current(con)
    after = _all_metrics(con)
    con.close()
    assert before.keys() == after.keys()
    for name in before:
        pd.testing.assert_frame_equal(before[name], after[name], obj=name)


def _target(con: duckdb.DuckDBPyConnection, item_id: str) -> tuple[str, str]:
    return con.execute(
        "SELECT dataset_id, config FROM items WHERE item_id = ? AND config = 'plus_nota'", [item_id]
    ).fetchall()[0]


# plain-SQL edits of one item's options in the plus_nota config (the ``?`` is the item id)
DELETE_B = "DELETE FROM options WHERE item_id = ? AND config = 'plus_nota' AND label = 'B'"
COPY_A_AS = (
    "INSERT INTO options SELECT * REPLACE ('{label}' AS label, option_id || '-{label}' AS option_id) "
    "FROM options WHERE item_id = ? AND config = 'plus_nota' AND label = 'A'"
)


def _edited_store(nota, path: Path, sql: str, item_id: str) -> duckdb.DuckDBPyConnection:
    """A store holding the suite's plus_nota config, then ``sql`` run on it for ``item_id``."""
    con = connect(path)
    register(con, nota, "plus_nota")
    con.execute(sql, [item_id]).fetchall()
    return con


@pytest.mark.parametrize("then", ["import", "batch_then_import"])
def test_an_option_deleted_by_plain_sql_is_refused_as_the_checked_path_refuses_it(
    nota, tmp_path, then
) -> None:
    """Stale bits (an option row deleted behind the store's back) are found by the options' row
    count and recomputed before the import trusts them: the record naming the deleted label is
    refused with the checked path's error, and nothing is stored. ``batch_then_import``: a write
    batch of other items comes first, and finding the bits stale it refreshes all of them, not
    only its own (recording the new count over the edited item's old bits would hide them from
    every later check)."""
    recs = _records(nota, n=4)
    rec = recs[2]
    rec["raw_output"] = "Answer: B"
    rec["parsed_label"] = "B"
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    errors = []
    for fast in (True, False):
        con = _edited_store(nota, tmp_path / f"s{fast}.duckdb", DELETE_B, rec["item_id"])
        assert not st.option_bits_current(con)
        if then == "batch_then_import":
            register(con, nota, "minus_correct_plus_nota")
            assert st.option_bits_current(con) and _stored_bits(con) == _expected_bits(con)
        with pytest.raises(ImportError_) as exc:
            import_predictions(con, f, fast=fast)
        errors.append(str(exc.value))
        assert con.execute("SELECT count(*) FROM predictions").fetchone()[0] == 0
        if fast:  # the import repaired the bits on its way, if the batch had not
            assert _stored_bits(con) == _expected_bits(con) and st.option_bits_current(con)
        con.close()
    assert errors[0] == errors[1] and ":3:" in errors[0]


def test_an_option_added_by_plain_sql_is_accepted_as_the_checked_path_accepts_it(nota, tmp_path) -> None:
    """An option inserted by plain SQL (no bits written with it) is counted, the bits refreshed,
    and a record naming it goes through the columnar path, storing what the checked path stores."""
    recs = _records(nota, n=4)
    rec = recs[1]
    rec["raw_output"], rec["parsed_label"] = "Answer: Z", "Z"
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    stored = []
    for fast in (True, False):
        con = _edited_store(nota, tmp_path / f"s{fast}.duckdb", COPY_A_AS.format(label="Z"), rec["item_id"])
        if fast:
            assert imp._fast_import(con, f) is not None
        else:
            import_predictions(con, f, fast=False)
        stored.append(_stored(con))
        con.close()
    assert stored[0] == stored[1] and len(stored[0]["predictions"]) == 4


@pytest.mark.parametrize("label", ["Yes", "A"])
def test_items_whose_labels_have_no_bit_are_imported_by_the_checked_path(nota, tmp_path, label) -> None:
    """An item offering a label outside OPTION_LABELS keeps NULL bits: the columnar path cannot
    vouch for any of its records, whether they name that label or a letter the item also offers,
    and hands the file to the record-by-record path, which stores what it stores on its own."""
    recs = _records(nota, n=4)
    rec = recs[0]
    rec["raw_output"], rec["parsed_label"] = f"Answer: {label}", label
    f = _write_jsonl(tmp_path / "p.jsonl", recs)
    stored = []
    for fast in (True, False):
        con = _edited_store(nota, tmp_path / f"s{fast}.duckdb", COPY_A_AS.format(label="Yes"), rec["item_id"])
        if fast:
            assert imp._fast_import(con, f) is None
            assert _stored_bits(con)[(*_target(con, rec["item_id"]), rec["item_id"])] == (None, None)
        assert import_predictions(con, f, fast=fast).added == 4
        stored.append(_stored(con))
        con.close()
    assert stored[0] == stored[1]
    assert next(r for r in stored[0]["predictions"] if r[1] == rec["item_id"])[4] == label


# plain-SQL edits of options that change its number of rows (found by the count) and that do not
# (the documented limit: refresh_option_bits repairs them)
COUNTED = {
    "option_deleted": "DELETE FROM options WHERE item_id = '{item}' AND label = 'B'",
    "option_added": "INSERT INTO options SELECT * REPLACE ('Q' AS label, option_id || 'q' AS option_id) "
    "FROM options WHERE item_id = '{item}' AND label = 'A'",
    "all_options_deleted": "DELETE FROM options",
}
UNCOUNTED = {
    "label_changed": "UPDATE options SET label = 'Q' WHERE item_id = '{item}' AND label = 'B'",
    "role_to_abstain": "UPDATE options SET role = 'abstain' WHERE item_id = '{item}' AND label = 'B'",
}


@pytest.mark.parametrize("edit", sorted({**COUNTED, **UNCOUNTED}))
def test_plain_sql_edits_of_options_are_found_by_count_or_repaired_on_demand(nota, tmp_path, edit) -> None:
    con = connect(tmp_path / "s.duckdb")
    register(con, nota, "plus_nota")
    assert st.option_bits_current(con) and _stored_bits(con) == _expected_bits(con)
    item = con.execute("SELECT min(item_id) FROM items").fetchall()[0][0]
    con.execute({**COUNTED, **UNCOUNTED}[edit].format(item=item)).fetchall()
    assert _stored_bits(con) != _expected_bits(con)
    if edit in COUNTED:
        assert not st.option_bits_current(con)
        assert st.ensure_option_bits(con)
    else:
        assert st.option_bits_current(con) and not st.ensure_option_bits(con)
        st.refresh_option_bits(con)
    assert _stored_bits(con) == _expected_bits(con) and st.option_bits_current(con)
    assert not st.ensure_option_bits(con)  # nothing left to do
    con.close()
