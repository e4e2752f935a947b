-- conformal_lac / conformal_aps: one row per group. Means are over the repeats (each repeat: the
-- mean over its test items); *_sd are sample standard deviations across repeats (NULL for one
-- repeat). n_cal / n_test are per repeat (the same in every repeat: fixed counts per stratum).
groups AS (
    SELECT gid, {by} count(*) AS n_items, count_if(NOT has_probs) AS n_unscored
    FROM base
    GROUP BY {gid_by}
),
-- {target_units}: `units`, or where conformal_lac reads every other sum from the connection's tables,
-- the flags the shared mask table holds (conformal.py, `_query`: then nothing joins the score lists)
target_unscored AS (
    SELECT gid, count_if(target_unscored) AS n_target_unscored FROM {target_units} GROUP BY gid
)
SELECT {g_by} g.n_items::BIGINT AS n_items, (g.n_items - g.n_unscored)::BIGINT AS n_scored,
       g.n_unscored::BIGINT AS n_unscored, coalesce(tu.n_target_unscored, 0)::BIGINT AS n_target_unscored,
       coalesce(ts.n_cal, 0)::BIGINT AS n_cal, coalesce(rs.n_test, 0)::BIGINT AS n_test,
       {repeats} AS repeats, {alpha} AS alpha, ts.k_order, coalesce(ts.n_full_repeats, 0)::BIGINT AS n_full_repeats,
       ts.q_hat_mean, ts.q_hat_sd, rs.set_size_mean, rs.set_size_sd, rs.coverage_mean, rs.coverage_sd,
       rs.empty_rate{mask_check_col}
FROM groups g
LEFT JOIN thr_stats ts USING (gid)
LEFT JOIN rep_stats rs USING (gid)
LEFT JOIN target_unscored tu USING (gid)
ORDER BY gid
