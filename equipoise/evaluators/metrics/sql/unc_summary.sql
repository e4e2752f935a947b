-- Mean of every per-item uncertainty score per group; n_items counts the group's items and
-- n_scored those where the score is defined (a NULL score is counted, never averaged in).
-- One pass of plain aggregates over the wide per-item rows ({aggregates}: count(x) AS "n__x",
-- avg(x::DOUBLE) AS "m__x" per score), then the few group rows are turned long: unpivoting the
-- items first would aggregate (number of scores) times as many rows. HAVING drops the one empty
-- row an ungrouped aggregate returns on an empty store.
WITH sc AS (
{scores_sql}
),
g AS (
    SELECT {by} count(*) AS n_items, {aggregates}
    FROM sc
    GROUP BY ALL
    HAVING count(*) > 0
)
SELECT {by} score, n_items, n_scored, mean
FROM g
UNPIVOT INCLUDE NULLS ((n_scored, mean) FOR score IN ({unpivot_in}))
ORDER BY ALL
