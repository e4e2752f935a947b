"""Edit a store's option scores in tests with SQL written against the long ``option_scores`` table.

From store schema v3 the scores are two list columns of ``predictions`` and ``option_scores`` is a
view of them, which DuckDB does not let a statement change. The tests that craft edge cases (a
top-k cut, an item without scores, a run's scores copied under another run id) keep their SQL as it
reads best, over the long rows: :func:`edit_option_scores` runs it on a TEMP copy of the view and
writes every sample's lists back from that copy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import duckdb

_KEY = ("run_id", "item_id", "sample_index")


def edit_option_scores(
    con: duckdb.DuckDBPyConnection, *statements: str | tuple[str, Sequence[object]]
) -> None:
    """Run ``statements`` (SQL naming ``option_scores``, each may hold several statements; a tuple
    is SQL with its parameters) on a copy of the long scores, then store the copy back: each
    prediction's lists become its rows of the copy, sorted by label, or NULL where it has none. A
    score row whose sample has no prediction is dropped: schema v3 cannot hold one (a prediction
    deleted by the statements takes its scores with it, where the long table kept them as rows
    that no metric read)."""
    con.execute("CREATE OR REPLACE TEMP TABLE _os_edit AS SELECT * FROM main.option_scores")
    for statement in statements:
        sql, params = (statement, None) if isinstance(statement, str) else statement
        edited = re.sub(r"\boption_scores\b", "_os_edit", sql)
        con.execute(edited, list(params)) if params is not None else con.execute(edited)
    on = " AND ".join(f"p.{k} = s.{k}" for k in _KEY)
    con.execute(
        f"""UPDATE main.predictions p SET score_labels = s.score_labels, score_logprobs = s.score_logprobs
            FROM (SELECT {", ".join(_KEY)}, list(label ORDER BY label) AS score_labels,
                         list(logprob ORDER BY label) AS score_logprobs
                  FROM _os_edit GROUP BY ALL) s
            WHERE {on}"""
    )
    con.execute(
        f"""UPDATE main.predictions p SET score_labels = NULL, score_logprobs = NULL
            WHERE p.score_labels IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM _os_edit s WHERE {on})"""
    )
    con.execute("DROP TABLE _os_edit")
