-- Test-split AUROC of each combiner per group: the Mann-Whitney statistic with ties counted one
-- half (the rank-sum with average ranks; scikit-learn's roc_auc_score), positives = incorrect
-- answers (a good uncertainty score ranks them higher). NULL when the group's test rows hold only
-- one class or the combiner could not be fitted (NaN predictions are left out).
-- _unc_combiner_preds holds the test rows: the group number _gid, the label and one column per
-- combiner ({combiner_list}). As in unc_auroc.sql, the rank sum over one window sort per integer
-- (group, combiner) key: 2U = sum over positives of (first rank + last rank) - n_pos (n_pos + 1),
-- the last rank being cume_dist() times the partition size, rounded (exact: see unc_auroc.sql); an
-- exact integer, divided once.
WITH long AS (
    SELECT _gid * {n_combiners} + _k AS _part, incorrect, _u
    FROM (SELECT _gid, incorrect, unnest([{combiner_list}]) AS _u, unnest(range({n_combiners})) AS _k
          FROM _unc_combiner_preds)
    WHERE _u IS NOT NULL AND NOT isnan(_u)
),
ranked AS (
    SELECT _part, incorrect,
           rank() OVER w                                                        AS _first,
           round(cume_dist() OVER w * count(*) OVER (PARTITION BY _part))::BIGINT AS _last
    FROM long
    WINDOW w AS (PARTITION BY _part ORDER BY _u)
),
g AS (
    SELECT _part, count(*) FILTER (WHERE incorrect) AS n_pos, count(*) AS n,
           sum(_first + _last) FILTER (WHERE incorrect) - n_pos * (n_pos + 1) AS _twice_u
    FROM ranked
    GROUP BY _part
),
a AS (
    SELECT _part // {n_combiners} AS _gid, _part % {n_combiners} AS _k,
           CASE WHEN n_pos > 0 AND n > n_pos
                THEN _twice_u::DOUBLE / (2 * n_pos * (n - n_pos))::DOUBLE END AS auroc
    FROM g
)
SELECT _gid, {auroc_columns}
FROM a
GROUP BY _gid
ORDER BY _gid
