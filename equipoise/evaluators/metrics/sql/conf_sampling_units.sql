-- Units for sampling-based conformal sets (seed 002 appendix G): one unit per run x pool, the pool
-- being the item's own samples (pool 'item') or every sample of the run's items sharing a base_id
-- (pool 'base': the option-shuffled copies of one question). Composed by conformal.py: a list of
-- CTEs (no WITH) defining (the pool aggregates, votes and scores are fragments of conformal.py that
-- sql/sampling_pools.sql, the write-time fact of pools 'item', renders too)
--   samp   every prediction sample with its gid / sid / pool key;
--   pools  one row per pool: M (ALL samples, unparsed and error included), distinct targets, hit,
--          and the option ids its samples chose (a list: votes are counted per pool from it, not
--          by a second aggregation of every sample);
--   units  the pools with one target option identity (others are counted, not used), with the
--          scores ss of every option identity of the pool's items and the target's score st:
--          f = share of the M samples that chose the option (by option_id, never by letter),
--          s = 1 - f computed as (M - c) / M; and whether the majority vote is the target.
sc_all AS (
    SELECT {unit_cols} FROM scored
),
{id_ctes}
samp AS (
    SELECT sc.*, {pool_col} AS ukey, {cov_expr} AS cov, g.gid, s.sid
    FROM sc_all sc
    JOIN gkeys g ON {gid_on}
    JOIN skeys s ON {sid_on}
),
-- n_targets: 0 (no target id), 1 (min = max) or 2 (several; only "exactly one" is ever asked)
pools AS (
    SELECT gid, sid, run_id, ukey, {pool_aggregates}, min(cov) AS cov,
           -- a pool lies in one run, hence one dataset and config: min = max item means one item
           min(dataset_id) AS dataset_id, min(config) AS config, min(item_id) AS item_min,
           max(item_id) AS item_max
    FROM samp
    GROUP BY gid, sid, run_id, ukey
),
-- votes per pool: the chosen option ids sorted (string order) and how many samples chose each; the
-- majority vote is the first one with the largest count, so ties go to the smallest option_id; a
-- pool where no sample chose an option has no vote (counted as wrong)
pool_votes AS (
    {pool_votes}
),
item_options AS (  -- distinct option identities per item
    {item_options}
),
{multi_item_options}
-- an option no sample chose has c = 0, s = M / M = 1.0 exactly: those are appended as 1.0
units AS (
    SELECT p.gid, p.sid, p.run_id, p.ukey, p.cov, p.m, p.m_option, p.hit, p.target_option_id,
           {pool_outcome}
    FROM (
        SELECT p.*, CASE WHEN p.item_min = p.item_max THEN io.n_options ELSE mo.n_options END AS n_options
        FROM pool_votes p
        LEFT JOIN item_options io
            ON io.dataset_id = p.dataset_id AND io.config = p.config AND io.item_id = p.item_min
        LEFT JOIN multi_item_options mo USING (gid, sid, run_id, ukey)
    ) p
)
