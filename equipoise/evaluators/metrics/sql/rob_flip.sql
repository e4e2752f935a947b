-- Flip analysis (seed 004 5.2, Table 3): each (base, perturbed) pair of rob_pairs is
--   stable_correct   (correct -> correct)   pool: initially correct
--   correct_to_wrong (correct -> wrong)     pool: initially correct
--   wrong_to_correct (wrong -> correct)     pool: initially wrong
--   stable_wrong     (wrong -> wrong)       pool: initially wrong
-- Per group and category: count, share of the group's pairs, mean baseline uncertainty (base-side
-- uncertainty; pairs with NULL uncertainty are counted but left out of the means) and its relative
-- difference from the pool mean: (mean_subset - mean_pool) / mean_pool (NULL when the pool mean is 0
-- or undefined). Every category appears for every group, with n = 0 when empty.
-- The means add each subset's values sorted (list_avg(list_sort(list(...)))), not with avg(): a
-- parallel avg adds doubles in thread order, so its last bits changed between runs at 1M
-- predictions; the sorted sum is the same whatever the threads, and costs little here (one row
-- per pair).
WITH p AS (
    SELECT *,
           CASE WHEN base_correct AND perturbed_correct THEN 'stable_correct'
                WHEN base_correct THEN 'correct_to_wrong'
                WHEN perturbed_correct THEN 'wrong_to_correct'
                ELSE 'stable_wrong' END AS cat
    FROM rob_pairs
),
g AS (
    SELECT {by}
           count(*)                                                                   AS n_pairs,
           count(*) FILTER (WHERE base_correct)                                       AS n_pool_c,
           count(*) FILTER (WHERE NOT base_correct)                                   AS n_pool_w,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE base_correct)))  AS u_pool_c,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE NOT base_correct))) AS u_pool_w,
           count(*) FILTER (WHERE cat = 'stable_correct')                             AS n_sc,
           count(*) FILTER (WHERE cat = 'correct_to_wrong')                           AS n_cw,
           count(*) FILTER (WHERE cat = 'wrong_to_correct')                           AS n_wc,
           count(*) FILTER (WHERE cat = 'stable_wrong')                               AS n_sw,
           count(base_uncertainty) FILTER (WHERE cat = 'stable_correct')              AS m_sc,
           count(base_uncertainty) FILTER (WHERE cat = 'correct_to_wrong')            AS m_cw,
           count(base_uncertainty) FILTER (WHERE cat = 'wrong_to_correct')            AS m_wc,
           count(base_uncertainty) FILTER (WHERE cat = 'stable_wrong')                AS m_sw,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE cat = 'stable_correct'))) AS u_sc,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE cat = 'correct_to_wrong'))) AS u_cw,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE cat = 'wrong_to_correct'))) AS u_wc,
           list_avg(list_sort(list(base_uncertainty) FILTER (WHERE cat = 'stable_wrong'))) AS u_sw
    FROM p
    {group_by}
),
long AS (
    SELECT {by} 1 AS ord, 'stable_correct' AS category, n_pairs, n_sc AS n, 'initially_correct' AS pool,
           n_pool_c AS n_pool, m_sc AS n_with_uncertainty, u_sc AS mean_uncertainty, u_pool_c AS pool_mean_uncertainty
    FROM g
    UNION ALL
    SELECT {by} 2, 'correct_to_wrong', n_pairs, n_cw, 'initially_correct', n_pool_c, m_cw, u_cw, u_pool_c FROM g
    UNION ALL
    SELECT {by} 3, 'wrong_to_correct', n_pairs, n_wc, 'initially_wrong', n_pool_w, m_wc, u_wc, u_pool_w FROM g
    UNION ALL
    SELECT {by} 4, 'stable_wrong', n_pairs, n_sw, 'initially_wrong', n_pool_w, m_sw, u_sw, u_pool_w FROM g
)
-- `ord` (the category's position) only orders the rows; robustness.py drops it
SELECT *,
       n / nullif(n_pairs, 0)                                                    AS share,
       (mean_uncertainty - pool_mean_uncertainty) / nullif(pool_mean_uncertainty, 0) AS relative_uncertainty
FROM long
ORDER BY ALL
