-- Per prediction sample, the facts of its option distribution (option_probs) that metrics read
-- once per sample: one row per sample with at least one scored option, computed once per store
-- (a write-time fact, facts.py) instead of by every metric that needs them.
--   n_scored     options scored and known to the item (the rows of option_probs for the sample);
--   brier_mc     sum over those options of (p_o - 1[o is the target])^2 (multi-class Brier term),
--                summed over a sorted list so that the double is the same on every run;
--   chosen_prob  probability of the parsed option (NULL when it was not scored or nothing parsed);
--   target_prob  probability of the target option (NULL when it was not scored).
-- Every value is per prediction: an aggregate over a run or a group never lives here.
SELECT op.run_id, op.item_id, op.sample_index,
       count(*)                                                          AS n_scored,
       list_sum(list_sort(list((op.prob - op.is_target::DOUBLE) ^ 2)))   AS brier_mc,
       any_value(op.prob) FILTER (WHERE op.label = sc.parsed_label)      AS chosen_prob,
       any_value(op.prob) FILTER (WHERE op.is_target)                    AS target_prob
FROM option_probs op
JOIN scored sc ON sc.run_id = op.run_id AND sc.item_id = op.item_id AND sc.sample_index = op.sample_index
GROUP BY op.run_id, op.item_id, op.sample_index
