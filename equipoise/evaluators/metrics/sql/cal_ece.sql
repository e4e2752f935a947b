-- Expected calibration error with {n_bins} equal-width bins over [0, 1]. Bin b (0-based) holds the
-- used rows with b/{n_bins} <= confidence < (b+1)/{n_bins}; the last bin is closed, so confidence 1.0
-- is counted in it and 0.0 in the first (exact at the edges: see bin_sql in calibration.py).
-- ECE = sum_b (n_b / N) |acc_b - conf_b| over the non-empty bins, N = used rows;
-- MCE = max_b |acc_b - conf_b|. Excluded rows are counted, never binned.
-- The per-bin counts and means come from cal_bins (cal_bins.sql, shared with reliability and brier). Sums of
-- non-integer doubles over the bins add a value-sorted list (same bits whatever the threads).
SELECT {by}
       sum(n_b)::BIGINT                                                   AS n_total,
       coalesce(sum(n_b) FILTER (WHERE bin IS NOT NULL), 0)::BIGINT       AS n,
       coalesce(sum(n_b) FILTER (WHERE bin IS NULL), 0)::BIGINT           AS n_excluded,
       sum(n_unparsed)::BIGINT                                            AS n_unparsed,
       sum(n_no_confidence)::BIGINT                                       AS n_no_confidence,
       count(*) FILTER (WHERE bin IS NOT NULL)                            AS n_nonempty_bins,
       sum(correct_sum) FILTER (WHERE bin IS NOT NULL)
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)                        AS accuracy,
       list_sum(list_sort(list(conf_sum) FILTER (WHERE bin IS NOT NULL)))
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)                        AS mean_confidence,
       list_sum(list_sort(list(n_b * abs(acc_b - conf_b)) FILTER (WHERE bin IS NOT NULL)))
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)                        AS ece,
       max(abs(acc_b - conf_b)) FILTER (WHERE bin IS NOT NULL)            AS mce
FROM cal_bins
{group_by}
ORDER BY ALL
