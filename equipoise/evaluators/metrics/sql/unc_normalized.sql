-- Min-max normalisation of uncertainty scores (seed 004, appendix D.3): per group and score, the
-- lower bound is the minimum and the upper bound the upper_quantile (0.99) continuous quantile
-- (numpy's 'linear' method) of the score on a held-out partition: the items whose md5 split key
-- maps below holdout_fraction. Values are scaled to (x - lower) / (upper - lower) and clipped to
-- [0, 1]; when upper = lower the result is 0 at or below the bound and 1 above it. One row per
-- (run_id, item_id, score); held-out rows are left out unless include_holdout is set.
WITH sc AS (
{scores_sql}
),
wide AS (
    SELECT {strata} run_id, item_id, {split_key} AS split_key, {score_casts}
    FROM sc
),
long AS (
    FROM wide UNPIVOT INCLUDE NULLS (raw FOR score IN ({score_list}))
),
flagged AS (
    SELECT *,
           ('0x' || substr(md5(split_key), 1, 8))::UBIGINT / 4294967296.0 < {holdout_fraction} AS in_holdout
    FROM long
),
bounded AS (
    SELECT *,
           count(CASE WHEN in_holdout THEN raw END) OVER w                           AS n_holdout,
           min(CASE WHEN in_holdout THEN raw END) OVER w                             AS lower,
           quantile_cont(CASE WHEN in_holdout THEN raw END, {upper_quantile}) OVER w AS upper
    FROM flagged
    WINDOW w AS (PARTITION BY {part} score)
)
SELECT {strata} run_id, item_id, score, in_holdout, raw, n_holdout, lower, upper,
       CASE WHEN raw IS NULL OR upper IS NULL THEN NULL
            WHEN upper > lower THEN greatest(0.0, least(1.0, (raw - lower) / (upper - lower)))
            WHEN raw <= lower THEN 0.0
            ELSE 1.0 END AS normalized
FROM bounded
WHERE {keep}
ORDER BY ALL
