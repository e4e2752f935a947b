-- Binary Brier score of the confidence against correctness: mean over the used rows of
-- (confidence - 1[correct])^2. 0 is perfect; a constant 0.5 scores 0.25.
-- Read from cal_bins (cal_bins.sql, shared with ece and reliability): a group's rows split into its
-- bins (the used rows) and one row with bin NULL (the excluded rows), each bin with its row counts
-- and the exact fixed-point sums (units of 2^-90, HUGEINT) of the confidences (conf_fx) and of the
-- terms (brier_fx). Integer sums are exact in any order and grouping, so adding the bins' sums
-- gives the same integers, and the same bits, as summing the rows directly (a parallel avg() of
-- doubles adds in thread order, so its last bits varied), without a second scan of cal_samples.
-- accuracy is the bins' correct count over their rows (`correct` is never NULL: base_views.sql).
SELECT {by}
       coalesce(sum(n_b), 0)::BIGINT                                    AS n_total,
       coalesce(sum(n_b) FILTER (WHERE bin IS NOT NULL), 0)::BIGINT     AS n,
       coalesce(sum(n_b) FILTER (WHERE bin IS NULL), 0)::BIGINT         AS n_excluded,
       coalesce(sum(n_unparsed), 0)::BIGINT                             AS n_unparsed,
       coalesce(sum(n_no_confidence), 0)::BIGINT                        AS n_no_confidence,
       sum(correct_sum) FILTER (WHERE bin IS NOT NULL)
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)::BIGINT              AS accuracy,
       sum(conf_fx) FILTER (WHERE bin IS NOT NULL)::DOUBLE / (2::DOUBLE ^ 90)
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)::BIGINT              AS mean_confidence,
       sum(brier_fx) FILTER (WHERE bin IS NOT NULL)::DOUBLE / (2::DOUBLE ^ 90)
         / sum(n_b) FILTER (WHERE bin IS NOT NULL)::BIGINT              AS brier
FROM cal_bins
{group_by}
ORDER BY ALL
