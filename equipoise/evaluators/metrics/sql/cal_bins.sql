-- Per-bin sums of cal_samples per group, the shared first step of ece and reliability: one row per
-- group and bin of {n_bins} equal-width bins over [0, 1] (bin b holds the used rows with
-- b/{n_bins} <= confidence < (b+1)/{n_bins}, the last bin closed at 1.0: bin_sql in calibration.py),
-- plus one row with bin NULL for the group's excluded rows. n_b rows, of which n_unparsed /
-- n_no_confidence by exclusion reason (only on the NULL bin), the mean confidence and accuracy of
-- the bin (conf_b, acc_b) and their sums. Empty bins have no row. The confidences are summed over
-- a value-sorted list, not by a parallel sum()/avg() whose order (so last bit) follows the threads:
-- the same rows give the same bits (the 0/1 correct sums are exact in any order).
-- Why shared: both metrics bin every row of a group the same way; on a connection with fixed base
-- relations calibration.py computes this once per (confidence, samples, by, n_bins) into a TEMP
-- table, and each metric aggregates its few rows per group. Names must not reuse a STRATA column.
CREATE OR REPLACE TEMP VIEW {view} AS
WITH b AS (
    SELECT *, CASE WHEN used THEN {bin_expr} END AS bin
    FROM cal_samples
)
SELECT {by} bin,
       count(*)                                               AS n_b,
       count(*) FILTER (WHERE cal_status = 'unparsed')        AS n_unparsed,
       count(*) FILTER (WHERE cal_status = 'no_confidence')   AS n_no_confidence,
       list_sum(list_sort(list(confidence) FILTER (WHERE confidence IS NOT NULL)))
         / count(confidence)                                  AS conf_b,
       avg(correct::DOUBLE)                                   AS acc_b,
       list_sum(list_sort(list(confidence) FILTER (WHERE confidence IS NOT NULL))) AS conf_sum,
       sum(correct::DOUBLE)                                   AS correct_sum
FROM b
GROUP BY {by} bin
