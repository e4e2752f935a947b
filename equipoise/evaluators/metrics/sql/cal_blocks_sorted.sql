-- The tie blocks of cal_blocks.sql (the same rows), computed from one plain sort instead of a
-- window partitioned by group: for a connection with fixed base relations, where calibration.py
-- keeps the blocks in TEMP tables (prepare_blocks), and the cal_blocks view reads them through
-- cal_blocks_out.sql. Three statements, each CREATE OR REPLACE and {blocks} last, so a script that
-- failed half way (out of memory) is simply run again:
-- 1. {groups}: one row per group with its strata, its number _gid (the groups in the order of their
--    strata, as in cal_blocks.sql), its used and total rows (n_used, n_group) and the rows and
--    errors of the groups numbered before it (_g0rn, _g0cum).
-- 2. {rows}: every row of cal_samples as (_gid, _key, _err) (as in cal_blocks.sql: _key is the
--    confidence of a used row, -1 for no_confidence and -2 for unparsed; _err = NOT correct),
--    inserted sorted by (_gid, _key DESC).
-- 3. {blocks}: one scan of {rows} through window functions with an empty OVER (row_number, lead)
--    and a ROWS frame with no PARTITION BY or ORDER BY (the running error count). Each row gets
--    its position _rn over all groups, the running count of errors _cum up to and including it,
--    and whether it ends a block (_last: a run of equal (_gid, _key) ends where lead differs). The
--    block ends alone are kept, and a second empty-OVER window over them (lag) gives each block
--    the _rn / _cum of the end of the block before it, i.e. the rows and errors ranked above the
--    block over all groups: the block's n_b and e_b are the differences, and subtracting the
--    group's _g0rn / _g0cum turns the previous end into the group's k_before / e_before (at a
--    group's first block the previous end is the last row of the groups before it, which is
--    exactly _g0rn / _g0cum, so k_before = e_before = 0), the numbers the partitioned window
--    gives. Only (_gid, _key) and the four counts are kept.
-- What it relies on: that these window values follow {rows}' insertion order, and the lag the
-- order of the block ends that the first window passes on. DuckDB runs such a window as one
-- streaming window over the table scan, not in parallel (its running state spans the rows), and
-- with preserve_insertion_order (calibration.py checks it; otherwise it uses cal_blocks.sql) the
-- scan yields the rows as inserted. That is how DuckDB works, not a documented
-- promise for window frames, so tests/test_metrics_calibration.py compares the blocks of both SQL
-- files over several row groups with 4 threads, where a parallel or reordered scan would show.
-- Why: the partitioned window's running sum, lag and lead cost more than its sort; a sort into a
-- narrow table and a streaming scan of it took about a fifth less CPU at 1M predictions (aurc,
-- which fills the blocks, 0.56 -> 0.44 CPU s with one thread, measured back to back), with the
-- same rows, and the cached blocks hold six numbers per block, not the strata strings.
-- The running error count _cum counts the rows with _err = 1 instead of summing _err: the same
-- integers (_err is 0 or 1), but the streaming window sums an INTEGER into a HUGEINT through the
-- generic aggregate path, about 0.05 CPU s at 1M predictions with one thread, where the count
-- costs almost nothing. Taking each block's counts from the previous block end (a lag over the
-- ends) replaced a lag of every row, a union of the blocks of one row with the few larger blocks
-- aggregated per (_gid, _key), and the CTE both read: about 0.02 CPU s less at 1M predictions,
-- and the same rows (compared at 1M, and by the tests above).
CREATE OR REPLACE TEMP TABLE {groups} AS
SELECT *,
       coalesce(sum(n_group) OVER w, 0)::BIGINT    AS _g0rn,
       coalesce(sum(_n_err) OVER w, 0)::BIGINT     AS _g0cum
FROM (
    SELECT *, (row_number() OVER (ORDER BY {by_list}))::INT AS _gid
    FROM (SELECT {by} count(*) FILTER (WHERE used) AS n_used, count(*) AS n_group,
                 count(*) FILTER (WHERE NOT correct) AS _n_err
          FROM cal_samples
          {group_by})
)
WINDOW w AS (ORDER BY _gid ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING);

CREATE OR REPLACE TEMP TABLE {rows} AS
SELECT gk._gid, s._key, s._err
FROM (SELECT {by}
             coalesce(NOT correct, false)::INT                                      AS _err,
             coalesce(confidence, CASE WHEN unparsed THEN -2.0 ELSE -1.0 END::DOUBLE) AS _key
      FROM cal_samples) s
JOIN {groups} gk ON {by_match}
ORDER BY gk._gid, s._key DESC;

CREATE OR REPLACE TEMP TABLE {blocks} AS
WITH r AS (
    SELECT _gid, _key,
           row_number() OVER ()                                                       AS _rn,
           count(*) FILTER (WHERE _err = 1) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS _cum,
           lead(_gid) OVER () IS DISTINCT FROM _gid OR lead(_key) OVER () IS DISTINCT FROM _key AS _last
    FROM {rows}
),
e AS (
    SELECT _gid, _key, _rn, _cum,
           coalesce(lag(_rn) OVER (), 0)   AS _prev_rn,
           coalesce(lag(_cum) OVER (), 0)  AS _prev_cum
    FROM r
    WHERE _last
)
SELECT e._gid, e._key,
       (e._rn - e._prev_rn)::BIGINT        AS n_b,
       (e._cum - e._prev_cum)::BIGINT      AS e_b,
       (e._prev_rn - g._g0rn)::BIGINT      AS k_before,
       (e._prev_cum - g._g0cum)::BIGINT    AS e_before
FROM e JOIN {groups} g USING (_gid);

DROP TABLE IF EXISTS {rows};
