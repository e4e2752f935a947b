-- Binary Brier score of the confidence against correctness: mean over the used rows of
-- (confidence - 1[correct])^2. 0 is perfect; a constant 0.5 scores 0.25.
SELECT {by}
       count(*)                                                        AS n_total,
       count(*) FILTER (WHERE used)                                    AS n,
       count(*) FILTER (WHERE NOT used)                                AS n_excluded,
       count(*) FILTER (WHERE cal_status = 'unparsed')                 AS n_unparsed,
       count(*) FILTER (WHERE cal_status = 'no_confidence')            AS n_no_confidence,
       avg(correct::DOUBLE) FILTER (WHERE used)                        AS accuracy,
       -- doubles averaged over value-sorted lists: the same bits whatever the threads
       list_avg(list_sort(list(confidence) FILTER (WHERE used)))        AS mean_confidence,
       list_avg(list_sort(list((confidence - correct::DOUBLE) ^ 2) FILTER (WHERE used))) AS brier
FROM cal_samples
{group_by}
ORDER BY ALL
