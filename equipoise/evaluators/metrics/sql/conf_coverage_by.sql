-- conformal_coverage_by: thresholds are calibrated per group (as in the main metric); coverage and
-- set size of the TEST units are then reported per value of the `coverage_by` column. Pooled over
-- repeats: coverage = share of (repeat, test unit) pairs whose set holds the target.
groups AS (
    SELECT DISTINCT gid, {by_list} FROM gkeys  -- the groups that have rows
)
SELECT {g_by} ts.cov AS {cov_name},
       count(*) / {repeats} AS n_test_mean, count(DISTINCT ts.rep)::BIGINT AS repeats_with_test,
       avg(ts.covered::INTEGER) AS coverage, avg(ts.set_size) AS set_size_mean,
       avg((ts.set_size = 0)::INTEGER) AS empty_rate
FROM test_sets ts
JOIN groups g USING (gid)
GROUP BY {g_gid_by}, ts.cov
ORDER BY gid, ts.cov NULLS LAST
