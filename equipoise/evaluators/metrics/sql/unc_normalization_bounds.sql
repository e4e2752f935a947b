-- The bounds unc_normalized scales each uncertainty score by, per group and score: n_holdout = the
-- held-out items ({in_holdout}: md5 split key below holdout_fraction) where the score is defined,
-- lower = their minimum, upper = their upper_quantile continuous quantile (numpy's 'linear'
-- method); NULL bounds when n_holdout is 0. The same aggregates ({bound_aggregates}: per score
-- n__x, lo__x, hi__x) as unc_normalized's, over the wide per-item rows; only the few group rows are
-- turned long. HAVING drops the one empty row an ungrouped aggregate returns on an empty store.
WITH sc AS (
{scores_sql}
),
wide AS (
    SELECT {strata} run_id, {in_holdout} AS in_holdout, {score_casts}
    FROM sc
),
g AS (
    SELECT {by} {bound_aggregates}
    FROM wide
    GROUP BY ALL
    HAVING count(*) > 0
)
SELECT {by} score, n_holdout, lower, upper
FROM g
UNPIVOT INCLUDE NULLS ((n_holdout, lower, upper) FOR score IN ({unpivot_in}))
ORDER BY ALL
