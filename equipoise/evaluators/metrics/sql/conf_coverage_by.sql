-- conformal_coverage_by: thresholds are calibrated per group (as in the main metric); coverage and
-- set size of the TEST units are then reported per value of the `coverage_by` column. Pooled over
-- repeats: coverage = share of (repeat, test unit) pairs whose set holds the target (summed from the
-- per-repeat test sums of `test_rep`). The reported value of a unit's `cov` is the column itself,
-- or, where the units carry an integer code of it (conformal.py, `cov_keys`), the decoded value.
groups AS (
    SELECT DISTINCT gid, {by_list} FROM gkeys  -- the groups that have rows
)
SELECT {g_by} {cov_value} AS {cov_name},
       sum(ts.n) / {repeats} AS n_test_mean, count_if(ts.n > 0)::BIGINT AS repeats_with_test,
       sum(ts.cv)::DOUBLE / sum(ts.n) AS coverage, sum(ts.sz)::DOUBLE / sum(ts.n) AS set_size_mean,
       sum(ts.em)::DOUBLE / sum(ts.n) AS empty_rate{mask_check_col}
FROM test_rep ts
JOIN groups g USING (gid){cov_join}
GROUP BY {g_gid_by}, ts.cov
HAVING sum(ts.n) > 0
ORDER BY gid, {cov_value} NULLS LAST
