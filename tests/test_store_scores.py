"""Store schema v3: a sample's option scores are two lists on its prediction row, written with it,
and read back in long format through the view ``option_scores``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from equipoise.evaluators.metrics import facts
from equipoise.evaluators.store import (
    OptionScoreRow,
    PredictionRow,
    connect,
    count_rows,
    insert,
    insert_batch,
    insert_table,
)
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from equipoise.schemas.features import to_table


def _pred(item: str, sample: int = 0, run: str = "r1") -> PredictionRow:
    return PredictionRow(
        run_id=run,
        item_id=item,
        sample_index=sample,
        raw_output="Answer: A",
        parsed_label="A",
        parse_method="answer_line",
        outcome="answered",
    )


def _score(item: str, label: str, logprob: float, sample: int = 0, run: str = "r1") -> OptionScoreRow:
    return OptionScoreRow(run_id=run, item_id=item, sample_index=sample, label=label, logprob=logprob)


@pytest.fixture()
def con(tmp_path: Path):
    c = connect(tmp_path / "s.duckdb")
    yield c
    c.close()


def _lists(con) -> dict[tuple[str, int], tuple[list[str] | None, list[float] | None]]:
    rows = con.execute(
        "SELECT item_id, sample_index, score_labels, score_logprobs FROM predictions"
    ).fetchall()
    return {(i, s): (labels, lps) for i, s, labels, lps in rows}


def test_scores_written_with_their_predictions_become_sorted_lists(con) -> None:
    scores = [_score("x", "C", -2.0), _score("x", "A", -0.5), _score("x", "B", -1.0), _score("y", "B", -0.1)]
    insert_batch(con, [(PredictionRow, [_pred("x"), _pred("y"), _pred("z")]), (OptionScoreRow, scores)])
    assert _lists(con) == {
        ("x", 0): (["A", "B", "C"], [-0.5, -1.0, -2.0]),
        ("y", 0): (["B"], [-0.1]),
        ("z", 0): (None, None),  # no score: NULL, not an empty list
    }
    long = con.execute("SELECT item_id, label, logprob FROM option_scores ORDER BY ALL").fetchall()
    assert long == sorted((s.item_id, s.label, s.logprob) for s in scores)
    assert count_rows(con, "option_scores") == 4 and count_rows(con, "predictions") == 3


def test_writes_stay_idempotent_and_a_stored_samples_scores_are_never_replaced(con) -> None:
    batch = [(PredictionRow, [_pred("x")]), (OptionScoreRow, [_score("x", "A", -0.5)])]
    insert_batch(con, batch)
    insert_batch(con, batch)
    insert_batch(con, [(PredictionRow, [_pred("x")]), (OptionScoreRow, [_score("x", "B", -9.0)])])
    assert _lists(con) == {("x", 0): (["A"], [-0.5])}
    # a label repeated within one batch keeps its first score, as the long table's writes did
    insert_batch(
        con,
        [(PredictionRow, [_pred("y")]), (OptionScoreRow, [_score("y", "A", -1.0), _score("y", "A", -2.0)])],
    )
    assert _lists(con)[("y", 0)] == (["A"], [-1.0])


def test_scores_of_a_stored_sample_without_any_are_attached_later(con) -> None:
    insert(con, PredictionRow, [_pred("x"), _pred("y")])
    table = pa.Table.from_pylist([s.model_dump() for s in (_score("x", "B", -1.0), _score("x", "A", -0.2))])
    assert insert_table(con, "option_scores", table) == 2
    assert insert_table(con, "option_scores", table) == 0  # already there
    assert _lists(con) == {("x", 0): (["A", "B"], [-0.2, -1.0]), ("y", 0): (None, None)}


def test_scores_without_their_prediction_are_refused_and_the_batch_is_not_stored(con) -> None:
    with pytest.raises(ValueError, match="run r1 item ghost sample 0, which has no prediction"):
        insert_batch(con, [(PredictionRow, [_pred("x")]), (OptionScoreRow, [_score("ghost", "A", -0.5)])])
    assert count_rows(con, "predictions") == 0  # the whole batch was rolled back


def test_prediction_rows_refuse_unpaired_or_unsorted_lists() -> None:
    base = _pred("x").model_dump()
    for labels, lps in ((["A"], None), (["B", "A"], [-1.0, -2.0]), (["A", "A"], [-1.0, -1.0]), (["A"], [])):
        with pytest.raises(ValidationError):
            PredictionRow(**{**base, "score_labels": labels, "score_logprobs": lps})
    row = PredictionRow(**{**base, "score_labels": ["A", "B"], "score_logprobs": [-1.0, -2.0]})
    assert row.score_labels == ["A", "B"]


def test_a_changed_score_makes_the_facts_of_its_run_stale(tmp_path: Path) -> None:
    """The fingerprints hash the prediction rows, lists included (``option_scores`` is a view and no
    longer hashed on its own): editing one log-probability is a change to that run."""
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=20, models=("m1", "m2"), samples=1, seed=2))
    con = connect(path)
    facts.refresh(con)
    assert facts.current(con) is not None
    con.execute(
        "UPDATE predictions SET score_logprobs = list_transform(score_logprobs, lambda x: x - 0.5) "
        "WHERE item_id = (SELECT min(item_id) FROM predictions)"
    )
    assert facts.current(con) is None
    facts.refresh(con)
    assert facts.current(con) is not None
    con.close()


def test_a_stored_prediction_without_scores_gets_them_when_it_is_sent_again_with_them(con) -> None:
    """A batch that re-sends a stored bare prediction with its scores (a resume, a re-import of a
    richer file): the row is not appended again, and its scores still reach the stored row."""
    insert(con, PredictionRow, [_pred("x")])
    insert_batch(con, [(PredictionRow, [_pred("x"), _pred("y")]), (OptionScoreRow, [_score("x", "A", -0.3)])])
    assert _lists(con) == {("x", 0): (["A"], [-0.3]), ("y", 0): (None, None)}


@pytest.mark.parametrize(
    ("labels", "logprobs"),
    [([], []), (["B", "A"], [-1.0, -2.0]), (["A", "B"], [-1.0]), (["A", "A"], [-1.0, -2.0]), (["A"], None)],
)
def test_arrow_rows_with_broken_score_lists_are_refused(con, labels, logprobs) -> None:
    """Rows that arrive as an Arrow table (a Parquet part, ``insert_table``) skip the row model's
    validator; the store checks the same layout and stores nothing of the batch."""
    row = {**_pred("x").model_dump(), "score_labels": labels, "score_logprobs": logprobs}
    table = pa.Table.from_pylist([row], schema=to_table(PredictionRow, []).schema)
    with pytest.raises(ValueError, match="run r1 item x sample 0: score_labels and score_logprobs"):
        insert_table(con, "predictions", table)
    assert count_rows(con, "predictions") == 0


def test_a_duckdb_error_while_attaching_scores_is_the_error_raised(con, monkeypatch) -> None:
    """The attach step's TEMP tables go with the rollback; an error inside it reaches the caller
    as itself, not as the refusal of a cleanup statement in an aborted transaction."""
    import duckdb

    from equipoise.evaluators import store

    insert(con, PredictionRow, [_pred("x")])
    monkeypatch.setattr(store, "_SCORE_KEY", ("run_id", "item_id", "no_such_column"))
    table = pa.Table.from_pylist([_score("x", "A", -0.3).model_dump()])
    with pytest.raises(duckdb.BinderException, match="no_such_column"):
        insert_table(con, "option_scores", table)
    monkeypatch.undo()
    assert insert_table(con, "option_scores", table) == 1
