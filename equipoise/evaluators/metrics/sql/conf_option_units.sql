-- Units for split conformal over option probabilities (LAC / APS): one unit per run x item, the
-- prediction sample {sample_index}. Composed by conformal.py: a list of CTEs (no WITH) defining
--   base  every scored row of that sample with its group id (gid), stratum id (sid) and whether the
--         item has option probabilities (option_probs exists only where options were scored);
--   units one row per scored item: gid, sid, run_id, ukey (= item_id), cov (coverage_by value), the
--         scores ss of all its options (ALL of them, from `options`), the target's score st and
--         whether the target was unscored.
-- With fixed base relations (a read-only pass) the connection's shared calibration mask table holds
-- the same units' identity (gid, sid, run_id, ukey, numbered the same way: conformal.py,
-- `_mask_identity_sql`), and LAC / plain APS then read their units from that table joined by rowid
-- to their scores (`facts_scored` over the store's facts, else `sample_probs`: conformal.py,
-- `_cached_option_units`) instead.
-- Per unit, not per option row: the scores are one list per run x item, every option's score a list
-- operation on the item's probabilities sorted ascending (no window over option rows, no join of
-- option rows to items). This query groups `option_probs` itself, with the formulas of the
-- per-sample facts (`sample_probs`: lac_scores / lac_target, aps_scores / aps_target, see
-- sample_probs.sql; that query and the score expressions come from conformal.py,
-- `_option_score_sql`): views, and randomised APS, whose U depends on the seed and the option. The
-- item's unscored options have p = 0: no mass below them, so their score
-- is exactly 1.0 for LAC and APS, randomised or not, and they add exactly 0 to every other
-- option's mass_below; they are appended as 1.0. mass_below(p) sums the sorted list's values < p
-- in ascending order, so the same probabilities give the same double every time.
probs AS (
    {probs_sql}
),
n_options AS (  -- the item's option count, for the unscored options' 1.0 scores
    SELECT dataset_id, config, item_id, count(*) AS n_opt FROM options GROUP BY dataset_id, config, item_id
),
-- sc0 ({{sc0_materialized}}) is NOT MATERIALIZED with fixed base relations: each consumer rescans
-- `scored` for its own columns (cheap), instead of one materialized copy of the sample's rows; over
-- a view it is computed once
sc0 AS {sc0_materialized} (
    SELECT {unit_cols} FROM scored WHERE sample_index = {sample_index}
),
{id_ctes}
base AS (
    SELECT sc.*, sc.item_id AS ukey, {cov_expr} AS cov, g.gid, s.sid,
           pr.n_scored IS NOT NULL AS has_probs, pr.has_target{base_cols}
    FROM sc0 sc
    JOIN gkeys g ON {gid_on}
    JOIN skeys s ON {sid_on}
    LEFT JOIN probs pr ON pr.run_id = sc.run_id AND pr.item_id = sc.item_id
    LEFT JOIN n_options no ON no.dataset_id = sc.dataset_id AND no.config = sc.config AND no.item_id = sc.item_id
),
-- the target is an option of the item (the `scored` view joins it): unscored, it scores 1.0 like
-- every unscored option
units AS (
    SELECT gid, sid, run_id, ukey, cov, {ss_expr} AS ss, {st_expr} AS st, NOT has_target AS target_unscored
    FROM base
    WHERE has_probs
)
