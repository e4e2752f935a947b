"""Metric results as columns of numpy arrays, so that a metrics pass never imports pandas.

Why: a metrics pass over a store's fact tables is capped in memory (``registry.cap_pass_memory``:
its peak RSS stays below the store file's size), and what the process holds outside DuckDB is
taken from that cap. Importing pandas 3 (which imports pyarrow on its own) after duckdb and numpy
took such a process from 46 to 114 MiB (benchmarks/RESULTS.md, stop 31), a third of the cap over
the 1M-prediction benchmark store. The metrics that do Python work on a query's result (an exact
test, a bootstrap, a fit) therefore fetch that result as numpy arrays (DuckDB's ``fetchnumpy``),
work on the arrays, and hand the result back to DuckDB to write (``write``: a Python dict of
arrays is a table DuckDB scans in place, no pyarrow or pandas involved). ``to_frame`` turns a
result into the pandas frame that ``registry.compute`` promises its callers, importing pandas only
then.

One convention for NULL, so that the arrays say what DuckDB said: ``fetch`` returns a float column
with NaN for NULL (DuckDB writes a NaN it is given back as NULL, as pandas' Parquet writer did), a
text or list column as an object array with None, and an integer or boolean column that has NULLs
as a numpy masked array (masked = NULL; DuckDB reads the mask). ``values`` gives any column as
Python values with None for NULL, for the few loops over a small result's rows (one test per group).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Columns = dict[str, np.ndarray]  # column name -> one array per column, all of one length

_names = itertools.count()  # registered tables of this process: one name each, never reused


def _plain(col: np.ndarray) -> np.ndarray:
    """A fetched column in this module's NULL convention (module docstring)."""
    if not isinstance(col, np.ma.MaskedArray):
        return col
    if not np.ma.is_masked(col):
        return np.asarray(col.data)
    if col.dtype.kind == "f":
        return col.filled(np.nan)
    if col.dtype.kind == "O":
        out = np.asarray(col.data, dtype=object).copy()
        out[np.ma.getmaskarray(col)] = None
        return out
    return col


def fetch(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> Columns:
    """The rows of ``sql`` (with bound ``params``) as columns, in the query's column order."""
    result = con.execute(sql, params) if params is not None else con.execute(sql)
    return {name: _plain(col) for name, col in result.fetchnumpy().items()}


def n_rows(cols: Columns) -> int:
    """The number of rows of ``cols`` (0 for a table without columns)."""
    return len(next(iter(cols.values()))) if cols else 0


def take(cols: Columns, rows: np.ndarray | slice) -> Columns:
    """The rows ``rows`` (indices, a boolean mask or a slice) of every column."""
    return {name: col[rows] for name, col in cols.items()}


def values(col: np.ndarray) -> list[Any]:
    """A column as Python values, None for NULL (a masked entry, a None or a float NaN)."""
    out = col.tolist()  # a masked array's masked entries become None
    if col.dtype.kind == "f":
        return [None if v != v else v for v in out]
    return out


def where_valid(mask: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The booleans ``mask`` with NULL where ``valid`` is False (a masked array)."""
    return np.ma.masked_array(np.asarray(mask, dtype=bool), mask=~np.asarray(valid, dtype=bool))


def constant(value: object, n: int) -> np.ndarray:
    """A column of ``n`` copies of ``value`` (a parameter echoed on every row)."""
    if isinstance(value, str):
        return np.full(n, value, dtype=object)
    return np.full(n, value)


def _typed(name: str, cols: Columns) -> str:
    """SELECT of the registered ``cols``: a text column without a single value (an empty result, or
    NULL throughout), which DuckDB can only type as NULL, is cast to VARCHAR, the type its values
    would have had (the other columns are typed by their numpy dtype)."""
    untyped = [
        k
        for k, v in cols.items()
        if v.dtype == object and all(x is None for x in np.asarray(v, dtype=object))
    ]
    if not untyped:
        return f"SELECT * FROM {name}"
    cast = ", ".join(f'CAST("{k}" AS VARCHAR) AS "{k}"' for k in untyped)
    return f"SELECT * REPLACE ({cast}) FROM {name}"


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, cols: Columns) -> Iterator[str]:
    """``cols`` registered on ``con`` as a table under a fresh name (yielded), for the queries of the
    ``with`` block to read; unregistered when it ends."""
    name = f"_equipoise_result_{next(_names)}"
    # DuckDB 2.0 refuses to register anything while an earlier execute()'s result is partly unread
    # (a fetchone() of a one-row setting leaves it so); complete() runs such a result to its end
    # without reading it, and does nothing when there is none
    con.complete()
    con.register(name, dict(cols))
    try:
        yield name
    finally:
        con.unregister(name)


def write(con: duckdb.DuckDBPyConnection, cols: Columns, path: Path, fmt: str) -> int:
    """Write ``cols`` to ``path`` with DuckDB's ``COPY ... (fmt)``; returns the row count."""
    from equipoise.evaluators.store import sql_literal  # a leaf module: no cycle, no pandas

    if not cols:
        raise ValueError(f"{path}: a result without columns cannot be written")
    with registered(con, cols) as name:
        con.execute(f"COPY ({_typed(name, cols)}) TO {sql_literal(str(path))} ({fmt})")
    return n_rows(cols)


def to_frame(con: duckdb.DuckDBPyConnection, cols: Columns) -> pd.DataFrame:
    """``cols`` as a pandas frame, read back through DuckDB so that every column gets the dtype a
    query's ``.df()`` gives its type (nullable integers and booleans, strings), as the frames of
    the metrics that are one query do."""
    if not cols:
        import pandas as pd

        return pd.DataFrame()
    with registered(con, cols) as name:
        return con.execute(_typed(name, cols)).df()
