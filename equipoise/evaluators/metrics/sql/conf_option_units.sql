-- Units for split conformal over option probabilities (LAC / APS): one unit per run x item, the
-- prediction sample {sample_index}. Composed by conformal.py: a list of CTEs (no WITH) defining
--   base  every scored row of that sample with its group id (gid), stratum id (sid) and whether the
--         item has option probabilities (option_probs exists only where options were scored);
--   units one row per scored item: gid, sid, run_id, ukey (= item_id), cov (coverage_by value);
--   opt   one row per unit x option of the item (ALL its options, from `options`): the option's
--         probability p (0 for an option the backend did not score) and nonconformity s.
probs AS (
    SELECT run_id, item_id, label, prob FROM option_probs WHERE sample_index = {sample_index}
),
probed AS (
    SELECT DISTINCT run_id, item_id FROM probs
),
base AS (
    SELECT sc.*, sc.item_id AS ukey, {cov_expr} AS cov,
           dense_rank() OVER (ORDER BY {sc_by_list}) AS gid,
           dense_rank() OVER (ORDER BY {strat_list}) AS sid,
           pr.item_id IS NOT NULL AS has_probs
    FROM scored sc
    LEFT JOIN probed pr ON pr.run_id = sc.run_id AND pr.item_id = sc.item_id
    WHERE sc.sample_index = {sample_index}
),
units AS (
    SELECT gid, sid, run_id, ukey, cov FROM base WHERE has_probs
),
opt_p AS (
    SELECT b.gid, b.sid, b.run_id, b.ukey, o.option_id, o.label = b.target_label AS is_target,
           p.prob IS NULL AS unscored, coalesce(p.prob, 0.0) AS p,
           -- U ~ Uniform(0, 1) for randomised APS: 52 bits of md5(seed, item, option identity), so the
           -- same item and option draw the same U in calibration and in prediction, in every repeat
           (('0x' || substr(md5('{seed}:aps:' || b.item_id || ':' || o.option_id), 1, 13))::BIGINT + 0.5)
               / 4503599627370496.0 AS u
    FROM base b
    JOIN options o ON o.dataset_id = b.dataset_id AND o.config = b.config AND o.item_id = b.item_id
    LEFT JOIN probs p ON p.run_id = b.run_id AND p.item_id = b.item_id AND p.label = o.label
    WHERE b.has_probs
),
opt AS (
    SELECT gid, sid, run_id, ukey, option_id, is_target, unscored, p,
           -- mass of the options strictly less likely than this one (ties excluded)
           coalesce(sum(p) OVER (PARTITION BY gid, sid, run_id, ukey ORDER BY p
                                 RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW EXCLUDE GROUP), 0.0)
               AS mass_below,
           {score_expr} AS s
    FROM opt_p
)
