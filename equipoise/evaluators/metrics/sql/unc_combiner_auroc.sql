-- Test-split AUROC of each combiner per group: the Mann-Whitney statistic with ties counted one
-- half (the rank-sum with average ranks; scikit-learn's roc_auc_score), positives = incorrect
-- answers (a good uncertainty score ranks them higher). NULL when the group's test rows hold only
-- one class or the combiner could not be fitted (NaN predictions are left out).
-- _unc_combiner_preds holds the test rows: the group number _gid, the label and one column per
-- combiner ({combiner_list}), turned long with one integer key per (group, combiner), _part =
-- _gid * {n_combiners} + the combiner's position. The statistic is counted per distinct value by
-- the CTEs of unc_value_counts.sql, which unc_auroc.sql uses for its discrete scores: the combiners
-- read a few integer features, so their predictions repeat a lot and the rows collapse (measured:
-- ranking every row took about 20% more CPU at 1M predictions).
WITH {value_counts},
a AS (
    SELECT _part // {n_combiners} AS _gid, _part % {n_combiners} AS _k,
           CASE WHEN n_incorrect > 0 AND n > n_incorrect
                THEN _twice_u::DOUBLE / (2 * n_incorrect * (n - n_incorrect))::DOUBLE END AS auroc
    FROM g
)
SELECT _gid, {auroc_columns}
FROM a
GROUP BY _gid
ORDER BY _gid
