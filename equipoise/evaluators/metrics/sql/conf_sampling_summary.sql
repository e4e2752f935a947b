-- conformal_sampling: one row per group. Conformal columns as in conformal_lac; mv_accuracy /
-- hit_rate over every unit, *_test over the test units (mean over repeats).
pool_counts AS (
    SELECT gid, count(*) AS n_pools, count_if(n_targets <> 1) AS n_target_mismatch
    FROM pools
    GROUP BY gid
),
groups AS (  -- counted per gid first: `pools` has columns (run_id) that may also be grouping columns
    SELECT keys.*, pc.n_pools, pc.n_target_mismatch
    FROM (SELECT DISTINCT gid, {by_list} FROM gkeys) keys
    JOIN pool_counts pc USING (gid)
),
all_stats AS (
    SELECT gid, count(*) AS n_units, min(m) AS m_min, max(m) AS m_max, avg(m) AS m_mean,
           sum(m - m_option) AS n_samples_no_option,
           avg(mv_correct::INTEGER) AS mv_accuracy, avg(hit::INTEGER) AS hit_rate
    FROM units
    GROUP BY gid
)
SELECT {g_by} g.n_pools::BIGINT AS n_pools, g.n_target_mismatch::BIGINT AS n_target_mismatch,
       coalesce(a.n_units, 0)::BIGINT AS n_units, a.m_min, a.m_max, a.m_mean,
       coalesce(a.n_samples_no_option, 0)::BIGINT AS n_samples_no_option,
       coalesce(ts.n_cal, 0)::BIGINT AS n_cal, coalesce(rs.n_test, 0)::BIGINT AS n_test,
       {repeats} AS repeats, {alpha} AS alpha, ts.k_order, coalesce(ts.n_full_repeats, 0)::BIGINT AS n_full_repeats,
       ts.q_hat_mean, ts.q_hat_sd, rs.set_size_mean, rs.set_size_sd, rs.coverage_mean, rs.coverage_sd,
       rs.empty_rate, a.mv_accuracy, a.hit_rate, rs.mv_accuracy_test, rs.hit_rate_test{mask_check_col}
FROM groups g
LEFT JOIN all_stats a USING (gid)
LEFT JOIN thr_stats ts USING (gid)
LEFT JOIN rep_stats rs USING (gid)
ORDER BY gid
