-- AUROC of each uncertainty score for telling the incorrect sample-0 answers of a group from the
-- correct ones (seed 002 4.3, seed 004 3.4): positives = NOT correct (an unparsed or refused answer
-- is not correct, and is counted), score = the uncertainty (higher = less sure). Items whose score
-- is undefined (NULL or NaN) are counted in n_undefined and left out; NULL AUROC when the defined
-- items hold only one class. Column names avoid every stratum name, since the grouping columns are
-- spliced in.
--
-- Mann-Whitney with ties counted one half, as a rank sum: AUROC = U / (n_pos * n_neg) with
-- 2U = sum over positives of (min rank + max rank) - n_pos (n_pos + 1), the average rank of a tied
-- value being the mean of its first and last rank. That is the same number as the trapezoidal area
-- under the ROC curve (scikit-learn's roc_auc_score), and an exact integer until the one division.
-- Both ranks come from one sort per (group, score) in a single window pass over the per-item rows:
-- rank() is the first rank (1 + items below), and count(*) over the default frame (RANGE from the
-- start through the current row's last peer) is the last rank (items at or below). Undefined
-- scores (NULL or NaN) sort last, after every defined value, so they shift no defined item's
-- ranks; they are counted in n_undefined and left out of the sums. This replaced a hash aggregate
-- to one row per distinct value followed by a framed running sum over those rows: with continuous
-- scores nearly every value is distinct, so the aggregate saved few rows and the framed window cost
-- more than one ranking pass (about 30% less CPU at 1M predictions).
-- The sort runs on one integer key per (group, score), _part = _gid * {n_scores} + score position,
-- not on the group's strings: {groups} numbers the distinct groups (_gid) and {keyed} tags each
-- item with its _gid; the names come back at the end.
WITH sc AS (
{scores_sql}
),
{groups},
keyed AS (
{keyed}
),
long AS (
    SELECT _gid * {n_scores} + _k AS _part, _incorrect, _u
    FROM (SELECT _gid, _incorrect, unnest([{score_casts}]) AS _u, unnest(range({n_scores})) AS _k FROM keyed)
),
ranked AS (
    SELECT _part, _incorrect, _v,
           rank() OVER w   AS _first,
           count(*) OVER w AS _last
    FROM (SELECT _part, _incorrect, CASE WHEN NOT isnan(_u) THEN _u END AS _v FROM long)
    WINDOW w AS (PARTITION BY _part ORDER BY _v ASC NULLS LAST)
),
g AS (
    SELECT _part,
           count(*)::BIGINT                                                  AS n_items,
           count(_v)::BIGINT                                                 AS n,
           count(_v) FILTER (WHERE _incorrect)::BIGINT                       AS n_incorrect,
           sum(_first + _last) FILTER (WHERE _incorrect AND _v IS NOT NULL)
             - n_incorrect * (n_incorrect + 1)                               AS _twice_u
    FROM ranked
    GROUP BY _part
)
SELECT {by} [{score_names}][g._part % {n_scores} + 1] AS score,
       n_items, n, n_items - n AS n_undefined, n_incorrect,
       CASE WHEN n_incorrect > 0 AND n > n_incorrect
            THEN _twice_u::DOUBLE / (2 * n_incorrect * (n - n_incorrect))::DOUBLE
       END AS auroc
FROM g
JOIN groups ON groups._gid = g._part // {n_scores}
ORDER BY ALL
