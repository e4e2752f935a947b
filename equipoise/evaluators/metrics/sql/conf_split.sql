-- Split conformal over `units` (defined before this fragment: one row per unit with gid, sid, run_id,
-- ukey, cov, the scores ss of all its candidate options and the target's score st), repeated over
-- {repeats} random calibration / test splits. Composed by conformal.py (a list of CTEs, no WITH).
--
-- Split (the definition): within each group (gid) and stratum (sid) the units are ordered by
-- md5('<seed>:<repeat>:<unit key>') (ties: run_id); the first round_half_up(cal_fraction * N) are
-- calibration, the rest test. cal_fraction = {cal_num}/{cal_den}, in integers.
-- Threshold: q_hat = the k-th smallest calibration score of the target, k = ceil((n+1)(1-alpha))
-- with alpha = {alpha_num}/{alpha_den}, in integer arithmetic; k > n gives NULL q_hat = full sets.
--
-- How, without sorting units x repeats md5 strings (the slow part at scale): a stratum's calibration
-- part is the set of units whose key (md5 hex, run_id) is <= its n_cal-th smallest key, so only that
-- cutoff key is needed. The md5 is computed once per (unit key, repeat); h = its first 8 bytes as a
-- big-endian integer orders exactly as the first 16 hex digits (md5_number is the digest read
-- little-endian: the low 64 bits hold bytes 0-7 reversed, hence the byte swap). Counts per leading
-- byte of h locate the byte bucket holding the cutoff; only that bucket's units (about 1/256 of the
-- stratum) are ranked by (h, full md5 hex, run_id) to find the cutoff key itself. A unit is
-- calibration iff its key <= the cutoff, compared on h and, only when h ties, on the full hex and
-- run_id: the same set as the first n_cal rows of the documented order.
ukeys AS (
    SELECT ukey,
           list_transform(
               list_transform(range({repeats}), lambda r: md5_number('{seed}:' || r || ':' || ukey)),
               lambda n: {hi_expr}) AS hs
    FROM (SELECT DISTINCT ukey FROM units)
),
ukeyed AS (
    SELECT u.*, k.hs FROM units u JOIN ukeys k USING (ukey)
),
strata AS (
    SELECT gid, sid, count(*) AS n_stratum,
           (2 * {cal_num} * count(*) + {cal_den}) // (2 * {cal_den}) AS n_cal
    FROM units
    GROUP BY gid, sid
),
buckets AS (
    SELECT gid, sid, rep, h >> 56 AS b, count(*) AS c
    FROM (SELECT gid, sid, unnest(range({repeats})) AS rep, unnest(hs) AS h FROM ukeyed)
    GROUP BY ALL
),
cut_bucket AS (  -- the bucket holding the n_cal-th smallest key; `need` = its rank inside the bucket
    SELECT gid, sid, rep, b, n_cal - (cum - c) AS need
    FROM (
        SELECT bk.gid, bk.sid, bk.rep, bk.b, bk.c, st.n_cal,
               sum(bk.c) OVER (PARTITION BY bk.gid, bk.sid, bk.rep ORDER BY bk.b) AS cum
        FROM buckets bk
        JOIN strata st USING (gid, sid)
    )
    WHERE cum >= n_cal AND cum - c < n_cal  -- no row when n_cal = 0: no calibration unit
),
cut AS (  -- the n_cal-th smallest key per group, stratum and repeat
    SELECT gid, sid, rep, h AS cut_h, m AS cut_m, run_id AS cut_run
    FROM (
        SELECT x.gid, x.sid, x.rep, x.h, x.run_id, cb.need, md5('{seed}:' || x.rep || ':' || x.ukey) AS m
        FROM (SELECT gid, sid, run_id, ukey, unnest(range({repeats})) AS rep, unnest(hs) AS h FROM ukeyed) x
        JOIN cut_bucket cb ON cb.gid = x.gid AND cb.sid = x.sid AND cb.rep = x.rep AND cb.b = x.h >> 56
    )
    QUALIFY row_number() OVER (PARTITION BY gid, sid, rep ORDER BY h, m, run_id) = need
),
thr AS (  -- n_cal per repeat is fixed: the sum of the strata's n_cal
    SELECT g.gid, r.range AS rep, g.n_cal,
           ((g.n_cal + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1) // {alpha_den} AS k_order
    FROM (SELECT gid, sum(n_cal)::BIGINT AS n_cal FROM strata GROUP BY gid) g
    CROSS JOIN range({repeats}) r
),
-- calibration: is_cal = (key <= cutoff key); the full md5 hex is computed only where h ties the cutoff.
-- q_hat = element k (1-based) of the sorted calibration target scores: exactly the k-th smallest,
-- NULL when k > n
cal_sorted AS (
    SELECT gid, rep, list_sort(list(st)) AS scores
    FROM (
        SELECT gid, rep, st,
               CASE WHEN cut_h IS NULL THEN false
                    WHEN h < cut_h THEN true
                    WHEN h > cut_h THEN false
                    ELSE (md5('{seed}:' || rep || ':' || ukey) < cut_m
                          OR (md5('{seed}:' || rep || ':' || ukey) = cut_m AND run_id <= cut_run))
               END AS is_cal
        FROM (SELECT gid, sid, run_id, ukey, st, unnest(range({repeats})) AS rep, unnest(hs) AS h FROM ukeyed)
        LEFT JOIN cut USING (gid, sid, rep)
    )
    WHERE is_cal AND st IS NOT NULL
    GROUP BY gid, rep
),
thr_q AS (
    SELECT t.gid, t.rep, t.n_cal, t.k_order::BIGINT AS k_order, c.scores[t.k_order::BIGINT] AS q_hat
    FROM thr t
    LEFT JOIN cal_sorted c USING (gid, rep)
),
q_lists AS (
    SELECT gid, list(q_hat ORDER BY rep) AS qs FROM thr_q GROUP BY gid
),
-- test: the same is_cal test as in cal_sorted, then the set {{options with s <= q_hat}}
test_sets AS (
    SELECT * EXCLUDE (qs, cut_h, cut_m, cut_run),
           CASE WHEN q_hat IS NULL THEN len(ss) ELSE len(list_filter(ss, lambda x: x <= q_hat)) END AS set_size,
           CASE WHEN q_hat IS NULL THEN st IS NOT NULL ELSE coalesce(st <= q_hat, false) END AS covered
    FROM (
        SELECT *, qs[rep + 1] AS q_hat,
               CASE WHEN cut_h IS NULL THEN false
                    WHEN h < cut_h THEN true
                    WHEN h > cut_h THEN false
                    ELSE (md5('{seed}:' || rep || ':' || ukey) < cut_m
                          OR (md5('{seed}:' || rep || ':' || ukey) = cut_m AND run_id <= cut_run))
               END AS is_cal
        FROM (SELECT u.* EXCLUDE (hs), q.qs, unnest(range({repeats})) AS rep, unnest(u.hs) AS h
              FROM ukeyed u
              JOIN q_lists q USING (gid))
        LEFT JOIN cut USING (gid, sid, rep)
    )
    WHERE NOT is_cal AND ss IS NOT NULL
),
per_rep AS (
    SELECT gid, rep, count(*) AS n_test, avg(set_size) AS set_size, avg(covered::INTEGER) AS coverage,
           avg((set_size = 0)::INTEGER) AS empty_rate{per_rep_extra}
    FROM test_sets
    GROUP BY gid, rep
),
-- across repeats: summed in repeat order (a list), so the doubles are the same on every run
rep_stats AS (
    SELECT gid, count(*) AS repeats_with_test, max(n_test) AS n_test,
           list_avg(list(set_size ORDER BY rep)) AS set_size_mean,
           list_aggregate(list(set_size ORDER BY rep), 'stddev_samp') AS set_size_sd,
           list_avg(list(coverage ORDER BY rep)) AS coverage_mean,
           list_aggregate(list(coverage ORDER BY rep), 'stddev_samp') AS coverage_sd,
           list_avg(list(empty_rate ORDER BY rep)) AS empty_rate{rep_stats_extra}
    FROM per_rep
    GROUP BY gid
),
thr_stats AS (
    SELECT gid, count(*) AS repeats, max(n_cal) AS n_cal, max(k_order) AS k_order,
           count_if(q_hat IS NULL) AS n_full_repeats,
           list_avg(list(q_hat ORDER BY rep) FILTER (WHERE q_hat IS NOT NULL)) AS q_hat_mean,
           list_aggregate(list(q_hat ORDER BY rep) FILTER (WHERE q_hat IS NOT NULL), 'stddev_samp') AS q_hat_sd
    FROM thr_q
    GROUP BY gid
)
