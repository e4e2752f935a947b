-- Min-max normalisation of uncertainty scores (seed 004, appendix D.3): per group and score, the
-- lower bound is the minimum and the upper bound the upper_quantile (0.99) continuous quantile
-- (numpy's 'linear' method) of the score on a held-out partition: the items whose md5 split key
-- maps below holdout_fraction ({in_holdout}). Values are scaled to (x - lower) / (upper - lower)
-- and clipped to [0, 1]; when upper = lower the result is 0 at or below the bound and 1 above it; a
-- NULL score, or a group with no defined held-out value (NULL bounds), gives NULL. One row per
-- (run_id, item_id), one DOUBLE column per score named as the score, holding the normalised value;
-- held-out rows are left out unless include_holdout is set. The raw values are unc_scores' and the
-- bounds unc_normalization_bounds' (the same query, uncertainty._bounds_select): neither is
-- repeated here.
--
-- Why wide: one row per item and score repeated each group's three bounds on every row, and the
-- unpivot plus writing (number of scores) times as many rows was most of this metric's cost.
--
-- The md5 split fraction (_split) comes with the scores (the write-time fact holds it; otherwise it
-- is hashed once per item). wide is MATERIALIZED when the bounds aggregate it here, so
-- that its two consumers do not each read and cast (or hash) every item; with the bounds read from
-- the cache it has one consumer and is inlined (copying every item's scores first cost about 15%
-- of this metric's CPU at 1M predictions). The bounds are one grouped aggregate (uncertainty._bounds_select:
-- per score n__x, lo__x, hi__x over the held-out rows) of wide, or the same aggregate read from the
-- table unc_normalization_bounds left in the connection's cache (see uncertainty._bounds_cache),
-- joined to the items of their group (NULL group values match, as in GROUP BY).
-- Over the write-time fact, the rows are sorted on two integers that give the order of (strata,
-- run_id, item_id): the rank of the row's (strata, run_id) pair, from {runs_join}, and the fact's
-- item rank _item_ord (see uncertainty._ranked_runs_join); otherwise on the columns themselves.
-- {normalized_columns} is the CASE below per score x:
--   CASE WHEN x IS NULL OR hi__x IS NULL THEN NULL
--        WHEN hi__x > lo__x THEN greatest(0.0, least(1.0, (x - lo__x) / (hi__x - lo__x)))
--        WHEN x <= lo__x THEN 0.0 ELSE 1.0 END AS x
WITH sc AS (
{scores_sql}
),
wide AS {wide_mode} (
    SELECT {strata} run_id, item_id{item_ord_column}, {in_holdout} AS in_holdout, {score_casts}
    FROM sc
),
bounds AS (
{bounds}
)
SELECT {wide_strata} wide.run_id, wide.item_id, wide.in_holdout, {normalized_columns}
FROM wide
{bounds_join}
{runs_join}
WHERE {keep}
{order_by}
