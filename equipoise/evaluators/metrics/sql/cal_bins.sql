-- Per-bin sums of cal_samples per group, the shared first step of ece, reliability and brier: one
-- row per group and bin of {n_bins} equal-width bins over [0, 1] (bin b holds the used rows with
-- b/{n_bins} <= confidence < (b+1)/{n_bins}, the last bin closed at 1.0: bin_sql in calibration.py),
-- plus one row with bin NULL for the group's excluded rows. n_b rows, of which n_unparsed /
-- n_no_confidence by exclusion reason (only on the NULL bin), the mean confidence and accuracy of
-- the bin (conf_b, acc_b) and their sums. Empty bins have no row. The confidences (in [0, 1]) are
-- summed exactly in fixed point, as integers in units of 2^-90 (HUGEINT), then rounded once: a
-- parallel sum() of doubles adds in the order DuckDB's threads deliver the rows, so its last bits
-- varied; an integer sum is the same in any order, and costs about what sum() does (a value-sorted
-- list was 3-4x slower at 1M rows). A term's part below 2^-90 is dropped (not a visible bit of the
-- result unless every term is that small). The 0/1 correct sums are exact in any order anyway.
-- conf_fx and brier_fx are the bin's exact fixed-point sums themselves (HUGEINT, units of 2^-90) of
-- the confidences and of the Brier terms (confidence - 1[correct])^2: brier adds them over the
-- bins, which gives the very integers its own sums over the rows gave (integer addition is exact
-- in any grouping), so it reads these few rows instead of scanning cal_samples again.
-- conf_b and conf_sum are conf_fx as a double (one fixed-point sum, written once). Why shared:
-- ece, reliability and brier bin every row of a group the same way; on a connection with fixed
-- base relations calibration.py computes this once per (confidence, samples, by, n_bins) into a TEMP
-- table, and each metric aggregates its few rows per group. Names must not reuse a STRATA column.
CREATE OR REPLACE TEMP VIEW {view} AS
WITH b AS (
    SELECT *, CASE WHEN used THEN {bin_expr} END AS bin
    FROM cal_samples
)
SELECT * EXCLUDE (n_conf),
       conf_fx::DOUBLE / (2::DOUBLE ^ 90) / n_conf                 AS conf_b,
       conf_fx::DOUBLE / (2::DOUBLE ^ 90)                          AS conf_sum
FROM (
    SELECT {by} bin,
           count(*)                                               AS n_b,
           count(*) FILTER (WHERE unparsed)                       AS n_unparsed,
           count(*) FILTER (WHERE NOT used AND NOT unparsed)      AS n_no_confidence,
           count(confidence)                                      AS n_conf,
           avg(correct::DOUBLE)                                   AS acc_b,
           sum(correct::DOUBLE)                                   AS correct_sum,
           sum((confidence * (2::DOUBLE ^ 90))::HUGEINT)          AS conf_fx,
           sum(((confidence - correct::DOUBLE) ^ 2 * (2::DOUBLE ^ 90))::HUGEINT) AS brier_fx
    FROM b
    GROUP BY {by} bin
)
