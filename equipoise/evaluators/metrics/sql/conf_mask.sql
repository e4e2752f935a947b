-- The calibration mask of split conformal: for every unit of `mask_units` (defined before this fragment: gid,
-- sid, run_id, ukey and any other columns, which are passed through) and every one of the {repeats} random
-- splits, whether the unit is calibration (bit set) or test. Composed by conformal.py (a list of CTEs, no
-- WITH); `unit_mask` is the result: the columns of `mask_units` but run_id and ukey, plus UBIGINT words m0,
-- m1, ... (bit r % 64 of word r // 64 = calibration in repeat r, so any number of repeats fits). It depends
-- on nothing but the units (group, stratum, run_id, unit key), the seed, the repeats and cal_fraction, never
-- on a score: conformal.py computes it once per connection and unit set and shares it between LAC, APS and
-- coverage_by when the base relations are fixed. Over a store's facts the option units' mask is selected by
-- numpy instead, a run of strata of up to conformal.NUMPY_MASK_CHUNK_UNITS units at a time (split_mask.py:
-- the same words, bit for bit).
--
-- Split (the definition): within each group (gid) and stratum (sid) the units are ordered by
-- (h, ukey, run_id), h = the split hash of the unit key in that repeat (SplitMix64 output rep + 1
-- seeded with the first 16 hex digits of md5('{seed}:<unit key>'), see conformal.py); the first
-- round_half_up(cal_fraction * N) are calibration, the rest test. cal_fraction = {cal_num}/{cal_den}.
--
-- How, without sorting units x repeats rows: md5 runs once per distinct unit key, the {repeats}
-- hashes are integer arithmetic on it (columns h_0, h_1, ...). The tie-break (ukey, run_id) is one
-- BIGINT uid (ukey's rank among the keys times the number of runs plus run_id's rank: the same order
-- as the two strings, compared as one integer). A stratum's calibration part is the set of units
-- whose key (h, uid) is <= its n_cal-th smallest key, so only that cutoff key is needed: the hashes
-- are uniform, so it lies in a narrow window of hash values around n_cal / N * 2**64; one scan of
-- the units counts, for every repeat, the keys below the window's ends and lists the keys inside it
-- (a few % of the stratum), whose sort gives the cutoff; the counts check the guess (where it
-- missed, only that stratum lists the keys of a widened window in a second scan), and a last scan
-- compares every unit's key with its stratum's cutoff of every repeat and packs the answers into
-- the words. Every per-repeat quantity is a column of its own (conformal.py writes one
-- expression per repeat), so no step makes units x repeats rows.
--
-- Measured in stop 24 and not kept, none cheaper (figures in benchmarks/RESULTS.md, issue 13, stop
-- 24): one window_cut per class of strata holding the same unit keys; narrower units with the
-- hashes joined by an integer key; units_h not materialized; other SplitMix64 forms; narrower windows.
-- Measured in stop 26 and not kept (1M predictions, one thread, this query ~0.59 CPU s): the words
-- as one comparison h_r <= ch_r per repeat, the few units tied with the cutoff's hash cleared by a
-- small join (0.115 -> 0.075 on a materialized units_h alone, no change in this query); the split
-- hashes fetched from per-repeat lists indexed by the item code (1.15 vs 0.11 for the join); the
-- window keys as rows of one filtered scan per repeat (0.24 with their sorts, before the counts, vs
-- 0.24 for window_cut); units_h not materialized, even joined by the integer key (0.75 vs 0.58).
split_keys AS (  -- the {repeats} split hashes of every distinct unit key (columns h_0, h_1, ...), its rank uk
    {split_keys_sql}
),
run_ids AS (  -- rk: the rank of run_id (0-based), nr: the number of runs
    SELECT run_id, row_number() OVER (ORDER BY run_id) - 1 AS rk, count(*) OVER () AS nr
    FROM (SELECT DISTINCT run_id FROM mask_units)
),
-- skey: one small integer per group x stratum; [lo, hi): a window of hash values expected to hold
-- the stratum's cutoff (the hashes are uniform on [0, 2**64): about n_cal of the N units lie below
-- n_cal / N * 2**64, give or take a binomial sd; the window is WINDOW_SD sd and WINDOW_PAD units
-- wide on each side, see conformal.py; hi NULL: no upper bound; lo <= hi, so the keys below hi are
-- those below lo plus those in the window, which is how `window_cut` counts them). Only a guess:
-- `windows` checks it against the real counts.
mask_strata AS (
    SELECT * REPLACE (CASE WHEN hi IS NOT NULL THEN greatest(hi, lo) END AS hi)
    FROM (SELECT *,
           CASE WHEN lo_c <= 0 THEN 0::UBIGINT
                ELSE least(lo_c / n_stratum * 18446744073709551616.0, 18446744073709549568.0)::UBIGINT
           END AS lo,
           CASE WHEN hi_c < n_stratum
                THEN least(hi_c / n_stratum * 18446744073709551616.0, 18446744073709549568.0)::UBIGINT
           END AS hi
    FROM (
        SELECT *, n_cal - {win_sd} * sd - {win_pad} AS lo_c, n_cal + {win_sd} * sd + {win_pad} AS hi_c
        FROM (SELECT gid, sid, n_stratum, n_cal, row_number() OVER (ORDER BY gid, sid) AS skey,
                     sqrt(n_cal * (n_stratum - n_cal) / n_stratum) AS sd
              FROM (SELECT gid, sid, count(*) AS n_stratum,
                           (2 * {cal_num} * count(*) + {cal_den}) // (2 * {cal_den}) AS n_cal
                    FROM mask_units
                    GROUP BY gid, sid))
    ))
),
-- the units with their hashes, uid and stratum; the strings run_id and ukey are dropped here: every
-- later step reads uid (materialized rows without them are much narrower)
units_h AS (
    SELECT u.* EXCLUDE (run_id, ukey), s.skey, k.* EXCLUDE (ukey, uk), k.uk * r.nr + r.rk AS uid
    FROM mask_units u
    JOIN split_keys k USING (ukey)
    JOIN run_ids r USING (run_id)
    JOIN mask_strata s USING (gid, sid)
),
-- per stratum and repeat, every repeat side by side in one scan of the units (lo and hi joined by skey here,
-- not carried on every materialized unit row): how many keys lie below lo, and the keys inside the guessed
-- window [lo, hi) (a few % of the stratum) as one UHUGEINT h * 2**64 + uid each (the same order as (h, uid)),
-- sorted; the keys below hi are the two counts together (lo <= hi)
window_cut AS (
    SELECT skey, {below},
           {window_lists}
    FROM units_h
    JOIN (SELECT skey, lo, hi FROM mask_strata) USING (skey)
    GROUP BY skey
),
-- the window of every repeat, checked: below lo there must be fewer than n_cal keys (else lo = 0),
-- below hi at least n_cal (else no upper bound), so the cutoff always lies in the window, and it is
-- the need-th smallest key there (need = n_cal - the keys below lo). ok_r: the guessed window held
-- it (its sorted keys are then the window's). Strata with n_cal = 0 have no cutoff (no calibration
-- unit).
windows AS (
    SELECT st.skey, {window_cols}
    FROM mask_strata st
    JOIN window_cut w USING (skey)
    WHERE st.n_cal > 0
),
-- strata where the guess missed in some repeat: the keys of the widened windows, listed and sorted
-- again from the units (rare: only speed depends on how often)
cut_missed AS (
    SELECT skey, {cut_aggs}
    FROM units_h
    JOIN (SELECT * FROM windows WHERE NOT ({all_ok})) USING (skey)
    GROUP BY skey
),
-- the need-th smallest key in the window, split back into the cutoff's hash ch_r and uid cu_r
cut_cols AS (
    SELECT skey, {cut_cols}
    FROM (SELECT w.skey, {cut_pick}
          FROM windows w
          JOIN window_cut d USING (skey)
          LEFT JOIN cut_missed m USING (skey))
),
-- per unit: calibration in repeat r iff (h_r, uid) <= (ch_r, cu_r); a stratum without calibration
-- units has no cutoff (NULL: every bit clear)
unit_mask AS (
    SELECT u.* EXCLUDE (skey, uid, {hash_names}), {mask_words}
    FROM units_h u
    LEFT JOIN cut_cols c USING (skey)
)
