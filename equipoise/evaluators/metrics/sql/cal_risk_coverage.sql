-- Risk-coverage curve (selective prediction): the used rows of a group sorted by confidence,
-- highest first; one step per distinct confidence value t (equal confidences are accepted or
-- rejected together). Accepting every row with confidence >= t: n_accepted = rows accepted,
-- coverage = n_accepted / N, risk = errors among them / n_accepted (error = NOT correct). The last
-- row of a group has coverage 1 and risk = the group's error rate. Groups without used rows have no
-- rows; n_excluded = the group's excluded rows.
-- Internal aliases must not reuse a STRATA column name (the stratum `k` is a column of cal_samples):
-- a clash would silently shadow one of the two, so the running count is `n_acc`, not `k`.
WITH s AS (
    SELECT *, sum((NOT used)::INT) OVER (PARTITION BY {by_list}) AS n_excl
    FROM cal_samples
),
blocks AS (
    SELECT {by} confidence,
           count(*)                            AS n_b,
           count(*) FILTER (WHERE NOT correct) AS e_b,
           any_value(n_excl)                   AS n_excl
    FROM s
    WHERE used
    GROUP BY {by} confidence
),
cum AS (
    SELECT *,
           sum(n_b) OVER w                     AS n_acc,
           sum(e_b) OVER w                     AS errors,
           sum(n_b) OVER (PARTITION BY {by_list}) AS n_used
    FROM blocks
    WINDOW w AS (PARTITION BY {by_list} ORDER BY confidence DESC
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT {by}
       confidence                  AS threshold,
       n_b::BIGINT                 AS n_at_threshold,
       n_acc::BIGINT               AS n_accepted,
       errors::BIGINT              AS errors,
       n_used::BIGINT              AS n,
       n_acc / n_used              AS coverage,
       errors / n_acc              AS risk,
       n_excl::BIGINT              AS n_excluded
FROM cum
ORDER BY {by} n_accepted
