-- AUROC of each uncertainty score for telling the incorrect sample-0 answers of a group from the
-- correct ones (seed 002 4.3, seed 004 3.4): positives = NOT correct (an unparsed or refused answer
-- is not correct, and is counted), score = the uncertainty (higher = less sure). Mann-Whitney with
-- average ranks for ties. Items whose score is undefined (NULL or NaN) are counted in n_undefined
-- and left out of the ranking; NULL AUROC when the defined items hold only one class. Column names
-- avoid every stratum name, since the grouping columns are spliced in.
WITH sc AS (
{scores_sql}
),
long AS (
    FROM (SELECT {by} NOT correct AS _incorrect, {score_casts} FROM sc)
    UNPIVOT INCLUDE NULLS (_u FOR score IN ({score_list}))
),
ranked AS (
    SELECT *,
           CASE WHEN _u IS NOT NULL AND NOT isnan(_u) THEN
                rank() OVER (PARTITION BY {part} score ORDER BY _u)
                  + (count(*) OVER (PARTITION BY {part} score, _u) - 1) / 2.0
           END AS _avg_rank
    FROM long
),
g AS (
    SELECT {by} score,
           count(*)                                                     AS n_items,
           count(_avg_rank)                                             AS n,
           count(_avg_rank) FILTER (WHERE _incorrect)                   AS n_incorrect,
           sum(_avg_rank) FILTER (WHERE _incorrect)                     AS _rank_sum
    FROM ranked
    GROUP BY {by} score
)
SELECT {by} score, n_items, n, n_items - n AS n_undefined, n_incorrect,
       CASE WHEN n_incorrect > 0 AND n > n_incorrect
            THEN (_rank_sum - n_incorrect * (n_incorrect + 1) / 2.0) / (n_incorrect * (n - n_incorrect))
       END AS auroc
FROM g
ORDER BY ALL
