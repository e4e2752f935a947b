-- Chance baseline (seed 001 Fig. 3a / Supp. Fig. S4-S5 "random chance"): the accuracy of a uniform
-- random choice among an item's options is 1 / n_options; per group its mean over the same sample
-- rows as the observed accuracy (unparsed samples count as wrong), so the two are comparable.
-- Restricted to MCQ items of the suite bound to $suite (param ``suite``; '*' for every MCQ suite).
-- The suite is a bound parameter, never pasted into the text, so no value can change the query.
SELECT {by}
       count(*)                                             AS n,
       avg(1.0::DOUBLE / n_options)                         AS chance_accuracy,
       avg(correct::INT)                                    AS accuracy,
       avg(correct::INT) - avg(1.0::DOUBLE / n_options)     AS accuracy_above_chance,
       min(n_options)                                       AS min_options,
       max(n_options)                                       AS max_options,
       avg((parsed_role IS NULL)::INT)                      AS unparsed_rate
FROM scored
WHERE task = 'mcq' AND ($suite = '*' OR suite = $suite)
  AND NOT starts_with(prompt_style, 'self_eval:')
GROUP BY ALL
ORDER BY ALL
