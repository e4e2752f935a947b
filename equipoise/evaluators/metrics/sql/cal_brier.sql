-- Binary Brier score of the confidence against correctness: mean over the used rows of
-- (confidence - 1[correct])^2. 0 is perfect; a constant 0.5 scores 0.25.
SELECT {by}
       count(*)                                                        AS n_total,
       count(*) FILTER (WHERE used)                                    AS n,
       count(*) FILTER (WHERE NOT used)                                AS n_excluded,
       count(*) FILTER (WHERE unparsed)                                AS n_unparsed,
       count(*) FILTER (WHERE NOT used AND NOT unparsed)               AS n_no_confidence,
       avg(correct::DOUBLE) FILTER (WHERE used)                        AS accuracy,
       -- terms in [0, 1] summed exactly in fixed point (units of 2^-90, see cal_bins.sql): a parallel
       -- avg() of doubles adds in thread order, so its last bits varied
       sum((confidence * (2::DOUBLE ^ 90))::HUGEINT) FILTER (WHERE used)::DOUBLE / (2::DOUBLE ^ 90)
         / count(confidence) FILTER (WHERE used)                       AS mean_confidence,
       sum(((confidence - correct::DOUBLE) ^ 2 * (2::DOUBLE ^ 90))::HUGEINT) FILTER (WHERE used)::DOUBLE / (2::DOUBLE ^ 90)
         / count(confidence) FILTER (WHERE used)                       AS brier
FROM cal_samples
{group_by}
ORDER BY ALL
