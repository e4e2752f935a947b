-- AUROC of the confidence for separating correct (positive) from incorrect predictions, by the
-- rank-sum (Mann-Whitney) statistic: rank the used rows of a group by confidence (ties get their
-- average rank), then AUROC = (R_correct - n_c (n_c + 1) / 2) / (n_c n_i), where R_correct is the
-- sum of the correct rows' ranks. Equals P(conf_correct > conf_incorrect) + P(equal) / 2. NULL when
-- the group's used rows hold only one class (or none).
WITH r AS (
    SELECT *,
           CASE WHEN used THEN rank() OVER w + (count(*) OVER wt - 1) / 2.0 END AS avg_rank
    FROM cal_samples
    WINDOW w AS (PARTITION BY {by} used ORDER BY confidence),
           wt AS (PARTITION BY {by} used, confidence)
),
g AS (
    SELECT {by}
           count(*)                                               AS n_total,
           count(*) FILTER (WHERE used)                           AS n,
           count(*) FILTER (WHERE NOT used)                       AS n_excluded,
           count(*) FILTER (WHERE cal_status = 'unparsed')        AS n_unparsed,
           count(*) FILTER (WHERE cal_status = 'no_confidence')   AS n_no_confidence,
           count(*) FILTER (WHERE used AND correct)               AS n_correct,
           count(*) FILTER (WHERE used AND NOT correct)           AS n_incorrect,
           sum(avg_rank) FILTER (WHERE used AND correct)          AS rank_sum_correct
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
