-- Units for sampling-based conformal sets (seed 002 appendix G): one unit per run x pool, the pool
-- being the item's own samples (pool 'item') or every sample of the run's items sharing a base_id
-- (pool 'base': the option-shuffled copies of one question). Composed by conformal.py: a list of
-- CTEs (no WITH) defining
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
    SELECT gid, sid, run_id, ukey, count(*) AS m, count(parsed_option_id) AS m_option,
           CASE WHEN min(target_option_id) IS NULL THEN 0
                WHEN min(target_option_id) = max(target_option_id) THEN 1 ELSE 2 END AS n_targets,
           min(target_option_id) AS target_option_id,
           coalesce(bool_or(parsed_option_id = target_option_id), false) AS hit, min(cov) AS cov,
           -- a pool lies in one run, hence one dataset and config: min = max item means one item
           min(dataset_id) AS dataset_id, min(config) AS config, min(item_id) AS item_min,
           max(item_id) AS item_max,
           coalesce(list(parsed_option_id) FILTER (WHERE parsed_option_id IS NOT NULL), []) AS chosen
    FROM samp
    GROUP BY gid, sid, run_id, ukey
),
-- votes per pool: the chosen option ids sorted (string order) and how many samples chose each; the
-- majority vote is the first one with the largest count, so ties go to the smallest option_id; a
-- pool where no sample chose an option has no vote (counted as wrong)
pool_votes AS (
    SELECT *, opts[list_position(cs, list_max(cs))] AS mv_option_id,
           len(list_filter(chosen, lambda x: x = target_option_id)) AS c_target
    FROM (SELECT *, list_transform(opts, lambda d: len(list_filter(chosen, lambda x: x = d))) AS cs
          FROM (SELECT *, list_sort(list_distinct(chosen)) AS opts FROM pools WHERE n_targets = 1))
),
item_options AS (  -- distinct option identities per item
    SELECT dataset_id, config, item_id, count(DISTINCT option_id) AS n_options
    FROM options
    GROUP BY dataset_id, config, item_id
),
{multi_item_options}
-- an option no sample chose has c = 0, s = M / M = 1.0 exactly: those are appended as 1.0
units AS (
    SELECT p.gid, p.sid, p.run_id, p.ukey, p.cov, p.m, p.m_option, p.hit, p.target_option_id,
           coalesce(p.mv_option_id = p.target_option_id, false) AS mv_correct,
           CASE WHEN p.n_options IS NOT NULL THEN
               list_concat(list_transform(p.cs, lambda c: (p.m - c)::DOUBLE / p.m),
                           list_resize([]::DOUBLE[], p.n_options - len(p.cs), 1.0))
           END AS ss,
           CASE WHEN p.n_options IS NOT NULL THEN (p.m - p.c_target)::DOUBLE / p.m END AS st
    FROM (
        SELECT p.*, CASE WHEN p.item_min = p.item_max THEN io.n_options ELSE mo.n_options END AS n_options
        FROM pool_votes p
        LEFT JOIN item_options io
            ON io.dataset_id = p.dataset_id AND io.config = p.config AND io.item_id = p.item_min
        LEFT JOIN multi_item_options mo USING (gid, sid, run_id, ukey)
    ) p
)
