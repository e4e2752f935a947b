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
-- How, without units x repeats rows: the calibration sums are aggregates of their own per repeat
-- over the unit rows (conformal.py writes one expression per repeat, e.g. count_if(<bit r set>)), so
-- one scan of the units gives the sums of every repeat side by side, and they are then turned into
-- one row per repeat. The thresholds of a group's repeats are joined to its units as columns q_0 ...
-- (one row per group). q_hat is read from the sorted scores of the units above a band floor (below). The
-- test sums are all units' sums minus the calibration units', grouped by slices of the mask words
-- (`test_slices`), plus one aggregate per repeat over the few units whose outcome differs between
-- repeats.
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
units_m AS (  -- the units with their calibration mask words and their group's m (m_top)
    {units_m_sql}
),
thr AS (
    SELECT g.gid, r.range AS rep, g.n_cal,
           ((g.n_cal + 1)::HUGEINT * ({alpha_den} - {alpha_num}) + {alpha_den} - 1) // {alpha_den} AS k_order
    FROM group_n g
    CROSS JOIN range({repeats}) r
),
-- q_hat = the k-th smallest non-NULL calibration target score (NULL when k > their number n): the
-- (n - k + 1)-th largest, read from the descending scores of the calibration units whose target
-- score is >= the group's band floor b, instead of sorting all n_cal of them. b: the lower edge of
-- the bucket (of {band_buckets} equal buckets of [0, 1]; scores below 0 in the first, at or above 1
-- and NaN in the last) that holds the T-th largest target score of the group, T = (m + WINDOW_SD
-- sqrt(m) + WINDOW_PAD) * N / n_cal, so that about m + a few sd of the units above b calibrate in
-- each repeat (NULL: fewer than T scores, no floor). Counted per bucket, not read from a sort of
-- every score (which took about a third of the thresholds' time): the bucket's other units only
-- widen the band a little. The band's units are
-- listed and sorted ONCE per group (score and mask words), and each repeat's list is that sorted
-- list filtered by the repeat's mask bit (still sorted): one aggregate per group, not one filtered
-- bounded heap (max(x, m)) per repeat, which cost about twice as much. Checked: where some repeat
-- has fewer than n - k + 1 calibration scores >= b, q_hat might lie below b, and that group's
-- q_hat are taken from heaps over all its units (cal_full: rare, m_top = m bounds them); so q_hat
-- never depends on b, only the speed does.
bands AS (
    SELECT g.gid,
           CASE WHEN g.n_cal > 0 THEN
               max(h.bucket) FILTER (WHERE h.above >= greatest(ceil((g.m + {win_sd} * sqrt(g.m) + {win_pad})
                                                                    * g.n_units / g.n_cal), 1))
           END / {band_buckets}.0 AS b
    FROM group_n g
    LEFT JOIN (  -- per bucket: the scores in it or above (above)
        SELECT gid, bucket, sum(c) OVER (PARTITION BY gid ORDER BY bucket DESC) AS above
        FROM (SELECT gid, CASE WHEN st >= 1 THEN {band_buckets} WHEN st > 0 THEN floor(st * {band_buckets})::INTEGER
                               ELSE 0 END AS bucket, count(*) AS c
              FROM units_m
              WHERE st IS NOT NULL
              GROUP BY gid, bucket)
    ) h USING (gid)
    GROUP BY g.gid, g.n_cal, g.m, g.n_units
),
cal_band AS (  -- the calibration units with a target score >= b: how many, and their scores, descending
    SELECT gid, rep, len(top) AS n_band, top
    FROM (SELECT gid, unnest(range({repeats})) AS rep, unnest({band_lists}) AS top
          FROM (SELECT u.gid, list_sort(list({band_row}), 'DESC') AS bl
                FROM units_m u
                JOIN bands bd USING (gid)
                WHERE u.st IS NOT NULL AND (bd.b IS NULL OR u.st >= bd.b)
                GROUP BY u.gid))
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
thr_own AS (
    SELECT t.gid, t.rep, t.n_cal, t.k_order::BIGINT AS k_order,
           CASE WHEN t.k_order <= c.n_scores THEN c.top[(c.n_scores - t.k_order + 1)::BIGINT] END AS q_hat
    FROM thr t
    LEFT JOIN cal_top c USING (gid, rep)
),
-- per group and repeat: n_cal, k and q_hat, computed above (thr_own), or read from a connection's
-- TEMP table holding thr_own's rows for the same units, mask, score and alpha (conformal.py,
-- ``_threshold_table``: LAC and coverage_by share them); then the CTEs above are not referenced,
-- and not run
thr_q AS (
    {thr_q_sql}
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
-- test: mask bit of the repeat clear; the set {{options with s <= q_hat}}. q_lo <= q_r <= q_hi in every
-- repeat, so most of a test unit's outcome is the same in every repeat: its set holds the options at
-- or below q_lo (n_lo) plus its few options in (q_lo, q_hi] that are <= q_r (`test_border`); it
-- covers the target in every repeat where st <= q_lo (cv_all), in none where st > q_hi or st is
-- NULL, and only st in (q_lo, q_hi] (cv_border) depends on the repeat; likewise it is empty in every
-- repeat where its smallest score mn > q_hi or it has no option (em_all), and only mn in (q_lo,
-- q_hi] (em_border) depends on the repeat.
-- bs: the unit's scores in (q_lo, q_hi] (NULL where it has none, most units), listed here once so
-- that `test_border` reads these few lists instead of filtering every unit's scores again.
-- (materialized: narrow rows, read by every slice below)
test_units AS MATERIALIZED (
    SELECT * EXCLUDE (ss, n_hi, q_lo, q_hi), coalesce(st <= q_lo, false) AS cv_all, coalesce(mn > q_hi, true) AS em_all,
           coalesce(st > q_lo AND st <= q_hi, false) AS cv_border,
           coalesce(mn > q_lo AND mn <= q_hi, false) AS em_border
    FROM (SELECT *, CASE WHEN n_hi > n_lo THEN list_filter(ss, lambda x: x > q_lo AND x <= q_hi) END AS bs
          FROM (SELECT u.gid, u.cov, u.st, u.ss, {mask_cols}{test_unit_cols},
                       {n_lo} AS n_lo, {n_hi} AS n_hi, list_min(u.ss) AS mn, q.q_lo, q.q_hi
                FROM units_m u
                JOIN q_cols q USING (gid)
                WHERE u.ss IS NOT NULL))
),
-- The repeat-independent sums over a repeat's test units = the sums over all units minus those over
-- its calibration units (mask bit set). Without an expression per repeat: the units are grouped by
-- each {slice_bits}-bit slice j of their mask words (slice value v), once per slice, summing the
-- per-unit counts; repeat r's calibration sums are then the sums of the slice rows of its slice
-- whose bit r % {slice_bits} is set (a few hundred rows per group, not one expression per unit and
-- repeat).
-- Integer sums only, so every repeat's counts are exactly those of a per-repeat count.
test_slices AS (
    {test_slices}
),
rep_bits AS (  -- repeat r: its slice j and bit b
    SELECT range AS rep, range // {slice_bits} AS j, range % {slice_bits} AS b FROM range({repeats})
),
test_tot AS (  -- the sums over all units (any one slice's rows hold every unit once)
    SELECT gid, cov, {slice_sums}
    FROM test_slices
    WHERE j = 0
    GROUP BY gid, cov
),
test_cal AS (  -- per repeat, the sums over its calibration units
    SELECT s.gid, s.cov, r.rep, {slice_sums}
    FROM test_slices s
    JOIN rep_bits r ON r.j = s.j AND (s.v >> r.b) & 1 = 1
    GROUP BY s.gid, s.cov, r.rep
),
-- the units whose coverage or emptiness depends on the repeat: one count per repeat
test_bu AS (
    SELECT gid, cov, unnest(range({repeats})) AS rep, unnest({bu_cv}) AS bcv, unnest({bu_em}) AS bem
    FROM (SELECT gid, cov, {bu_aggs}
          FROM test_units
          JOIN q_cols USING (gid)
          WHERE cv_border OR em_border
          GROUP BY gid, cov)
),
test_border AS (
    SELECT gid, cov, unnest(range({repeats})) AS rep, unnest({bd_list}) AS bd
    FROM (SELECT gid, cov, {border_aggs}
          FROM (SELECT u.gid, u.cov, {mask_cols}, q.* EXCLUDE (gid), unnest(u.bs) AS s
                FROM test_units u
                JOIN q_cols q USING (gid)
                WHERE u.bs IS NOT NULL)
          GROUP BY gid, cov)
),
-- per group, coverage_by value and repeat (a repeat without test units there has n = 0)
test_rep_own AS (
    SELECT t.gid, t.cov, r.rep, {test_rep_cols}
    FROM test_tot t
    CROSS JOIN rep_bits r  -- one row per repeat
    LEFT JOIN test_cal c ON c.gid = t.gid AND c.cov IS NOT DISTINCT FROM t.cov AND c.rep = r.rep
    LEFT JOIN test_bu bu ON bu.gid = t.gid AND bu.cov IS NOT DISTINCT FROM t.cov AND bu.rep = r.rep
    LEFT JOIN test_border bo ON bo.gid = t.gid AND bo.cov IS NOT DISTINCT FROM t.cov AND bo.rep = r.rep
),
-- test_rep_own's rows, or, for conformal_lac / plain APS, the sums over the coverage_by values of the
-- rows a coverage_by query kept for the same units, mask, score and alpha (conformal.py,
-- ``_test_rep_prefix``): integer counts, so the sums are exactly the per-group counts; or, over the
-- store's facts, the per-group table that numpy summed (conformal.py, ``_group_test_rep_table``);
-- the CTEs above are then not referenced, and not run
test_rep AS (
    {test_rep_sql}
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
