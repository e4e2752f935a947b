-- Units for split conformal over option probabilities (LAC / APS): one unit per run x item, the
-- prediction sample {sample_index}. Composed by conformal.py: a list of CTEs (no WITH) defining
--   base  every scored row of that sample with its group id (gid), stratum id (sid) and whether the
--         item has option probabilities (option_probs exists only where options were scored);
--   units one row per scored item: gid, sid, run_id, ukey (= item_id), cov (coverage_by value), the
--         scores ss of all its options (ALL of them, from `options`), the target's score st and
--         whether the target was unscored.
-- Per unit, not per option row: the scored options' probabilities are gathered into one list per
-- run x item (sorted ascending for APS, whose mass_below sums it in order), and every score is a list operation on it (no window over option
-- rows, no join of option rows to items). The item's unscored options have p = 0: no mass below
-- them, so their score is exactly 1.0 for LAC and APS, randomised or not, and they add exactly 0 to
-- every other option's mass_below; they are appended as 1.0. mass_below(p) sums the sorted list's
-- values < p in ascending order, so the same probabilities give the same double every time.
probs AS (
    SELECT run_id, item_id, {ps_agg} AS ps, count(*) AS n_scored,
           bool_or(is_target) AS has_target, max(prob) FILTER (WHERE is_target) AS p_target{opt_agg}
    FROM option_probs
    WHERE sample_index = {sample_index}
    GROUP BY run_id, item_id
),
n_options AS (
    SELECT dataset_id, config, item_id, count(*) AS n_opt FROM options GROUP BY dataset_id, config, item_id
),
sc0 AS (
    SELECT {unit_cols} FROM scored WHERE sample_index = {sample_index}
),
{id_ctes}
base AS (
    SELECT sc.*, sc.item_id AS ukey, {cov_expr} AS cov, g.gid, s.sid,
           pr.n_scored IS NOT NULL AS has_probs,
           coalesce(no.n_opt, 0) - coalesce(pr.n_scored, 0) AS n_unscored_options,
           pr.ps, pr.has_target, pr.p_target{opt_cols}
    FROM sc0 sc
    JOIN gkeys g ON {gid_on}
    JOIN skeys s ON {sid_on}
    LEFT JOIN probs pr ON pr.run_id = sc.run_id AND pr.item_id = sc.item_id
    LEFT JOIN n_options no ON no.dataset_id = sc.dataset_id AND no.config = sc.config AND no.item_id = sc.item_id
),
-- the target is an option of the item (the `scored` view joins it): unscored, it scores 1.0 like
-- every unscored option
units AS (
    SELECT gid, sid, run_id, ukey, cov,
           list_concat(list_transform({opt_list}, lambda o: {opt_score}),
                       list_resize([]::DOUBLE[], greatest(n_unscored_options, 0), 1.0)) AS ss,
           CASE WHEN has_target THEN {target_score} ELSE 1.0 END AS st,
           NOT has_target AS target_unscored
    FROM base
    WHERE has_probs
)
