-- Split conformal over `units` (defined before this fragment: one row per unit with gid, sid, run_id,
-- ukey, cov, the scores ss of all its candidate options and the target's score st), repeated over
-- {repeats} random calibration / test splits. Composed by conformal.py (a list of CTEs, no WITH).
--
-- Split: which units calibrate in which repeat is the calibration mask of `conf_mask.sql` (its
-- header holds the definition): per unit, bit r of the UBIGINT words m0, m1, ... is set iff the unit
-- is calibration in repeat r. It depends on the units, not on the score, so conformal.py computes it
-- once per connection and unit set (a TEMP table, shared by LAC, APS and coverage_by) or inline.
-- Threshold: q_hat = the k-th smallest calibration score of the target, k = ceil((n+1)(1-alpha))
-- with alpha = {alpha_num}/{alpha_den}, in integer arithmetic; k > n gives NULL q_hat = full sets.
--
-- How, without units x repeats rows: every per-repeat sum is its own aggregate over the unit rows
-- (conformal.py writes one expression per repeat, e.g. count_if(<bit r clear> AND st <= q_r)), so one
-- scan of the units gives the sums of every repeat side by side, and they are then turned into one
-- row per repeat. The thresholds of a group's repeats are joined to its units as columns q_0 ...
-- (one row per group). q_hat keeps the bounded heap over the units above a band floor (below).
strata AS (  -- n_cal per group x stratum: fixed, the same in every repeat
    SELECT gid, sid, count(*) AS n_stratum, (2 * {cal_num} * count(*) + {cal_den}) // (2 * {cal_den}) AS n_cal
    FROM units
    GROUP BY gid, sid
),
-- per group: n_cal, the units N, and m = n_cal - k + 1 (at least 1): how many of the largest
-- calibration scores q_hat needs
group_n AS (
    SELECT gid, sum(n_cal)::BIGINT AS n_cal, sum(n_stratum)::BIGINT AS n_units,
           greatest(sum(n_cal) + 1 - ((sum(n_cal) + 1)::HUGEINT * ({alpha_den} - {alpha_num})
                                      + {alpha_den} - 1) // {alpha_den}, 1)::BIGINT AS m
    FROM strata
    GROUP BY gid
),
units_m AS (  -- the units with their calibration mask words and their group's heap size m_top
    {units_m_sql}
),
thr AS (
    SELECT g.gid, r.range AS rep, g.n_cal,
           ((g.n_cal + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1) // {alpha_den} AS k_order
    FROM group_n g
    CROSS JOIN range({repeats}) r
),
-- q_hat = the k-th smallest non-NULL calibration target score (NULL when k > their number n): the
-- (n - k + 1)-th largest, taken from the top (n_cal - k + 1) scores kept by a bounded heap (max(x, m),
-- m = m_top, the same for every row of a group) instead of sorting all n_cal of them. Only units
-- whose target score is >= the group's band floor b enter the heaps: b = the T-th largest target
-- score of the group, T = (m + WINDOW_SD sqrt(m) + WINDOW_PAD) * N / n_cal, so that about m + a
-- few sd of the units above b calibrate in each repeat (NULL: no floor). Checked: where some
-- repeat has fewer than n - k + 1 calibration scores >= b, q_hat might lie below b, and that
-- group's heaps are rebuilt from all its units (cal_full). One heap per repeat, side by side, each
-- fed the rows whose mask bit of that repeat is set.
bands AS (
    SELECT u.gid,
           CASE WHEN any_value(g.n_cal) > 0 THEN
               list_sort(list(u.st) FILTER (WHERE u.st IS NOT NULL), 'DESC')[
                   greatest(ceil((any_value(g.m) + {win_sd} * sqrt(any_value(g.m)) + {win_pad})
                                 * any_value(g.n_units) / any_value(g.n_cal)), 1)::BIGINT]
           END AS b
    FROM units_m u
    JOIN group_n g USING (gid)
    GROUP BY u.gid
),
cal_band AS (  -- the calibration units with a target score >= b: how many, and the heap
    SELECT gid, unnest(range({repeats})) AS rep, unnest({band_n}) AS n_band, unnest({band_top}) AS top
    FROM (SELECT u.gid, {band_aggs}
          FROM units_m u
          JOIN bands bd USING (gid)
          WHERE bd.b IS NULL OR u.st >= bd.b
          GROUP BY u.gid)
),
cal_null AS (  -- calibration units without a target score: n = n_cal - these
    SELECT gid, unnest(range({repeats})) AS rep, unnest({null_n}) AS n_null
    FROM (SELECT gid, {null_aggs} FROM units_m WHERE st IS NULL GROUP BY gid)
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
    SELECT gid, unnest(range({repeats})) AS rep, unnest({full_n}) AS n_scores, unnest({full_top}) AS top
    FROM (SELECT gid, {full_aggs}
          FROM units_m
          WHERE gid IN (SELECT gid FROM band_miss)
          GROUP BY gid)
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
-- one row per group: the thresholds of its repeats as columns q_0 ... (NULL q_hat = the full set:
-- +infinity, above every score), and their range [q_lo, q_hi]
q_cols AS (
    SELECT gid, {q_cols}, coalesce(q_lo, 'infinity'::DOUBLE) AS q_lo,
           CASE WHEN n_null > 0 THEN 'infinity'::DOUBLE ELSE q_hi END AS q_hi
    FROM (SELECT gid, list(q_hat ORDER BY rep) AS qs, min(q_hat) AS q_lo, max(q_hat) AS q_hi,
                 count_if(q_hat IS NULL) AS n_null
          FROM thr_q
          GROUP BY gid)
),
-- test: mask bit of the repeat clear; the set {{options with s <= q_hat}}. Per test unit its size is
-- the options at or below q_lo (n_lo, in every repeat's set) plus its few options in (q_lo, q_hi]
-- that are <= q_r (`test_border`); it is empty iff its smallest score exceeds q_r (or it has no
-- option). Summed per group and coverage_by value, every repeat side by side: units, covered units,
-- empty sets, set sizes
-- (materialized: narrow rows, so that n_lo and mn are computed once, not once per repeat's expression)
test_units AS MATERIALIZED (
    SELECT u.gid, u.cov, u.st, {mask_cols}{test_unit_cols}, len(list_filter(u.ss, lambda x: x <= q.q_lo)) AS n_lo,
           list_min(u.ss) AS mn
    FROM units_m u
    JOIN q_cols q USING (gid)
    WHERE u.ss IS NOT NULL
),
test_wide AS (
    SELECT gid, cov, {test_aggs}
    FROM test_units
    JOIN q_cols USING (gid)
    GROUP BY gid, cov
),
test_border AS (
    SELECT gid, cov, {border_aggs}
    FROM (SELECT u.gid, u.cov, {mask_cols}, q.* EXCLUDE (gid),
                 unnest(list_filter(u.ss, lambda x: x > q.q_lo AND x <= q.q_hi)) AS s
          FROM units_m u
          JOIN q_cols q USING (gid)
          WHERE u.ss IS NOT NULL AND q.q_lo < q.q_hi)
    GROUP BY gid, cov
),
-- per group, coverage_by value and repeat (a repeat without test units there has n = 0)
test_rep AS (
    SELECT w.gid, w.cov, unnest(range({repeats})) AS rep, {test_unnest}
    FROM test_wide w
    LEFT JOIN test_border b ON b.gid = w.gid AND b.cov IS NOT DISTINCT FROM w.cov
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
