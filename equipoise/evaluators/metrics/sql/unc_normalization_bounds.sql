-- The bounds unc_normalized scales each uncertainty score by, per group and score: n_holdout = the
-- held-out items ({in_holdout}: md5 split key below holdout_fraction) where the score is defined,
-- lower = their minimum, upper = their upper_quantile continuous quantile (numpy's 'linear'
-- method); NULL bounds when n_holdout is 0. g is one wide row per group (_n_rows = its
-- items; per score n__x, lo__x, hi__x: the same uncertainty._bounds_select as unc_normalized's, over the
-- held-out rows), computed here or read from the connection's cache of it (see
-- uncertainty._bounds_cache); only the few group rows are turned long. _n_rows > 0 drops the one
-- empty row an ungrouped aggregate returns on an empty store.
WITH g AS (
{bounds}
)
SELECT {by} score, n_holdout, lower, upper
FROM (SELECT * EXCLUDE (_n_rows) FROM g WHERE _n_rows > 0)
UNPIVOT INCLUDE NULLS ((n_holdout, lower, upper) FOR score IN ({unpivot_in}))
ORDER BY ALL
