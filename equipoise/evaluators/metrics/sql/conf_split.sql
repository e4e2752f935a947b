-- Split conformal over `units` / `opt` (defined before this fragment), repeated over {repeats}
-- random calibration / test splits. Composed by conformal.py (a list of CTEs, no WITH).
--
-- Split: within each group (gid) and stratum (sid) the units are ordered by
-- md5('<seed>:<repeat>:<unit key>') (ties: run_id); the first round_half_up(cal_fraction * N) are
-- calibration, the rest test. cal_fraction = {cal_num}/{cal_den}, in integers.
-- Threshold: q_hat = the k-th smallest calibration score of the target, k = ceil((n+1)(1-alpha))
-- with alpha = {alpha_num}/{alpha_den}, in integer arithmetic; k > n gives NULL q_hat = full sets.
reps AS (
    SELECT range::INTEGER AS rep FROM range({repeats})
),
ranked AS (
    SELECT u.gid, u.sid, u.run_id, u.ukey, r.rep,
           row_number() OVER (PARTITION BY u.gid, u.sid, r.rep
                              ORDER BY md5('{seed}:' || r.rep || ':' || u.ukey), u.run_id) AS rnk,
           count(*) OVER (PARTITION BY u.gid, u.sid, r.rep) AS n_stratum
    FROM units u CROSS JOIN reps r
),
split AS (
    SELECT gid, sid, run_id, ukey, rep,
           rnk <= (2 * {cal_num} * n_stratum + {cal_den}) // (2 * {cal_den}) AS is_cal
    FROM ranked
),
cal_scores AS (
    SELECT sp.gid, sp.rep, o.s,
           row_number() OVER (PARTITION BY sp.gid, sp.rep ORDER BY o.s) AS j
    FROM split sp
    JOIN opt o USING (gid, sid, run_id, ukey)
    WHERE sp.is_cal AND o.is_target
),
thr AS (
    SELECT g.gid, g.rep, coalesce(c.n_cal, 0) AS n_cal,
           ((coalesce(c.n_cal, 0) + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1)
               // {alpha_den} AS k_order
    FROM (SELECT DISTINCT gid, rep FROM split) g
    LEFT JOIN (SELECT gid, rep, count(*) AS n_cal FROM split WHERE is_cal GROUP BY gid, rep) c
        USING (gid, rep)
),
thr_q AS (
    SELECT t.gid, t.rep, t.n_cal, t.k_order::BIGINT AS k_order, q.s AS q_hat
    FROM thr t
    LEFT JOIN cal_scores q ON q.gid = t.gid AND q.rep = t.rep AND q.j = t.k_order
),
test_sets AS (
    SELECT sp.gid, sp.sid, sp.run_id, sp.ukey, sp.rep, th.q_hat,
           count(*) AS n_opt,
           CASE WHEN th.q_hat IS NULL THEN count(*) ELSE count_if(o.s <= th.q_hat) END AS set_size,
           coalesce(bool_or(o.is_target AND (th.q_hat IS NULL OR o.s <= th.q_hat)), false) AS covered
    FROM split sp
    JOIN thr_q th USING (gid, rep)
    JOIN opt o USING (gid, sid, run_id, ukey)
    WHERE NOT sp.is_cal
    GROUP BY sp.gid, sp.sid, sp.run_id, sp.ukey, sp.rep, th.q_hat
),
per_rep AS (
    SELECT gid, rep, count(*) AS n_test, avg(set_size) AS set_size, avg(covered::INTEGER) AS coverage,
           avg((set_size = 0)::INTEGER) AS empty_rate
    FROM test_sets
    GROUP BY gid, rep
),
rep_stats AS (
    SELECT gid, count(*) AS repeats_with_test, max(n_test) AS n_test,
           avg(set_size) AS set_size_mean, stddev_samp(set_size) AS set_size_sd,
           avg(coverage) AS coverage_mean, stddev_samp(coverage) AS coverage_sd,
           avg(empty_rate) AS empty_rate
    FROM per_rep
    GROUP BY gid
),
thr_stats AS (
    SELECT gid, count(*) AS repeats, max(n_cal) AS n_cal, max(k_order) AS k_order,
           count_if(q_hat IS NULL) AS n_full_repeats,
           avg(q_hat) AS q_hat_mean, stddev_samp(q_hat) AS q_hat_sd
    FROM thr_q
    GROUP BY gid
)
