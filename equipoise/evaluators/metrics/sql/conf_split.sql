-- Split conformal over `units` (defined before this fragment: one row per unit with gid, sid, run_id,
-- ukey, cov, the scores ss of all its candidate options and the target's score st), repeated over
-- {repeats} random calibration / test splits. Composed by conformal.py (a list of CTEs, no WITH).
--
-- Split (the definition): within each group (gid) and stratum (sid) the units are ordered by
-- (h, ukey, run_id), h = the split hash of the unit key in that repeat (SplitMix64 output rep + 1
-- seeded with the first 16 hex digits of md5('{seed}:<unit key>'), see conformal.py); the first
-- round_half_up(cal_fraction * N) are calibration, the rest test. cal_fraction = {cal_num}/{cal_den}.
-- Threshold: q_hat = the k-th smallest calibration score of the target, k = ceil((n+1)(1-alpha))
-- with alpha = {alpha_num}/{alpha_den}, in integer arithmetic; k > n gives NULL q_hat = full sets.
--
-- How, without sorting units x repeats rows (the slow part at scale): md5 runs once per distinct unit
-- key, the {repeats} hashes are integer arithmetic on it. A stratum's calibration part is the set of
-- units whose key (h, ukey, run_id) is <= its n_cal-th smallest key, so only that cutoff key is
-- needed: counts per leading byte of h locate the byte bucket holding it, and only that bucket's rows
-- (about 1/256 of the stratum) are ranked. Four streaming passes over the units x repeats rows
-- (unnested from per-unit lists, nothing of that size is materialized): bucket counts; the rows
-- below the cutoff bucket (certain calibration: their target scores go into a bounded top-m heap per
-- group and repeat); the rows in it (ranked); the test rows (sets).
split_keys AS (  -- the {repeats} split hashes of every distinct unit key, as a list by repeat
    {split_keys_sql}
),
-- skey: one small integer per group x stratum, so the bucket counts group by one BIGINT;
-- m = n_cal - k + 1 of the group (at least 1): how many of the largest calibration scores q_hat needs
strata AS (
    SELECT *, greatest(sum(n_cal) OVER (PARTITION BY gid) + 1
                       - ((sum(n_cal) OVER (PARTITION BY gid) + 1)::HUGEINT * ({alpha_den} - {alpha_num})
                          + {alpha_den} - 1) // {alpha_den}, 1)::BIGINT AS m
    FROM (SELECT gid, sid, n_stratum, n_cal, row_number() OVER (ORDER BY gid, sid) AS skey
          FROM (SELECT gid, sid, count(*) AS n_stratum,
                       (2 * {cal_num} * count(*) + {cal_den}) // (2 * {cal_den}) AS n_cal
                FROM units
                GROUP BY gid, sid))
),
units_h AS (
    SELECT u.gid, u.sid, s.skey, s.m, u.run_id, u.ukey, u.st, k.hs
    FROM units u
    JOIN split_keys k USING (ukey)
    JOIN strata s USING (gid, sid)
),
buckets AS (  -- bk = (skey * repeats + rep) * 256 + leading byte of h
    SELECT bk // ({repeats} * 256) AS skey, (bk // 256) % {repeats} AS rep, bk % 256 AS b, count(*) AS c
    FROM (SELECT (skey * {repeats} + rep) * 256 + (h >> 56)::BIGINT AS bk
          FROM (SELECT skey, unnest(range({repeats})) AS rep, unnest(hs) AS h FROM units_h))
    GROUP BY bk
),
cut_bucket AS (  -- the bucket holding the n_cal-th smallest key; `need` = its rank inside the bucket
    SELECT gid, sid, rep, b, n_cal - (cum - c) AS need
    FROM (
        SELECT st.gid, st.sid, bk.rep, bk.b, bk.c, st.n_cal,
               sum(bk.c) OVER (PARTITION BY bk.skey, bk.rep ORDER BY bk.b) AS cum
        FROM buckets bk
        JOIN strata st USING (skey)
    )
    WHERE cum >= n_cal AND cum - c < n_cal  -- no row when n_cal = 0: no calibration unit
),
cut_lists AS (  -- per stratum with calibration units: the cut bucket of every repeat, by repeat
    SELECT gid, sid, list(b ORDER BY rep) AS cbs FROM cut_bucket GROUP BY gid, sid
),
-- every (unit, repeat) in a bucket below the cut bucket is calibration; those in it are candidates.
-- Not materialized: each consumer streams it with its own filter, which costs about the CPU of
-- materializing its ~30% of the units x repeats rows once, without holding them in memory
cal_cand AS NOT MATERIALIZED (
    SELECT gid, sid, rep, st, m, h, b = cb AS amb,
           CASE WHEN b = cb THEN ukey END AS ukey, CASE WHEN b = cb THEN run_id END AS run_id
    FROM (
        SELECT *, h >> 56 AS b
        FROM (SELECT u.gid, u.sid, u.run_id, u.ukey, u.st, u.m, unnest(range({repeats})) AS rep,
                     unnest(u.hs) AS h, unnest(c.cbs) AS cb
              FROM units_h u JOIN cut_lists c USING (gid, sid))
    )
    WHERE b <= cb
),
cut AS (  -- inside the cut bucket the `need` smallest keys are calibration; the need-th is the cutoff
    SELECT a.gid, a.sid, a.rep, a.st, a.m, a.h, a.ukey, a.run_id, cb.need,
           row_number() OVER (PARTITION BY a.gid, a.sid, a.rep ORDER BY a.h, a.ukey, a.run_id) AS rn
    FROM cal_cand a
    JOIN cut_bucket cb USING (gid, sid, rep)
    WHERE a.amb
),
cut_keys AS (  -- per stratum: the cutoff key of every repeat, as lists by repeat
    SELECT gid, sid, list(h ORDER BY rep) AS cut_hs, list(ukey ORDER BY rep) AS cut_ukeys,
           list(run_id ORDER BY rep) AS cut_runs
    FROM cut
    WHERE rn = need
    GROUP BY gid, sid
),
thr AS (  -- n_cal per repeat is fixed: the sum of the strata's n_cal
    SELECT g.gid, r.range AS rep, g.n_cal,
           ((g.n_cal + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1) // {alpha_den} AS k_order
    FROM (SELECT gid, sum(n_cal)::BIGINT AS n_cal FROM strata GROUP BY gid) g
    CROSS JOIN range({repeats}) r
),
-- q_hat = the k-th smallest non-NULL calibration target score (NULL when k > their number n): the
-- (n - k + 1)-th largest, taken from the top (n_cal - k + 1) scores kept by a bounded heap (max(x, m),
-- m the same for every row of a group) instead of sorting all n_cal of them
cal_top AS (
    SELECT gid, rep, count(st) AS n_scores, max(st, m) AS top
    FROM (SELECT gid, rep, st, m FROM cal_cand WHERE NOT amb
          UNION ALL
          SELECT gid, rep, st, m FROM cut WHERE rn <= need)
    GROUP BY gid, rep
),
thr_q AS (
    SELECT t.gid, t.rep, t.n_cal, t.k_order::BIGINT AS k_order,
           CASE WHEN t.k_order <= c.n_scores THEN c.top[(c.n_scores - t.k_order + 1)::BIGINT] END AS q_hat
    FROM thr t
    LEFT JOIN cal_top c USING (gid, rep)
),
q_lists AS (
    SELECT gid, list(q_hat ORDER BY rep) AS qs, min(q_hat) AS q_lo, max(q_hat) AS q_hi
    FROM thr_q
    GROUP BY gid
),
-- per unit, what its set needs at any threshold in the group's [q_lo, q_hi]: the options at or below
-- q_lo (in every set) and the few between q_lo and q_hi (compared per repeat)
test_units AS (
    SELECT u.* EXCLUDE (ss), k.hs, c.cut_hs, c.cut_ukeys, c.cut_runs, q.qs, len(u.ss) AS n_ss,
           len(list_filter(u.ss, lambda x: x <= q.q_lo)) AS n_lo,
           list_filter(u.ss, lambda x: x > q.q_lo AND x <= q.q_hi) AS border
    FROM units u
    JOIN split_keys k USING (ukey)
    JOIN q_lists q USING (gid)
    LEFT JOIN cut_keys c USING (gid, sid)
    WHERE u.ss IS NOT NULL
),
-- test: key > the stratum's cutoff key (every unit when the stratum has no calibration unit), then
-- the set {{options with s <= q_hat}}
test_sets AS (
    SELECT * EXCLUDE (hs, cut_hs, cut_ukeys, cut_runs, qs, h, cut_h, cut_ukey, cut_run, border),
           CASE WHEN q_hat IS NULL THEN n_ss
                WHEN len(border) = 0 THEN n_lo
                ELSE n_lo + len(list_filter(border, lambda x: x <= q_hat)) END AS set_size,
           CASE WHEN q_hat IS NULL THEN st IS NOT NULL ELSE coalesce(st <= q_hat, false) END AS covered
    FROM (SELECT *, unnest(range({repeats})) AS rep, unnest(hs) AS h, unnest(cut_hs) AS cut_h,
                 unnest(cut_ukeys) AS cut_ukey, unnest(cut_runs) AS cut_run, unnest(qs) AS q_hat
          FROM test_units)
    WHERE cut_h IS NULL OR h > cut_h
       OR (h = cut_h AND (ukey > cut_ukey OR (ukey = cut_ukey AND run_id > cut_run)))
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
