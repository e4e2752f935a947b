-- Area under the risk-coverage curve (AURC) and the prediction-rejection ratio (PRR) per group.
-- Over the N used rows, sorted by confidence (highest first), with E errors (NOT correct) and
-- C = N - E correct rows:
--   AURC = (1/N) sum over k = 1..N of risk(k),  risk(k) = errors among the k most confident rows / k
-- (the discrete definition of Geifman et al.). Where confidences tie, the order inside a tie block
-- is unspecified, so risk(k) takes its expectation over a uniformly random order of the block: with
-- K rows and E_K errors ranked strictly above the block, and n_b rows / e_b errors in it, the j-th
-- row of the block has risk (E_K + j e_b / n_b) / (K + j). AURC is then the mean AURC over all
-- tie-breaks; a constant confidence gives exactly the error rate.
--   aurc_random = E / N: the expected AURC of a uniformly random order (E[errors in top k] = k E / N
--                 for every k), i.e. the error rate, computed exactly, not by simulation;
--   aurc_oracle = (1/N) sum over k = C+1..N of (k - C) / k = (E - C (H_N - H_C)) / N, H_m the m-th
--                 harmonic number: all errors rejected first (the minimum AURC over orders);
--   e_aurc      = aurc - aurc_oracle (excess AURC);
--   prr         = (aurc_random - aurc) / (aurc_random - aurc_oracle): 1 = oracle ordering, 0 = no
--                 better than random, < 0 worse; NULL when the used rows hold only one class.
-- Computed per tie block (cal_blocks, see cal_blocks.sql: n_b rows and e_b errors per distinct
-- confidence, with K = k_before and E_K = e_before): a block adds sum over j = 1..n_b of
-- (E_K + j e_b / n_b) / (K + j) to the sum of risk(k) (one term when n_b = 1, the common case with
-- continuous confidences): the same terms as a row-by-row window, without ranking every row. The
-- oracle's sum over k = C+1..N of (k - C) / k is summed term by term, as exact as the row form.
-- Names must not reuse a STRATA column (`k` is a stratum column of cal_samples), hence the lambda
-- variables j and q. The block terms (each in [0, n_b]) are summed exactly in fixed point, integers
-- in units of 2^-90 (see cal_bins.sql), not by a parallel sum() whose order (so last bit) follows
-- DuckDB's threads: the same rows give the same bits.
WITH g AS (
    SELECT {by}
           {block_counts},
           coalesce(sum(e_b) FILTER (WHERE used), 0)::BIGINT AS n_errors,
           -- only the used blocks are computed: an excluded one may divide 0 by 0, and NaN has no integer
           sum((CASE WHEN NOT used THEN NULL
                     WHEN n_b = 1 THEN (e_before + e_b)::DOUBLE / (k_before + 1)
                     ELSE list_sum(list_transform(range(1, n_b + 1),
                                   lambda j: (e_before + j * e_b::DOUBLE / n_b) / (k_before + j))) END
                * (2::DOUBLE ^ 90))::HUGEINT)::DOUBLE / (2::DOUBLE ^ 90) AS risk_sum
    FROM cal_blocks
    {group_by}
),
o AS (
    SELECT *,
           n_errors / nullif(n, 0)                                   AS error_rate,
           risk_sum / nullif(n, 0)                                   AS aurc,
           CASE WHEN n > 0 THEN
                coalesce(list_sum(list_transform(range(n - n_errors + 1, n + 1),
                                  lambda q: (q - (n - n_errors))::DOUBLE / q)), 0.0) / n END AS aurc_oracle
    FROM g
)
SELECT {by}
       n_total, n, n_excluded, n_unparsed, n_no_confidence, n_errors, error_rate,
       aurc,
       error_rate                                         AS aurc_random,
       aurc_oracle,
       aurc - aurc_oracle                                 AS e_aurc,
       CASE WHEN n_errors > 0 AND n_errors < n
            THEN (error_rate - aurc) / (error_rate - aurc_oracle) END AS prr
FROM o
ORDER BY ALL
