-- Tie blocks of cal_samples per group, the shared first step of auroc, aurc / prr and
-- risk_coverage: one row per group and distinct (cal_status, confidence), n_b rows of which e_b are
-- errors (NOT correct). Used rows form one block per distinct confidence; the excluded rows of a
-- group form one block per cal_status with NULL confidence. For a used block, k_before / e_before
-- are the used rows / errors with a strictly higher confidence in its group (the blocks sorted by
-- confidence, highest first, excluded blocks last and never counted), n_used is the group's
-- used rows and n_group all its rows; on excluded blocks k_before / e_before are meaningless and
-- never read.
-- How: one window sort of the group's rows by a single DOUBLE key, _key = the confidence of a used
-- row (in [0, 1]) and -1 (no_confidence) or -2 (unparsed) for an excluded one, so the excluded rows
-- sort last and each exclusion reason is its own run of peers. A block is a run of peers: n_b and
-- e_b are sums over the peer frame, k_before = rank() - 1 (rows strictly above), e_before = the
-- errors up to and including the peers (the default RANGE frame) minus the block's own, and
-- QUALIFY keeps one row per block (the one whose row_number is its rank; every value above is the
-- same on all rows of a block, so which row is kept does not matter). cal_status and confidence
-- are read back from _key, so the sort carries no string but the grouping's.
-- Why: the blocks used to be a hash aggregate of the rows (about as many blocks as rows with
-- continuous confidences) followed by a window sort of the blocks, two passes over ~1M rows where
-- this is one; with no VARCHAR sort key (cal_status) and no partition-only window (n_used and
-- n_group are counts over the whole-partition frame of the same sort). Measured at 1M predictions:
-- about 16% less CPU for this step (see the commit message). Names must not reuse a STRATA column
-- (`k` is one), hence _key and _err.
CREATE OR REPLACE TEMP VIEW {view} AS
WITH s AS (
    SELECT {by}
           coalesce(NOT correct, false)::INT                                      AS _err,
           coalesce(confidence,
                    CASE WHEN cal_status = 'unparsed' THEN -2.0 ELSE -1.0 END::DOUBLE) AS _key
    FROM cal_samples
)
SELECT {by}
       CASE WHEN _key >= 0 THEN 'used' WHEN _key = -2 THEN 'unparsed' ELSE 'no_confidence' END AS cal_status,
       CASE WHEN _key >= 0 THEN _key END                                AS confidence,
       count(*) OVER wp                                                  AS n_b,
       (sum(_err) OVER wp)::BIGINT                                       AS e_b,
       (rank() OVER w - 1)::BIGINT                                       AS k_before,
       (sum(_err) OVER w - sum(_err) OVER wp)::BIGINT                    AS e_before,
       count(CASE WHEN _key >= 0 THEN 1 END) OVER wa                     AS n_used,
       count(*) OVER wa                                                  AS n_group
FROM s
WINDOW w AS (PARTITION BY {by_list} ORDER BY _key DESC),
       wp AS (w RANGE BETWEEN CURRENT ROW AND CURRENT ROW),
       wa AS (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
QUALIFY row_number() OVER w = rank() OVER w
