-- Units for sampling-based conformal sets with pool 'item', read from `sampling_pools` (one row per
-- run x item, sql/sampling_pools.sql: the store's write-time fact, or the connection's TEMP table)
-- instead of grouping every prediction sample: what a connection whose base relations are fixed
-- uses (conformal.py). The same CTEs as conf_sampling_units.sql (gkeys / skeys, pools, units), with
-- the same columns and values: a pool 'item' is one run x item, and its group, stratum and coverage
-- columns are constant over its samples, so numbering the distinct values of the pools numbers the
-- same values as numbering those of the samples. {{code_cols}}: over the store's facts, also the
-- pool's integer item code and the rowid sc_row of its facts_scored row (facts.py), by which the
-- pools join the option mask (conformal.py).
-- NOT MATERIALIZED (sc_all, pools, units): each consumer rescans the fixed relation, reading only
-- its own columns (the group numbering reads the grouping columns, the summary's counts no score
-- list), instead of one materialized copy of every wide pool row per CTE (at 10M predictions those
-- copies, score lists and id strings included, were what spilled)
sc_all AS NOT MATERIALIZED (
    SELECT {unit_cols} FROM sampling_pools
),
{id_ctes}
pools AS NOT MATERIALIZED (
    SELECT g.gid, s.sid, sc.run_id, sc.item_id AS ukey, {cov_expr} AS cov, sc.m, sc.m_option,
           sc.n_targets, sc.target_option_id, sc.hit, sc.mv_correct, sc.ss, sc.st{code_cols}
    FROM sc_all sc
    JOIN gkeys g ON {gid_on}
    JOIN skeys s ON {sid_on}
),
units AS NOT MATERIALIZED (
    SELECT gid, sid, run_id, ukey, cov, m, m_option, hit, target_option_id, mv_correct, ss, st{code_cols}
    FROM pools
    WHERE n_targets = 1
)
