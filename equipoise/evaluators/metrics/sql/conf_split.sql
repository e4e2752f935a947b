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
-- key, the {repeats} hashes are integer arithmetic on it. The tie-break (ukey, run_id) is one BIGINT
-- uid (ukey's rank among the keys times the number of runs plus run_id's rank: the same order as
-- the two strings, compared as one integer). A stratum's calibration part is the set of units whose
-- key (h, uid) is <= its n_cal-th smallest key, so only that cutoff key is needed: the hashes are
-- uniform, so it lies in a narrow window of hash values around n_cal / N * 2**64; one scan of the
-- units counts, for every repeat, the keys below the window's ends (checked, and widened where the
-- guess missed), and only the keys inside it (a few % of the stratum) go into a bounded heap. Two
-- streaming passes over all the units x repeats rows (unnested from per-unit lists, nothing of that
-- size is materialized): the keys in the window (heap), and the test rows (sets, summed per group
-- and repeat); a third only over the units whose target score lies above a band floor (checked
-- like the window), for q_hat's top-m heap. The units and the hashes are joined once (units_h), and
-- the passes carry integers, not the string keys.
split_keys AS (  -- the {repeats} split hashes of every distinct unit key (a list by repeat), its rank uk
    {split_keys_sql}
),
run_ids AS (  -- rk: the rank of run_id (0-based), nr: the number of runs
    SELECT run_id, row_number() OVER (ORDER BY run_id) - 1 AS rk, count(*) OVER () AS nr
    FROM (SELECT DISTINCT run_id FROM units)
),
-- skey: one small integer per group x stratum; m = n_cal - k + 1 of the group (at least 1): how many
-- of the largest calibration scores q_hat needs; [lo, hi): a window of hash values expected to hold
-- the stratum's cutoff (the hashes are uniform on [0, 2**64): about n_cal of the N units lie below
-- n_cal / N * 2**64, give or take a binomial sd; the window is WINDOW_SD sd and WINDOW_PAD units wide on each
-- side, see conformal.py;
-- hi NULL: no upper bound). Only a guess: `windows` checks it against the real counts.
strata AS (
    SELECT *,
           CASE WHEN lo_c <= 0 THEN 0::UBIGINT
                ELSE least(lo_c / n_stratum * 18446744073709551616.0, 18446744073709549568.0)::UBIGINT
           END AS lo,
           CASE WHEN hi_c < n_stratum
                THEN least(hi_c / n_stratum * 18446744073709551616.0, 18446744073709549568.0)::UBIGINT
           END AS hi
    FROM (
        SELECT *, n_cal - {win_sd} * sd - {win_pad} AS lo_c, n_cal + {win_sd} * sd + {win_pad} AS hi_c,
               greatest(sum(n_cal) OVER (PARTITION BY gid) + 1
                        - ((sum(n_cal) OVER (PARTITION BY gid) + 1)::HUGEINT * ({alpha_den} - {alpha_num})
                           + {alpha_den} - 1) // {alpha_den}, 1)::BIGINT AS m
        FROM (SELECT gid, sid, n_stratum, n_cal, row_number() OVER (ORDER BY gid, sid) AS skey,
                     sqrt(n_cal * (n_stratum - n_cal) / n_stratum) AS sd
              FROM (SELECT gid, sid, count(*) AS n_stratum,
                           (2 * {cal_num} * count(*) + {cal_den}) // (2 * {cal_den}) AS n_cal
                    FROM units
                    GROUP BY gid, sid))
    )
),
units_h AS (  -- the units with their hashes, uid and stratum: joined once, by every later step
    SELECT u.*, s.skey, s.m AS m_top, s.lo, s.hi, k.hs, k.uk * r.nr + r.rk AS uid
    FROM units u
    JOIN split_keys k USING (ukey)
    JOIN run_ids r USING (run_id)
    JOIN strata s USING (gid, sid)
),
-- per stratum and repeat: how many keys lie below lo and below hi (one count per repeat, side by
-- side, in one scan of the units)
window_counts AS (
    SELECT skey, {below_lo} AS c_lo, {below_hi} AS c_hi
    FROM units_h
    GROUP BY skey
),
-- the window of every repeat, checked: below lo there must be fewer than n_cal keys (else lo = 0),
-- below hi at least n_cal (else no upper bound), so the cutoff always lies in the window, and it is
-- the need-th smallest key there (need = n_cal - the keys below lo). Strata with n_cal = 0 have no
-- cutoff (no calibration unit).
windows AS (
    SELECT st.skey, st.gid, st.sid,
           list_transform(range(1, {repeats} + 1), lambda i: CASE WHEN w.c_lo[i] < st.n_cal THEN st.lo ELSE 0 END) AS los,
           list_transform(range(1, {repeats} + 1), lambda i: CASE WHEN w.c_hi[i] >= st.n_cal THEN st.hi END) AS his,
           list_transform(range(1, {repeats} + 1),
                          lambda i: (st.n_cal - CASE WHEN w.c_lo[i] < st.n_cal THEN w.c_lo[i] ELSE 0 END)::BIGINT) AS needs
    FROM strata st
    JOIN window_counts w USING (skey)
    WHERE st.n_cal > 0
),
-- the need-th smallest key (h, uid) in the window, as one UHUGEINT h * 2**64 + uid (same order), from
-- a bounded heap of the need smallest (no sort of the window's rows)
cut AS (
    SELECT skey, rep, min(hu, need::BIGINT)[need::BIGINT] AS cut_hu
    FROM (SELECT skey, rep, need, (h::UHUGEINT << 64) + uid::UHUGEINT AS hu
          FROM (SELECT u.skey, u.uid, unnest(range({repeats})) AS rep, unnest(u.hs) AS h,
                       unnest(w.los) AS lo, unnest(w.his) AS hi, unnest(w.needs) AS need
                FROM units_h u JOIN windows w USING (skey))
          WHERE h >= lo AND (hi IS NULL OR h < hi))
    GROUP BY skey, rep, need
),
cut_keys AS (  -- per stratum: the cutoff key of every repeat, as lists by repeat
    SELECT w.gid, w.sid, list((c.cut_hu >> 64)::UBIGINT ORDER BY c.rep) AS cut_hs,
           list((c.cut_hu & 18446744073709551615::UHUGEINT)::BIGINT ORDER BY c.rep) AS cut_uids
    FROM cut c
    JOIN windows w USING (skey)
    GROUP BY w.gid, w.sid
),
-- per unit: the cutoff keys of its stratum by repeat (NULL when the stratum has no calibration unit);
-- in repeat r it is calibration iff (hs[r], uid) <= (cut_hs[r], cut_uids[r]). Not materialized: a
-- join to a table of a few rows, cheaper redone by each consumer than a copy of every unit's lists
units_c AS NOT MATERIALIZED (
    SELECT u.*, c.cut_hs, c.cut_uids
    FROM units_h u
    LEFT JOIN cut_keys c USING (gid, sid)
),
thr AS (  -- n_cal per repeat is fixed: the sum of the strata's n_cal
    SELECT g.gid, r.range AS rep, g.n_cal,
           ((g.n_cal + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1) // {alpha_den} AS k_order
    FROM (SELECT gid, sum(n_cal)::BIGINT AS n_cal FROM strata GROUP BY gid) g
    CROSS JOIN range({repeats}) r
),
-- q_hat = the k-th smallest non-NULL calibration target score (NULL when k > their number n): the
-- (n - k + 1)-th largest, taken from the top (n_cal - k + 1) scores kept by a bounded heap (max(x, m),
-- m = m_top, the same for every row of a group) instead of sorting all n_cal of them. Only units
-- whose target score is >= the group's band floor b enter the heap: b = the T-th largest target
-- score of the group, T = (m + WINDOW_SD sqrt(m) + WINDOW_PAD) * N / n_cal, so that about m + a
-- few sd of the units above b calibrate in each repeat (NULL: no floor). Checked: where some
-- repeat has fewer than n - k + 1 calibration scores >= b, q_hat might lie below b, and that
-- group's heaps are rebuilt from all its units (cal_full).
bands AS (
    SELECT u.gid,
           CASE WHEN any_value(g.n_cal) > 0 THEN
               list_sort(list(u.st) FILTER (WHERE u.st IS NOT NULL), 'DESC')[
                   greatest(ceil((any_value(g.m) + {win_sd} * sqrt(any_value(g.m)) + {win_pad})
                                 * any_value(g.n_units) / any_value(g.n_cal)), 1)::BIGINT]
           END AS b
    FROM units_h u
    JOIN (SELECT gid, sum(n_cal) AS n_cal, sum(n_stratum) AS n_units, max(m) AS m FROM strata GROUP BY gid) g
        USING (gid)
    GROUP BY u.gid
),
cal_band AS (  -- the calibration units with a target score >= b: how many, and the heap
    SELECT gid, rep, count(*) AS n_band, max(st, m_top) AS top
    FROM (SELECT u.gid, u.m_top, u.st, u.uid, unnest(range({repeats})) AS rep, unnest(u.hs) AS h,
                 unnest(u.cut_hs) AS cut_h, unnest(u.cut_uids) AS cut_uid
          FROM units_c u
          JOIN bands bd USING (gid)
          WHERE u.cut_hs IS NOT NULL AND (bd.b IS NULL OR u.st >= bd.b))
    WHERE h < cut_h OR (h = cut_h AND uid <= cut_uid)
    GROUP BY gid, rep
),
cal_null AS (  -- calibration units without a target score: n = n_cal - these
    SELECT gid, rep, count(*) AS n_null
    FROM (SELECT gid, uid, unnest(range({repeats})) AS rep, unnest(hs) AS h, unnest(cut_hs) AS cut_h,
                 unnest(cut_uids) AS cut_uid
          FROM units_c
          WHERE cut_hs IS NOT NULL AND st IS NULL)
    WHERE h < cut_h OR (h = cut_h AND uid <= cut_uid)
    GROUP BY gid, rep
),
cal_est AS (
    SELECT t.gid, t.rep, t.k_order, t.n_cal - coalesce(cn.n_null, 0) AS n_scores, cb.n_band, cb.top
    FROM thr t
    LEFT JOIN cal_band cb USING (gid, rep)
    LEFT JOIN cal_null cn USING (gid, rep)
),
band_miss AS (  -- groups where some repeat's q_hat may lie below the band floor
    SELECT DISTINCT gid FROM cal_est WHERE k_order <= n_scores AND coalesce(n_band, 0) < n_scores - k_order + 1
),
cal_full AS (
    SELECT gid, rep, count(st) AS n_scores, max(st, m_top) AS top
    FROM (SELECT gid, m_top, st, uid, unnest(range({repeats})) AS rep, unnest(hs) AS h,
                 unnest(cut_hs) AS cut_h, unnest(cut_uids) AS cut_uid
          FROM units_c
          WHERE cut_hs IS NOT NULL AND gid IN (SELECT gid FROM band_miss))
    WHERE h < cut_h OR (h = cut_h AND uid <= cut_uid)
    GROUP BY gid, rep
),
cal_top AS (
    SELECT gid, rep, n_scores, top FROM cal_est WHERE gid NOT IN (SELECT gid FROM band_miss)
    UNION ALL
    SELECT gid, rep, n_scores, top FROM cal_full
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
    SELECT u.*, q.qs, len(u.ss) AS n_ss,
           len(list_filter(u.ss, lambda x: x <= q.q_lo)) AS n_lo,
           list_filter(u.ss, lambda x: x > q.q_lo AND x <= q.q_hi) AS border,
           len(list_filter(u.ss, lambda x: x > q.q_lo AND x <= q.q_hi)) = 0 AS no_border
    FROM units_c u
    JOIN q_lists q USING (gid)
    WHERE u.ss IS NOT NULL
),
-- test: key > the stratum's cutoff key (every unit when the stratum has no calibration unit), then
-- the set {{options with s <= q_hat}}; summed per group, coverage_by value and repeat: units,
-- covered units, empty sets and set sizes (a repeat without test units has no row)
test_sets AS (
    SELECT gid, cov, rep{test_unit_cols},
           CASE WHEN q_hat IS NULL THEN n_ss
                WHEN no_border THEN n_lo
                ELSE n_lo + len(list_filter(border, lambda x: x <= q_hat)) END AS set_size,
           CASE WHEN q_hat IS NULL THEN st IS NOT NULL ELSE coalesce(st <= q_hat, false) END AS covered
    FROM (SELECT *, unnest(range({repeats})) AS rep, unnest(hs) AS h, unnest(cut_hs) AS cut_h,
                 unnest(cut_uids) AS cut_uid, unnest(qs) AS q_hat
          FROM test_units)
    WHERE cut_h IS NULL OR h > cut_h OR (h = cut_h AND uid > cut_uid)
),
test_rep AS (
    SELECT gid, cov, rep, count(*) AS n, sum(set_size) AS sz, count_if(covered) AS cv,
           count_if(set_size = 0) AS em{test_extra}
    FROM test_sets
    GROUP BY gid, cov, rep
),
per_rep AS (  -- per group and repeat with test units: the means over its test units
    SELECT gid, rep, sum(n)::BIGINT AS n_test, sum(sz)::DOUBLE / sum(n) AS set_size,
           sum(cv)::DOUBLE / sum(n) AS coverage, sum(em)::DOUBLE / sum(n) AS empty_rate{per_rep_extra}
    FROM test_rep
    GROUP BY gid, rep
    HAVING sum(n) > 0
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
