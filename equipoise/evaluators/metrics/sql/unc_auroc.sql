-- AUROC of each uncertainty score for telling the incorrect sample-0 answers of a group from the
-- correct ones (seed 002 4.3, seed 004 3.4): positives = NOT correct (an unparsed or refused answer
-- is not correct, and is counted), score = the uncertainty (higher = less sure). Items whose score
-- is undefined (NULL or NaN) are counted in n_undefined and left out; NULL AUROC when the defined
-- items hold only one class. Column names avoid every stratum name, since the grouping columns are
-- spliced in.
--
-- Mann-Whitney with ties counted one half: AUROC = U / (n_pos * n_neg), the same number as the
-- trapezoidal area under the ROC curve (scikit-learn's roc_auc_score). 2U is an exact integer until
-- the one division, computed one of two ways per score; both give the same integer, so the choice
-- only decides the cost:
--
-- * discrete scores (counts, sample-count based SC / SE, elicited confidence take few distinct
--   values): the CTEs of unc_value_counts.sql (ending in g_discrete) collapse the rows to counts per
--   (group, score, value), and one running sum over those few rows gives the negatives below each
--   value: 2U = sum over values v of pos(v) * (2 neg(< v) + neg(v)).
-- * continuous scores (nearly every value distinct, where that aggregate saves
--   few rows and costs a hash table as large as the input): a rank sum from one sort of all their
--   rows by (partition, value): 2U = sum over positives of (first rank + last rank)
--   - n_pos (n_pos + 1), the average rank of a tied value being the mean of its first and last
--   rank. The CTEs that rank them are unc_auroc_sorted.sql's (one plain sort read in order by a
--   streaming window, where the connection keeps insertion order) or unc_auroc_windowed.sql's (a
--   window partitioned by score and group), ending in g_continuous; both give the same integers.
--
-- Undefined scores (NULL or NaN) sort last, after every defined value, so they shift no defined
-- value's counts or ranks; they are counted in n_undefined and left out of the sums. Splitting the
-- scores this way sorts only the continuous half of the rows (about 35% less CPU than ranking every
-- score at 1M predictions; with a 4-byte partition key instead of 8, about 47% less in all). The
-- work runs on one integer key per (group, score), _part = _gid * {n_scores} + the score's
-- position (an unsigned integer of 2 or 4 bytes, uncertainty._part_type: the sort compares it),
-- not on the group's strings: {groups} numbers the distinct groups (_gid) and {keyed} tags each
-- item with its _gid (by a join, or where a few groups were read ahead by a CASE over their
-- values, uncertainty._group_ids); the names come back at the end. In the sort an undefined
-- continuous score is NaN, not NULL (uncertainty._long_scores reads a NULL as NaN): DuckDB sorts
-- NaN after every number, +inf included, so the order is the same, and a sort key that is never
-- NULL cost about 0.015 s less CPU at 1M predictions. NaN equals NaN in DuckDB,
-- so undefined rows may look tied; every sum leaves them out by NOT isnan(_v).
-- sc and keyed are NOT MATERIALIZED when the scores are a table (the fact or the connection's
-- cache): each score's SELECT of keyed (uncertainty._long_scores) then scans only its own score,
-- which cost less than copying every row first (about 9% of this metric's CPU at 1M predictions).
WITH sc AS {source_mode} (
{scores_sql}
),
{groups},
keyed AS {source_mode} (
{keyed}
),
{value_counts},
{ranked},
g AS (
    SELECT * FROM g_discrete
    UNION ALL
    SELECT * FROM g_continuous
)
SELECT {by} [{score_names}][g._part % {n_scores} + 1] AS score,
       n_items, n, n_items - n AS n_undefined, n_incorrect,
       CASE WHEN n_incorrect > 0 AND n > n_incorrect
            THEN _twice_u::DOUBLE / (2 * n_incorrect * (n - n_incorrect))::DOUBLE
       END AS auroc
FROM g
JOIN groups ON groups._gid = g._part // {n_scores}
ORDER BY ALL
