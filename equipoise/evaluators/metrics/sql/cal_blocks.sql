-- Tie blocks of cal_samples per group, the shared first step of auroc, aurc / prr and
-- risk_coverage: one row per group and distinct (cal_status, confidence), n_b rows of which e_b are
-- errors (NOT correct). Used rows form one block per distinct confidence; the excluded rows of a
-- group form one block per cal_status with NULL confidence. For a used block, k_before / e_before
-- are the used rows / errors with a strictly higher confidence in its group (the blocks sorted by
-- confidence, highest first, excluded blocks last and never counted), n_used is the group's
-- used rows and n_group all its rows; on excluded blocks they are meaningless and never read.
-- Why blocks: the metrics need a running count in confidence order, and sorting one row per
-- distinct confidence is cheaper than ranking every row (four metrics share this one sort when
-- calibration.py caches it). Names must not reuse a STRATA column (`k` is one).
CREATE OR REPLACE TEMP VIEW {view} AS
WITH blocks AS (
    SELECT {by} cal_status, confidence,
           count(*)                              AS n_b,
           count(*) FILTER (WHERE NOT correct)   AS e_b
    FROM cal_samples
    GROUP BY ALL
)
SELECT *,
       (sum(CASE WHEN confidence IS NOT NULL THEN n_b ELSE 0 END) OVER w - n_b)::BIGINT AS k_before,
       (sum(CASE WHEN confidence IS NOT NULL THEN e_b ELSE 0 END) OVER w - e_b)::BIGINT AS e_before,
       (sum(CASE WHEN confidence IS NOT NULL THEN n_b ELSE 0 END) OVER p)::BIGINT       AS n_used,
       (sum(n_b) OVER p)::BIGINT                                                        AS n_group
FROM blocks
WINDOW p AS (PARTITION BY {by_list}),
       w AS (PARTITION BY {by_list} ORDER BY confidence DESC NULLS LAST
             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
