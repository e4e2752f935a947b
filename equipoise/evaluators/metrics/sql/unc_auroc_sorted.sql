-- unc_auroc's continuous scores ranked by one plain sort read through window functions with an
-- empty OVER (a streaming scan in the sorted order): the CTEs unc_auroc.sql splices in, ending in
-- g_continuous, where the connection keeps insertion order (uncertainty._auroc_sql; otherwise
-- unc_auroc_windowed.sql, the same integers from a window partitioned by _part). Input: one row
-- per (item, continuous score) with _part, _incorrect and _v (undefined = NaN),
-- uncertainty._long_scores.
-- ranked: the rows sorted by (_part, _v), each with _rn, its place in that order over all
-- partitions, and _tied, whether a neighbour holds the same value. A partition's rows are
-- contiguous, so a row's rank in its partition is _rn - _off, _off being the rows of the
-- partitions sorted before it (the partition's smallest _rn less one). A neighbour of the same
-- value across a partition boundary only makes a value of one row look tied, and a tied value of
-- one row gets the rank an untied row gets, so _v alone is compared.
-- runs (MATERIALIZED: a few rows that starts and g_continuous both read, so the sort runs once):
-- one aggregate, keyed by (_part, the value where the row is tied, else NULL): per partition
-- one row for all its untied rows (their count, positives and the sum of the positives' _rn) and
-- one per tied value (its count, positives and smallest _rn). Then, with ties counted one half,
-- 2U = sum over positives of (first rank + last rank) - n_pos (n_pos + 1): 2 (_rn - _off) for an
-- untied positive, (2 first + count - 1) for each positive of a tied value. Undefined (NaN) rows
-- sort last, so they shift no defined row's rank, and are left out of every sum by NOT isnan.
-- What it relies on: that window functions with an empty OVER see the rows in the order of the
-- ORDER BY below them. DuckDB runs them as one streaming window over the sorted rows, not in
-- parallel (row_number and lag / lead span the rows). That is how DuckDB works (its documentation
-- promises that an empty OVER keeps the order of its input, not that a subquery's ORDER BY is
-- that order), so tests/test_metrics_uncertainty.py compares this file's numbers with the
-- windowed ones bit for bit, with one thread and with four and parallelism forced, where a
-- reordered read would show.
-- Why: the window partitioned by _part cost more than its own sort (row_number, lag and lead over
-- the partitions), and its rows fed two aggregates (the counts per partition, the tied values).
-- At 1M predictions with one DuckDB thread (the whole query, min of 5 runs in one process, loaded
-- machine): 0.675-0.696 -> 0.649-0.658 CPU s, the same integers. Kept in a plain sort on a DOUBLE
-- key: a 4-byte key sorts in about half the time, but a monotone map of the scores to 32 bits
-- (FLOAT; a linear or fourth-root scale to UINTEGER) put so many distinct values on one key
-- (pro: 466k values on 116k-285k keys) that ranking the collisions exactly cost more than it saved.
ranked AS (
    SELECT _part, _incorrect, _v,
           row_number() OVER ()                                           AS _rn,
           coalesce(lag(_v) OVER () = _v OR lead(_v) OVER () = _v, false) AS _tied
    FROM (SELECT * FROM ({long_continuous}) ORDER BY _part, _v)
),
runs AS MATERIALIZED (
    SELECT _part, CASE WHEN _tied THEN _v END AS _tv,
           count(*) AS _c, sum(_d) AS _d, sum(_p) AS _p, sum(_p * _rn) AS _s, min(_rn) AS _m
    FROM (SELECT _part, _v, _tied, _rn, (NOT isnan(_v))::INT AS _d,
                 (_incorrect AND NOT isnan(_v))::INT AS _p
          FROM ranked)
    GROUP BY ALL
),
starts AS (
    SELECT _part, min(_m) - 1 AS _off
    FROM runs
    GROUP BY _part
),
g_continuous AS (
    SELECT _part,
           sum(_c)::BIGINT AS n_items,
           sum(_d)::BIGINT AS n,
           sum(_p)::BIGINT AS n_incorrect,
           CASE WHEN n_incorrect > 0
                THEN sum(CASE WHEN _tv IS NULL THEN 2 * (_s - _p * _off)
                              WHEN NOT isnan(_tv) THEN _p * (2 * (_m - _off) + _c - 1)
                              ELSE 0 END)
                     - n_incorrect * (n_incorrect + 1)
           END AS _twice_u
    FROM runs
    JOIN starts USING (_part)
    GROUP BY _part
)
