-- Units for sampling-based conformal sets with pool 'item', read from `sampling_pools` (one row per
-- run x item, sql/sampling_pools.sql: the store's write-time fact, or the connection's TEMP table)
-- instead of grouping every prediction sample: what a connection whose base relations are fixed
-- uses (conformal.py). The same CTEs as conf_sampling_units.sql (gkeys / skeys, pools, units), with
-- the same columns and values: a pool 'item' is one run x item, and its group, stratum and coverage
-- columns are constant over its samples, so numbering the distinct values of the pools numbers the
-- same values as numbering those of the samples.
sc_all AS (
    SELECT {unit_cols} FROM sampling_pools
),
{id_ctes}
pools AS (
    SELECT g.gid, s.sid, sc.run_id, sc.item_id AS ukey, {cov_expr} AS cov, sc.m, sc.m_option,
           sc.n_targets, sc.target_option_id, sc.hit, sc.mv_correct, sc.ss, sc.st
    FROM sc_all sc
    JOIN gkeys g ON {gid_on}
    JOIN skeys s ON {sid_on}
),
units AS (
    SELECT gid, sid, run_id, ukey, cov, m, m_option, hit, target_option_id, mv_correct, ss, st
    FROM pools
    WHERE n_targets = 1
)
