-- Chance baseline (seed 001 Fig. 3a / Supp. Fig. S4-S5 "random chance"): the accuracy of a uniform
-- random choice among an item's options is 1 / n_options; per group its mean over the same sample
-- rows as the observed accuracy (unparsed samples count as wrong), so the two are comparable.
-- Restricted to MCQ items of the suite bound to $suite (param ``suite``; '*' for every MCQ suite).
-- The suite is a bound parameter, never pasted into the text, so no value can change the query.
-- The chance mean is the sum over the distinct option counts n of (rows with n) / n, over the rows:
-- an avg() of 1/n would add doubles such as 1/3 in thread order and could change the last bit
-- from run to run; integer counts per n, added in n order, cannot.
WITH g AS (
SELECT {by}
       count(*)                                             AS n,
       list_sum(list_transform(list_sort(map_entries(histogram(n_options))),
                               lambda e: e.value::DOUBLE / e.key)) / count(n_options)
                                                            AS chance_accuracy,
       avg(correct::INT)                                    AS accuracy,
       min(n_options)                                       AS min_options,
       max(n_options)                                       AS max_options,
       avg((parsed_role IS NULL)::INT)                      AS unparsed_rate
FROM scored
WHERE task = 'mcq' AND ($suite = '*' OR suite = $suite)
  AND NOT starts_with(prompt_style, 'self_eval:')
GROUP BY ALL
)
SELECT * EXCLUDE (min_options, max_options, unparsed_rate),
       accuracy - chance_accuracy AS accuracy_above_chance,
       min_options, max_options, unparsed_rate
FROM g
ORDER BY ALL
