-- Units for sampling-based conformal sets (seed 002 appendix G): one unit per run x pool, the pool
-- being the item's own samples (pool 'item') or every sample of the run's items sharing a base_id
-- (pool 'base': the option-shuffled copies of one question). Composed by conformal.py: a list of
-- CTEs (no WITH) defining
--   samp  every prediction sample with its gid / sid / pool key;
--   pools one row per pool: M (ALL samples, unparsed and error included), distinct targets, hit;
--   units the pools with one target option identity (others are counted, not used);
--   opt   one row per unit x option identity: f = share of the M samples that chose it (by
--         option_id, never by letter), s = 1 - f, computed as (M - c) / M.
samp AS (
    SELECT sc.*, {pool_col} AS ukey, {cov_expr} AS cov,
           dense_rank() OVER (ORDER BY {sc_by_list}) AS gid,
           dense_rank() OVER (ORDER BY {strat_list}) AS sid
    FROM scored sc
),
pools AS (
    SELECT gid, sid, run_id, ukey, count(*) AS m, count(parsed_option_id) AS m_option,
           count(DISTINCT target_option_id) AS n_targets, min(target_option_id) AS target_option_id,
           coalesce(bool_or(parsed_option_id = target_option_id), false) AS hit, min(cov) AS cov
    FROM samp
    GROUP BY gid, sid, run_id, ukey
),
units AS (
    SELECT * FROM pools WHERE n_targets = 1
),
votes AS (
    SELECT gid, sid, run_id, ukey, parsed_option_id AS option_id, count(*) AS c
    FROM samp
    WHERE parsed_option_id IS NOT NULL
    GROUP BY gid, sid, run_id, ukey, parsed_option_id
),
pool_options AS (
    SELECT DISTINCT x.gid, x.sid, x.run_id, x.ukey, o.option_id
    FROM (SELECT DISTINCT gid, sid, run_id, ukey, dataset_id, config, item_id FROM samp) x
    JOIN options o ON o.dataset_id = x.dataset_id AND o.config = x.config AND o.item_id = x.item_id
),
opt AS (
    SELECT u.gid, u.sid, u.run_id, u.ukey, po.option_id, po.option_id = u.target_option_id AS is_target,
           coalesce(v.c, 0) AS c, u.m,
           -- s = 1 - c/M as (M - c)/M: one rounding of the exact rational, equal ratios equal doubles
           (u.m - coalesce(v.c, 0))::DOUBLE / u.m AS s
    FROM units u
    JOIN pool_options po USING (gid, sid, run_id, ukey)
    LEFT JOIN votes v USING (gid, sid, run_id, ukey, option_id)
),
-- majority vote: the option chosen most often; ties go to the smallest option_id (string order);
-- a pool where no sample chose an option has no vote (counted as wrong)
vote AS (
    SELECT gid, sid, run_id, ukey, option_id AS mv_option_id
    FROM votes
    QUALIFY row_number() OVER (PARTITION BY gid, sid, run_id, ukey ORDER BY c DESC, option_id) = 1
)
