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
-- The acceptance position is called `pos`, not `k`: `k` is a stratum column of cal_samples and the
-- two would clash when grouping by it.
WITH r AS (
    SELECT {by} used, cal_status, correct,
           (NOT correct)::INT                  AS err,
           row_number() OVER wo                AS pos,
           sum((NOT correct)::INT) OVER wr     AS e_incl,
           count(*) OVER wr                    AS k_incl,
           sum((NOT correct)::INT) OVER wt     AS e_b,
           count(*) OVER wt                    AS n_b,
           sum(correct::INT) OVER wg           AS n_c
    FROM cal_samples
    WINDOW wo AS (PARTITION BY {by} used ORDER BY confidence DESC),
           wr AS (PARTITION BY {by} used ORDER BY confidence DESC
                  RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
           wt AS (PARTITION BY {by} used, confidence),
           wg AS (PARTITION BY {by} used)
),
rk AS (
    SELECT *,
           CASE WHEN used THEN
                ((e_incl - e_b) + (pos - (k_incl - n_b)) * e_b::DOUBLE / n_b) / pos END AS risk_k,
           CASE WHEN used THEN
                CASE WHEN pos > n_c THEN (pos - n_c)::DOUBLE / pos ELSE 0.0 END END AS oracle_k
    FROM r
),
g AS (
    SELECT {by}
           count(*)                                               AS n_total,
           count(*) FILTER (WHERE used)                           AS n,
           count(*) FILTER (WHERE NOT used)                       AS n_excluded,
           count(*) FILTER (WHERE cal_status = 'unparsed')        AS n_unparsed,
           count(*) FILTER (WHERE cal_status = 'no_confidence')   AS n_no_confidence,
           count(*) FILTER (WHERE used AND NOT correct)           AS n_errors,
           avg(err::DOUBLE) FILTER (WHERE used)                   AS error_rate,
           avg(risk_k) FILTER (WHERE used)                        AS aurc,
           avg(oracle_k) FILTER (WHERE used)                      AS aurc_oracle
    FROM rk
    {group_by}
)
SELECT {by}
       n_total, n, n_excluded, n_unparsed, n_no_confidence, n_errors, error_rate,
       aurc,
       error_rate                                         AS aurc_random,
       aurc_oracle,
       aurc - aurc_oracle                                 AS e_aurc,
       CASE WHEN n_errors > 0 AND n_errors < n
            THEN (error_rate - aurc) / (error_rate - aurc_oracle) END AS prr
FROM g
ORDER BY ALL
