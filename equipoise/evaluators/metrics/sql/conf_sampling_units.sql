-- Units for sampling-based conformal sets (seed 002 appendix G): one unit per run x pool, the pool
-- being the item's own samples (pool 'item') or every sample of the run's items sharing a base_id
-- (pool 'base': the option-shuffled copies of one question). Composed by conformal.py: a list of
-- CTEs (no WITH) defining
--   samp   every prediction sample with its gid / sid / pool key;
--   pools  one row per pool: M (ALL samples, unparsed and error included), distinct targets, hit;
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
pools AS (
    SELECT gid, sid, run_id, ukey, count(*) AS m, count(parsed_option_id) AS m_option,
           count(DISTINCT target_option_id) AS n_targets, min(target_option_id) AS target_option_id,
           coalesce(bool_or(parsed_option_id = target_option_id), false) AS hit, min(cov) AS cov,
           -- a pool lies in one run, hence one dataset and config: min = max item means one item
           min(dataset_id) AS dataset_id, min(config) AS config, min(item_id) AS item_min,
           max(item_id) AS item_max
    FROM samp
    GROUP BY gid, sid, run_id, ukey
),
votes AS (  -- c = samples of the pool choosing the option (a parsed option is one of its item's options)
    SELECT gid, sid, run_id, ukey, parsed_option_id AS option_id, count(*) AS c,
           min(target_option_id) AS target_option_id
    FROM samp
    WHERE parsed_option_id IS NOT NULL
    GROUP BY gid, sid, run_id, ukey, parsed_option_id
),
-- majority vote: the option chosen most often; ties go to the smallest option_id (string order);
-- a pool where no sample chose an option has no vote (counted as wrong)
pool_votes AS (
    SELECT gid, sid, run_id, ukey, list(c) AS cs,
           coalesce(sum(c) FILTER (WHERE option_id = target_option_id), 0) AS c_target,
           arg_min(option_id, {{'neg_c': -c, 'option_id': option_id}}) AS mv_option_id
    FROM votes
    GROUP BY gid, sid, run_id, ukey
),
item_options AS (  -- distinct option identities per item
    SELECT dataset_id, config, item_id, count(DISTINCT option_id) AS n_options
    FROM options
    GROUP BY dataset_id, config, item_id
),
multi_item_options AS (  -- pools of several items (pool 'base'): distinct identities over all of them
    SELECT x.gid, x.sid, x.run_id, x.ukey, count(DISTINCT o.option_id) AS n_options
    FROM (
        SELECT DISTINCT s.gid, s.sid, s.run_id, s.ukey, s.dataset_id, s.config, s.item_id
        FROM samp s
        SEMI JOIN (SELECT gid, sid, run_id, ukey FROM pools WHERE item_min <> item_max) mp
            USING (gid, sid, run_id, ukey)
    ) x
    JOIN options o USING (dataset_id, config, item_id)
    GROUP BY x.gid, x.sid, x.run_id, x.ukey
),
-- an option no sample chose has c = 0, s = M / M = 1.0 exactly: those are appended as 1.0
units AS (
    SELECT p.gid, p.sid, p.run_id, p.ukey, p.cov, p.m, p.m_option, p.hit, p.target_option_id,
           coalesce(v.mv_option_id = p.target_option_id, false) AS mv_correct,
           CASE WHEN p.n_options IS NOT NULL THEN
               list_concat(list_transform(coalesce(v.cs, []), lambda c: (p.m - c)::DOUBLE / p.m),
                           list_resize([]::DOUBLE[], p.n_options - len(coalesce(v.cs, [])), 1.0))
           END AS ss,
           CASE WHEN p.n_options IS NOT NULL THEN (p.m - coalesce(v.c_target, 0))::DOUBLE / p.m END AS st
    FROM (
        SELECT p.*, CASE WHEN p.item_min = p.item_max THEN io.n_options ELSE mo.n_options END AS n_options
        FROM pools p
        LEFT JOIN item_options io
            ON io.dataset_id = p.dataset_id AND io.config = p.config AND io.item_id = p.item_min
        LEFT JOIN multi_item_options mo USING (gid, sid, run_id, ukey)
        WHERE p.n_targets = 1
    ) p
    LEFT JOIN pool_votes v USING (gid, sid, run_id, ukey)
)
