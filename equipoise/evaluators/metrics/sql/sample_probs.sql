-- Per prediction sample, the facts of its option distribution (option_probs) that metrics read
-- once per sample: one row per sample with at least one scored option, computed once per store
-- (a write-time fact, facts.py) instead of by every metric that needs them.
--   n_scored     options scored and known to the item (the rows of option_probs for the sample);
--   brier_mc     sum over those options of (p_o - 1[o is the target])^2 (multi-class Brier term),
--                summed over a sorted list so that the double is the same on every run;
--   chosen_prob  probability of the parsed option (NULL when it was not scored or nothing parsed);
--   target_prob  probability of the target option (NULL when it was not scored);
--   lac_scores / aps_scores  the conformal nonconformity score (conformal.py) of EVERY option of
--                the item: for the scored ones, in ascending order of p, LAC 1 - p and APS
--                1 - (mass strictly below p, the ascending list summed in order, so the doubles
--                never vary); then 1.0 for each option of `options` the backend did not score
--                (p = 0: nothing below it);
--   lac_target / aps_target  the same score of the target option (1.0 when it was not scored).
-- Every value is per prediction: an aggregate over a run or a group never lives here.
WITH per AS (
    SELECT op.run_id, op.item_id, op.sample_index,
           any_value(sc.dataset_id) AS dataset_id, any_value(sc.config) AS config,
           count(*)                                                          AS n_scored,
           list_sum(list_sort(list((op.prob - op.is_target::DOUBLE) ^ 2)))   AS brier_mc,
           any_value(op.prob) FILTER (WHERE op.label = sc.parsed_label)      AS chosen_prob,
           any_value(op.prob) FILTER (WHERE op.is_target)                    AS target_prob,
           list_sort(list(op.prob))                                          AS ps
    FROM option_probs op
    JOIN scored sc ON sc.run_id = op.run_id AND sc.item_id = op.item_id AND sc.sample_index = op.sample_index
    GROUP BY op.run_id, op.item_id, op.sample_index
),
n_options AS (
    SELECT dataset_id, config, item_id, count(*) AS n_opt FROM options GROUP BY dataset_id, config, item_id
),
scores AS (
    SELECT p.*, list_resize([]::DOUBLE[], greatest(coalesce(no.n_opt, 0) - p.n_scored, 0), 1.0) AS unscored
    FROM per p
    LEFT JOIN n_options no ON no.dataset_id = p.dataset_id AND no.config = p.config AND no.item_id = p.item_id
)
SELECT run_id, item_id, sample_index, n_scored, brier_mc, chosen_prob, target_prob,
       list_concat(list_transform(ps, lambda o: 1.0 - o), unscored)                    AS lac_scores,
       CASE WHEN target_prob IS NOT NULL THEN 1.0 - target_prob ELSE 1.0 END            AS lac_target,
       list_concat(list_transform(ps, lambda o: 1.0 - coalesce(list_sum(list_filter(ps, lambda y: y < o)), 0.0)),
                   unscored)                                                           AS aps_scores,
       CASE WHEN target_prob IS NOT NULL
            THEN 1.0 - coalesce(list_sum(list_filter(ps, lambda y: y < target_prob)), 0.0)
            ELSE 1.0 END                                                               AS aps_target
FROM scores
