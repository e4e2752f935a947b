-- Mean of every per-item uncertainty score per group; n_items counts the group's items and
-- n_scored those where the score is defined (a NULL score is counted, never averaged in).
-- One pass of plain aggregates over the wide per-item rows ({aggregates}: count(x) AS "n__x",
-- the mean AS "m__x" per score), then the few group rows are turned long: unpivoting the
-- items first would aggregate (number of scores) times as many rows. HAVING drops the one empty
-- row an ungrouped aggregate returns on an empty store. The means are fixed-point integer sums
-- (scale: one power of two per score over all rows; see uncertainty._exact_mean), so
-- they are the same bits whatever DuckDB's threads. The scales are the CTE scale, CROSS JOINed
-- to the rows ({{scale_cte}}, {{scale_join}}), or, where the scores are a table, literals in
-- {{aggregates}} read by a query of their own (uncertainty._literal_means), with neither.
-- sc ({{source_mode}}) is NOT MATERIALIZED when the scores are a table (the fact or the
-- connection's cache), so that g scans the columns it reads rather than a copy of every row being
-- made first (about 12% of this metric's CPU at 1M predictions); otherwise DuckDB's choice, as sc
-- is then the whole unc_scores query (read by scale and by g).
WITH sc AS {source_mode} (
{scores_sql}
){scale_cte},
g AS (
    SELECT {by} count(*) AS n_items, {aggregates}
    FROM sc{scale_join}
    GROUP BY ALL
    HAVING count(*) > 0
)
SELECT {by} score, n_items, n_scored, mean
FROM g
UNPIVOT INCLUDE NULLS ((n_scored, mean) FOR score IN ({unpivot_in}))
ORDER BY ALL
