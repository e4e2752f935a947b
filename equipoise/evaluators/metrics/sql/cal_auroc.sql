-- AUROC of the confidence for separating correct (positive) from incorrect predictions, by the
-- rank-sum (Mann-Whitney) statistic: rank the used rows of a group by confidence (ties get their
-- average rank), then AUROC = (R_correct - n_c (n_c + 1) / 2) / (n_c n_i), where R_correct is the
-- sum of the correct rows' ranks. Equals P(conf_correct > conf_incorrect) + P(equal) / 2. NULL when
-- the group's used rows hold only one class (or none).
-- Computed per tie block (cal_blocks, see cal_blocks.sql): the used rows of a distinct confidence
-- share the average rank (rows below) + (n_b + 1) / 2, rows below = n_used - k_before - n_b, so
-- R_correct = sum over blocks of c_b times it (exact in doubles: half-integers far below 2^53).
WITH r AS (
    SELECT *,
           n_b - e_b                                                            AS c_b,
           CASE WHEN used THEN n_used - k_before - n_b + 1 + (n_b - 1) / 2.0 END AS avg_rank
    FROM cal_blocks
),
g AS (
    SELECT {by}
           {block_counts},
           coalesce(sum(c_b) FILTER (WHERE used), 0)::BIGINT                 AS n_correct,
           coalesce(sum(n_b - c_b) FILTER (WHERE used), 0)::BIGINT           AS n_incorrect,
           sum(c_b * avg_rank) FILTER (WHERE used)                           AS rank_sum_correct
    FROM r
    {group_by}
)
SELECT {by}
       n_total, n, n_excluded, n_unparsed, n_no_confidence, n_correct, n_incorrect,
       CASE WHEN n_correct > 0 AND n_incorrect > 0
            THEN (rank_sum_correct - n_correct * (n_correct + 1) / 2.0)
                 / (n_correct::DOUBLE * n_incorrect::DOUBLE) END AS auroc
FROM g
ORDER BY ALL
