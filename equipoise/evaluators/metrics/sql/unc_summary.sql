-- Mean of every per-item uncertainty score per group; n_items counts the group's items and
-- n_scored those where the score is defined (a NULL score is counted, never averaged in).
WITH sc AS (
{scores_sql}
),
long AS (
    FROM (SELECT {by} {score_casts} FROM sc)
    UNPIVOT INCLUDE NULLS (value FOR score IN ({score_list}))
)
SELECT {by} score, count(*) AS n_items, count(value) AS n_scored, avg(value) AS mean
FROM long
GROUP BY {by} score
ORDER BY ALL
