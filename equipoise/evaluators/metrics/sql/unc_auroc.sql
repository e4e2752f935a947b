-- AUROC of each uncertainty score for telling the incorrect sample-0 answers of a group from the
-- correct ones (seed 002 4.3, seed 004 3.4): positives = NOT correct (an unparsed or refused answer
-- is not correct, and is counted), score = the uncertainty (higher = less sure). Items whose score
-- is undefined (NULL or NaN) are counted in n_undefined and left out; NULL AUROC when the defined
-- items hold only one class. Column names avoid every stratum name, since the grouping columns are
-- spliced in.
--
-- Mann-Whitney with ties counted one half, from counts per distinct value instead of per-item
-- ranks: AUROC = sum over distinct values v of pos(v) * (neg(< v) + neg(v) / 2) / (n_pos * n_neg),
-- the same number as the rank-sum with average ranks for ties and as the trapezoidal area under
-- the ROC curve (scikit-learn's roc_auc_score). The items collapse to one row per (group, score,
-- value) in a hash aggregate and one running sum over those rows gives neg(< v); the numerator
-- sum(pos(v) * (2 neg(< v) + neg(v))) is an exact integer, divided once at the end. Undefined
-- scores stay as one NULL-valued row per group and score, so they are counted but not ranked.
-- The sort behind the running sum is the cost, so it runs on one integer key per (group, score),
-- _part = _gid * {n_scores} + score position, not on the group's strings: {groups} numbers the
-- distinct groups (_gid) and {keyed} tags each item with its _gid; the names come back at the end.
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
per_value AS (
    SELECT _part,
           CASE WHEN NOT isnan(_u) THEN _u END          AS _v,
           count(*) FILTER (WHERE _incorrect)           AS _pos,
           count(*) FILTER (WHERE NOT _incorrect)       AS _neg
    FROM long
    GROUP BY ALL
),
below AS (
    SELECT *,
           coalesce(sum(_neg) OVER (PARTITION BY _part ORDER BY _v
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS _neg_below
    FROM per_value
),
g AS (
    SELECT _part,
           sum(_pos + _neg)::BIGINT                                                      AS n_items,
           coalesce(sum(_pos + _neg) FILTER (WHERE _v IS NOT NULL), 0)::BIGINT           AS n,
           coalesce(sum(_pos) FILTER (WHERE _v IS NOT NULL), 0)::BIGINT                  AS n_incorrect,
           sum(_pos * (2 * _neg_below + _neg)) FILTER (WHERE _v IS NOT NULL)             AS _twice_u
    FROM below
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
