-- Units for split conformal over option probabilities (LAC / APS): one unit per run x item, the
-- prediction sample {sample_index}. Composed by conformal.py: a list of CTEs (no WITH) defining
--   base  every scored row of that sample with its group id (gid), stratum id (sid) and whether the
--         item has option probabilities (option_probs exists only where options were scored);
--   opt   one row per unit x option of the item (ALL its options, from `options`): the option's
--         probability p (0 for an option the backend did not score) and nonconformity s;
--   units one row per scored item: gid, sid, run_id, ukey (= item_id), cov (coverage_by value), the
--         scores ss of all its options, the target's score st and whether the target was unscored.
-- The item's unscored options are rows with p = 0 that need no identity: an option with p = 0 has
-- no mass below it, so its score is the same value (1.0) for LAC and APS, randomised or not, and
-- adds exactly 0 to every other option's mass_below. They are still rows (not a padded count) so
-- that the window sum below adds up the same sorted sequence of values as over all option rows.
probs AS (
    SELECT run_id, item_id, option_id, is_target, prob AS p
    FROM option_probs
    WHERE sample_index = {sample_index}
),
n_probs AS (
    SELECT run_id, item_id, count(*) AS n_scored FROM probs GROUP BY run_id, item_id
),
n_options AS (
    SELECT dataset_id, config, item_id, count(*) AS n_opt FROM options GROUP BY dataset_id, config, item_id
),
base AS (
    SELECT {unit_cols}, sc.item_id AS ukey, {cov_expr} AS cov,
           dense_rank() OVER (ORDER BY {sc_by_list}) AS gid,
           dense_rank() OVER (ORDER BY {strat_list}) AS sid,
           np.n_scored IS NOT NULL AS has_probs,
           coalesce(no.n_opt, 0) - coalesce(np.n_scored, 0) AS n_unscored_options
    FROM scored sc
    LEFT JOIN n_probs np ON np.run_id = sc.run_id AND np.item_id = sc.item_id
    LEFT JOIN n_options no ON no.dataset_id = sc.dataset_id AND no.config = sc.config AND no.item_id = sc.item_id
    WHERE sc.sample_index = {sample_index}
),
opt_p AS (
    SELECT b.gid, b.sid, b.run_id, b.ukey, b.cov, pr.is_target, false AS unscored, pr.p,
           -- U ~ Uniform(0, 1) for randomised APS: 52 bits of md5(seed, item, option identity), so the
           -- same item and option draw the same U in calibration and in prediction, in every repeat
           (('0x' || substr(md5('{seed}:aps:' || b.item_id || ':' || pr.option_id), 1, 13))::BIGINT + 0.5)
               / 4503599627370496.0 AS u
    FROM probs pr
    JOIN base b ON b.run_id = pr.run_id AND b.item_id = pr.item_id
    UNION ALL
    SELECT gid, sid, run_id, ukey, cov, NULL AS is_target, true AS unscored, 0.0 AS p, 0.5 AS u
    FROM (SELECT *, unnest(range(n_unscored_options)) FROM base WHERE has_probs AND n_unscored_options > 0)
),
opt AS (
    SELECT gid, sid, run_id, ukey, cov, is_target, unscored, p,
           -- mass of the options strictly less likely than this one (ties excluded)
           coalesce(sum(p) OVER (PARTITION BY gid, sid, run_id, ukey ORDER BY p
                                 RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW EXCLUDE GROUP), 0.0)
               AS mass_below,
           {score_expr} AS s
    FROM opt_p
),
-- the target is an option of the item (the `scored` view joins it), so a unit whose target has no
-- probability has it among the unscored rows, all of which share one score
units AS (
    SELECT gid, sid, run_id, ukey, any_value(cov) AS cov, list(s) AS ss,
           coalesce(min(s) FILTER (WHERE is_target), min(s) FILTER (WHERE unscored)) AS st,
           NOT coalesce(bool_or(is_target), false) AS target_unscored
    FROM opt
    GROUP BY gid, sid, run_id, ukey
)
