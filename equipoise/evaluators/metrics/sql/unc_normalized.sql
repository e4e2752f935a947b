-- Min-max normalisation of uncertainty scores (seed 004, appendix D.3): per group and score, the
-- lower bound is the minimum and the upper bound the upper_quantile (0.99) continuous quantile
-- (numpy's 'linear' method) of the score on a held-out partition: the items whose md5 split key
-- maps below holdout_fraction. Values are scaled to (x - lower) / (upper - lower) and clipped to
-- [0, 1]; when upper = lower the result is 0 at or below the bound and 1 above it. One row per
-- (run_id, item_id, score); held-out rows are left out unless include_holdout is set.
--
-- Work stays on the wide per-item rows as long as it can: the md5 split is taken once per item,
-- the bounds are one grouped aggregate ({bound_aggregates}: per score n__x, lo__x, hi__x over the
-- held-out rows), joined to the items of their group (NULL group values match, as in GROUP BY),
-- and only the kept rows are unpivoted to one row per score at the end. wide is MATERIALIZED so
-- that its two consumers do not each hash every item's split key with md5.
--
-- The rows come out ordered by (strata, run_id, item_id, score) without sorting the long rows: the
-- kept wide rows are sorted ({order_by}: one row per item, (number of scores) times fewer rows to
-- sort than after the unpivot), and the unpivot, a streaming unnest that keeps its input's order,
-- emits each item's scores in the order of its IN list, which the Python side sorts by score name
-- ({unpivot_in}). Sorting the long rows by their strings was half of this query's cost.
WITH sc AS (
{scores_sql}
),
wide AS MATERIALIZED (
    SELECT {strata} run_id, item_id,
           ('0x' || substr(md5({split_key}), 1, 8))::UBIGINT / 4294967296.0 < {holdout_fraction} AS in_holdout,
           {score_casts}
    FROM sc
),
bounds AS (
    SELECT {by} {bound_aggregates}
    FROM wide
    GROUP BY ALL
),
kept AS (
    SELECT wide.*, {bound_columns}
    FROM wide
    {bounds_join}
    WHERE {keep}
    {order_by}
),
long AS (
    FROM kept
    UNPIVOT INCLUDE NULLS ((raw, n_holdout, lower, upper) FOR score IN ({unpivot_in}))
)
SELECT {strata} run_id, item_id, score, in_holdout, raw, n_holdout, lower, upper,
       CASE WHEN raw IS NULL OR upper IS NULL THEN NULL
            WHEN upper > lower THEN greatest(0.0, least(1.0, (raw - lower) / (upper - lower)))
            WHEN raw <= lower THEN 0.0
            ELSE 1.0 END AS normalized
FROM long
