-- Tie blocks of cal_samples per group, the shared first step of auroc, aurc / prr and
-- risk_coverage, as one partitioned window: over live views, and where a table scan need not keep
-- insertion order (calibration.prepare_blocks; elsewhere cal_blocks_sorted.sql gives the same rows
-- cheaper). One row per group and distinct (cal_status, confidence), n_b rows of which e_b are
-- errors (NOT correct). Used rows form one block per distinct confidence; the excluded rows of a
-- group form one block per cal_status with NULL confidence. For a used block, k_before / e_before
-- are the used rows / errors with a strictly higher confidence in its group (the blocks sorted by
-- confidence, highest first, excluded blocks last and never counted), n_used is the group's
-- used rows and n_group all its rows; on excluded blocks k_before / e_before are meaningless and
-- never read. A block's exclusion state is two booleans, `used` (cal_status 'used') and
-- `unparsed` (cal_status 'unparsed'; neither: 'no_confidence'), not the cal_status string: the
-- metrics only test it, and a string per block cost more to store and compare at 931k blocks.
-- How: one window sort of the group's rows by a single DOUBLE key, _key = the confidence of a used
-- row (in [0, 1]) and -1 (no_confidence) or -2 (unparsed) for an excluded one, so the excluded rows
-- sort last and each exclusion reason is its own run of equal keys. Over that sort every row gets
-- its position _rn (row_number) and the running count of errors up to and including it, _cum (a
-- ROWS frame: a plain running sum), and whether it starts (_first: lag differs) or ends (_last:
-- lead differs) its block. A row that does both is a block of one: n_b = 1, e_b = its error,
-- k_before = _rn - 1 and e_before = _cum - _err. The rows of the few larger blocks (ties, and the
-- excluded rows) are aggregated per key: _rn and _cum only grow along the sort, so the block's
-- first row holds the smallest _rn and _cum - _err (the rows and errors above it) and its last
-- row the largest _cum. used, unparsed and confidence are read back from _key.
-- Why: peer frames (count / sum over RANGE CURRENT ROW, a RANGE running sum, rank()) find each
-- row's peers, and a QUALIFY on row_number() = rank() kept one row per block; with nearly every
-- confidence distinct (931k blocks of 950k rows at 1M predictions) that was work for the few
-- ties. This form was about 10% less CPU for this step at 1M predictions (0.70 s -> 0.63 s,
-- measured back to back), with the same rows.
-- The window partitions by _gid, not by the strata: the group's number among the groups in the
-- order of their strata (gk: one row per group, matched to the rows with IS NOT DISTINCT FROM so
-- that a NULL stratum is a group too), and the strata are joined back onto the blocks at the end,
-- so the sort carries no string at all: partitioning by a small integer instead of the model name
-- took about 0.15 s less CPU in the window at 1M predictions, the two joins about 0.05 s more.
-- gk also counts each group's rows (n_group) and used rows (n_used) in the same small aggregate,
-- which costs about what a DISTINCT of the strata did, so the window computes no whole-partition
-- counts (two fewer window functions). The whole step: 0.61 s -> 0.48 s CPU at 1M predictions,
-- measured back to back, same rows.
-- _gid is also a column of the result: ordering by it is ordering by the strata (same defaults,
-- NULLS LAST), which risk_coverage does with an integer sort key instead of strings.
-- Names must not reuse a STRATA column (`k` is one), hence _key, _err and _gid.
CREATE OR REPLACE TEMP VIEW {view} AS
WITH s AS (
    SELECT {by}
           coalesce(NOT correct, false)::INT                                      AS _err,
           coalesce(confidence, CASE WHEN unparsed THEN -2.0 ELSE -1.0 END::DOUBLE) AS _key
    FROM cal_samples
),
gk AS (
    SELECT *, (row_number() OVER (ORDER BY {by_list}))::INT AS _gid
    FROM (SELECT {by} count(*) FILTER (WHERE used) AS n_used, count(*) AS n_group
          FROM cal_samples
          {group_by})
),
sg AS (
    SELECT gk._gid, s._key, s._err
    FROM s JOIN gk ON {by_match}
),
r AS (
    SELECT _gid, _key, _err,
           row_number() OVER w                               AS _rn,
           sum(_err) OVER (w ROWS UNBOUNDED PRECEDING)       AS _cum,
           lag(_key) OVER w IS DISTINCT FROM _key            AS _first,
           lead(_key) OVER w IS DISTINCT FROM _key           AS _last
    FROM sg
    WINDOW w AS (PARTITION BY _gid ORDER BY _key DESC)
),
blocks AS (
    SELECT _gid, _key,
           1::BIGINT                   AS n_b,
           _err::BIGINT                AS e_b,
           (_rn - 1)::BIGINT           AS k_before,
           (_cum - _err)::BIGINT       AS e_before
    FROM r
    WHERE _first AND _last
    UNION ALL
    SELECT _gid, _key,
           (max(_rn) - min(_rn) + 1)::BIGINT,
           (max(_cum) - min(_cum - _err))::BIGINT,
           (min(_rn) - 1)::BIGINT,
           min(_cum - _err)::BIGINT
    FROM r
    WHERE NOT (_first AND _last)
    GROUP BY ALL
)
{blocks_out}
