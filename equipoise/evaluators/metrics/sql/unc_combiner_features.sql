-- Feature matrix for the reasoning-trace combiners (seed 002, appendix D): one row per
-- (run_id, item_id) from sample 0, the label (incorrect = not correct; unparsed counts as
-- incorrect, as in accuracy), the md5 train/test split, and every feature min-max scaled with the
-- bounds of the group's training rows (a constant feature scales to 0); _split is the item's md5
-- split fraction (uncertainty.split_fraction_sql of the split key). Rows with a NULL feature
-- stay, flagged by complete = false, and are left out of fitting and scoring.
-- The bounds are one grouped aggregate of the training rows per (group, complete)
-- ({bound_aggregates}: lo__f / hi__f), LEFT JOINed back to the rows (NULL group values match, as in
-- GROUP BY): a (group, complete) pair without training rows gets NULL bounds, as min / max over no
-- rows give, so its features scale to NULL. Aggregating under a WHERE instead of a FILTER clause
-- per aggregate over every row (the FILTERs selected the training rows once per aggregate) cost
-- about 0.02 CPU s less at 1M predictions with one DuckDB thread, the same rows;
-- _gid numbers the groups in the order of their values, so the caller can split the rows into
-- groups by an integer. Sorted by (strata, run_id, item_id), which is unique, so the rows of a
-- group are in (run_id, item_id) order; {select} is every column, or for fitting alone (sorted by
-- _gid, run_id, item_id: the same order within a group, as _gid, run_id and the integer _item_ord,
-- which sorts a run's items as item_id does, see uncertainty._scores_source) the group, label,
-- split and scaled features.
-- For fitting alone, the CTE runs is added: every (group, run_id) pair with the group's _gid
-- and _rk, the pair's place in (_gid, run_id) order; the rows join it instead of groups and sort
-- on (_rk, _item_ord), two integers when the fact holds _item_ord, rather than on the run_id
-- string (the sort was about 40% of this query's CPU at 1M predictions, and comparing run_id
-- strings a good part of it). The order is the same: _rk ranks the pairs as (_gid, run_id) sort.
-- Over the write-time fact the rows for fitting are not sorted here at all ({order_by} is empty):
-- they carry _key = _rk * 2**32 + _item_ord and the caller orders them by it in numpy
-- (uncertainty._features_with_gid), which is cheaper than moving every row through a sort.
-- base is MATERIALIZED: it feeds three consumers (inlined, each would read the scores again).
WITH sc AS (
{scores_sql}
),
base AS MATERIALIZED (
    SELECT {strata} run_id, item_id{item_ord_column}, NOT correct AS incorrect,
           _split < {train_fraction} AS is_train,
           {feature_casts},
           {complete} AS complete
    FROM sc
),
bounds AS (
    SELECT {by} complete, {bound_aggregates}
    FROM base
    WHERE is_train
    GROUP BY ALL
),
groups AS (
    SELECT {by} (row_number() OVER ({group_order}) - 1)::BIGINT AS _gid
    FROM (SELECT DISTINCT {by} true AS _one FROM base)
){runs}
SELECT {select}
FROM base
LEFT JOIN bounds ON {bounds_on}
JOIN {groups_join}
{order_by}
