-- Test-split AUROC of each combiner per group: the Mann-Whitney statistic with average ranks for
-- ties, positives = incorrect answers (a good uncertainty score ranks them higher). NULL when the
-- group's test rows hold only one class or the combiner could not be fitted.
WITH r AS (
    SELECT *,
           rank() OVER (PARTITION BY {part} combiner ORDER BY u)
             + (count(*) OVER (PARTITION BY {part} combiner, u) - 1) / 2.0 AS avg_rank
    FROM _unc_combiner_preds
    WHERE NOT is_train AND u IS NOT NULL AND NOT isnan(u)
),
g AS (
    SELECT {by} combiner, count(*) AS n, count(*) FILTER (WHERE incorrect) AS n_pos,
           sum(CASE WHEN incorrect THEN avg_rank END) AS rank_sum
    FROM r
    GROUP BY {by} combiner
),
a AS (
    SELECT {by} combiner, n, n_pos,
           CASE WHEN n_pos > 0 AND n > n_pos
                THEN (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * (n - n_pos)) END AS auroc
    FROM g
)
SELECT {by}
       max(auroc) FILTER (WHERE combiner = 'linear_sum')     AS auroc_linear_sum,
       max(auroc) FILTER (WHERE combiner = 'logistic')       AS auroc_logistic,
       max(auroc) FILTER (WHERE combiner = 'ridge')          AS auroc_ridge
FROM a
{group_by}
ORDER BY ALL
