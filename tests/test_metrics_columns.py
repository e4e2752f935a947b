"""Metric results as numpy columns (equipoise/evaluators/metrics/columns.py): the NULL convention of
``fetch``, the files ``write`` makes, and the frames ``to_frame`` gives, each checked against what
DuckDB's own ``.df()`` and pandas make of the same rows."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import columns
from equipoise.evaluators.metrics.uncertainty import _records

ROWS = """SELECT * FROM (VALUES
    (1, 'a', 1.5, true, [1.0, 2.0], 7::BIGINT),
    (NULL, NULL, NULL, NULL, NULL, 8::BIGINT),
    (3, 'c', 'nan'::DOUBLE, false, [], 9::BIGINT)
) t(i, s, f, b, l, n)"""


@pytest.fixture()
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    yield c
    c.close()


def test_fetch_gives_nan_none_or_a_mask_for_null(con: duckdb.DuckDBPyConnection) -> None:
    got = columns.fetch(con, ROWS)
    assert list(got) == ["i", "s", "f", "b", "l", "n"] and columns.n_rows(got) == 3
    assert np.isnan(got["f"][1]) and got["f"].dtype == np.float64
    assert not isinstance(got["f"], np.ma.MaskedArray)
    assert got["s"].tolist() == ["a", None, "c"] and not isinstance(got["s"], np.ma.MaskedArray)
    assert got["l"][1] is None and list(got["l"][0]) == [1.0, 2.0] and len(got["l"][2]) == 0
    assert isinstance(got["i"], np.ma.MaskedArray) and got["i"].mask.tolist() == [False, True, False]
    assert isinstance(got["b"], np.ma.MaskedArray) and columns.values(got["b"]) == [True, None, False]
    # a column without NULLs is a plain array, whatever its type
    assert type(got["n"]) is np.ndarray and got["n"].tolist() == [7, 8, 9]
    # values: None for every kind of NULL (a float NaN included)
    assert columns.values(got["f"])[1:] == [None, None] and columns.values(got["i"]) == [1, None, 3]


def test_write_round_trips_through_parquet_and_csv(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    got = columns.fetch(con, ROWS)
    path = tmp_path / "r.parquet"
    assert columns.write(con, got, path, "FORMAT parquet") == 3
    want = con.execute(ROWS).fetchall()
    back = con.execute(f"SELECT * FROM read_parquet('{path}')").fetchall()
    # the one difference: the NaN of row 3 was written as NULL (what pandas' writer did too)
    assert back[:2] == want[:2] and back[2][2] is None and back[2][:2] == want[2][:2]
    types = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
    assert [t[1] for t in types] == ["INTEGER", "VARCHAR", "DOUBLE", "BOOLEAN", "DOUBLE[]", "BIGINT"]
    csv = tmp_path / "r.csv"
    assert columns.write(con, columns.take(got, [0, 2]), csv, "FORMAT csv, HEADER true") == 2
    assert csv.read_text().splitlines()[0] == "i,s,f,b,l,n"
    # a text column with no value at all (an empty result) is written as text, not DuckDB's NULL type
    empty = {"method": np.array([], dtype=object), "p": np.array([], dtype=float)}
    assert columns.write(con, empty, tmp_path / "e.parquet", "FORMAT parquet") == 0
    types = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{tmp_path / 'e.parquet'}')").fetchall()
    assert [t[1] for t in types] == ["VARCHAR", "DOUBLE"]
    assert columns.to_frame(con, {"s": np.array([None, None], dtype=object)})["s"].isna().all()
    with pytest.raises(ValueError, match="without columns"):
        columns.write(con, {}, tmp_path / "none.parquet", "FORMAT parquet")


def test_write_after_a_partly_read_result(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    """DuckDB 2.0 refuses to register a table while an earlier result is partly unread (a fetchone
    of a setting, as a metric does before its write): ``write`` finishes that result first."""
    con.execute("SELECT * FROM range(10)").fetchone()
    with pytest.raises(duckdb.Error, match="unfinished result"):
        con.register("x", {"a": np.arange(2)})
    con.execute("SELECT * FROM range(10)").fetchone()
    assert columns.write(con, {"a": np.arange(2)}, tmp_path / "a.parquet", "FORMAT parquet") == 2


def test_to_frame_types_like_a_query_frame(con: duckdb.DuckDBPyConnection) -> None:
    want = con.execute(ROWS).df()
    got = columns.to_frame(con, columns.fetch(con, ROWS))
    assert got.dtypes.to_dict() == want.dtypes.to_dict()
    pd.testing.assert_frame_equal(got.drop(columns="l"), want.drop(columns="l"))
    assert columns.to_frame(con, {}).empty


def test_where_valid_and_constant() -> None:
    b = columns.where_valid(np.array([True, False, True]), np.array([True, True, False]))
    assert columns.values(b) == [True, False, None]
    assert columns.constant("x", 2).tolist() == ["x", "x"] and columns.constant("x", 2).dtype == object
    assert columns.constant(0.05, 3).dtype == np.float64 and columns.constant(7, 1).dtype.kind == "i"


@pytest.mark.parametrize(
    "rows",
    [
        [{"model": "a", "n": 3, "w": 0.5, "ok": True}, {"model": "b", "n": 4, "ok": False}],
        [{"model": None, "k": 3}, {"model": "b", "k": None, "extra": 1.5}],
        [{"a": 1}, {"a": 2.5}, {"b": "x"}],
    ],
)
def test_records_type_columns_as_a_pandas_frame_of_them(
    con: duckdb.DuckDBPyConnection, rows: list[dict[str, object]]
) -> None:
    """unc_combiners' fit summaries (one dict per group) become columns as pandas types them, which
    is how that metric wrote them before it stopped using pandas."""
    got = pd.DataFrame(_records(rows))
    want = pd.DataFrame(rows)
    assert list(got.columns) == list(want.columns)
    for col in want.columns:
        a, b = got[col], want[col]
        assert (a.isna() == b.isna()).all(), col
        assert [x for x in a[a.notna()]] == [x for x in b[b.notna()]], col
        if b.dtype != object:  # pandas keeps None in an all-object column; numbers and flags keep their kind
            assert a.dtype.kind == b.dtype.kind, col
