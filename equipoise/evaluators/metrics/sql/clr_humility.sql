-- CLEAR humility deficit (seed 001 Methods "Perturbation and Evaluation protocol", Fig. 3, Supp.
-- Fig. S4): accuracy on k{{k}}_gold minus the abstention rate on k{{k}}_{{na|idk|ina}} (gold replaced by
-- that abstain option, which is the target). Pairing is per question: each abstention item (one per
-- run) is paired with the k{{k}}_gold item of the same base_id, pooled over every gold run with the
-- same dataset, model, backend, prompt_style and decoding (pooling first means a second gold run, e.g.
-- another template of the same style, can never duplicate a pair). An item's value is the mean over
-- its samples; rates are means over the pairs. Strata ({{by}}) come from the abstention-side item.
-- Abstention items without a gold partner are counted in n_unpaired and left out of every rate.
-- Rates over pairs add each subset's per-item values sorted (list_avg(list_sort(list(...)))), not
-- with avg(), whose parallel sum of doubles could change the last bit from run to run (an item's
-- value is a ratio such as 1/3). Unparsed samples (no valid option: unparseable, error, free-text
-- refusal, unknown letter) count as neither target nor distractor and are reported per side.
-- The five run settings a pair must share (dataset_id, model, backend, prompt_style, decoding_json)
-- are columns of `runs`, so they are numbered once over the few runs (pair_class; NULL when one is
-- NULL, which `=` never matches either) and items pair on (pair_class, base_id, clr_k). An item of
-- the abstention side is grouped by its key (run_id, item_id) alone: its pairing columns and the
-- strata of the grouping ({{by_any}}) are functions of that key (runs' primary key run_id, items'
-- primary key (dataset_id, config, item_id)), so any_value reads the one value each has and no
-- stratum the grouping does not name is read at all.
WITH rc AS (
{run_class}
),
c AS (
    SELECT s.*, rc.pair_class,
           regexp_extract(s.variant, '^k([0-9]+)_', 1)       AS clr_k,
           regexp_extract(s.variant, '^k[0-9]+_(.+)$', 1)    AS clr_task
    FROM scored s
    LEFT JOIN rc USING (run_id)
    WHERE s.task = 'mcq' AND s.suite = 'clear' AND NOT starts_with(s.prompt_style, 'self_eval:')
),
gold AS (
    SELECT pair_class, base_id, clr_k,
           avg(correct::INT)                                              AS gold_p_target,
           avg((parsed_role IS NULL)::INT)                                AS gold_p_unparsed
    FROM c
    WHERE clr_task = 'gold'
    GROUP BY ALL
),
per_item AS (
    SELECT run_id, item_id, {by_any}
           any_value(pair_class)                                          AS pair_class,
           any_value(base_id)                                             AS base_id,
           any_value(clr_k)                                               AS clr_k,
           any_value(clr_task)                                            AS clr_task,
           avg(correct::INT)                                              AS p_target,
           avg(coalesce(parsed_role = 'distractor', false)::INT)          AS p_distractor,
           avg((parsed_role IS NULL)::INT)                                AS p_unparsed
    FROM c
    WHERE clr_task IN ('na', 'idk', 'ina')
    GROUP BY run_id, item_id
),
pairs AS (
    SELECT a.*, g.gold_p_target, g.gold_p_unparsed
    FROM per_item a
    LEFT JOIN gold g
           ON g.pair_class = a.pair_class AND g.base_id = a.base_id AND g.clr_k = a.clr_k
)
SELECT * EXCLUDE (incorrect_selection_rate, unparsed_rate_gold, unparsed_rate_abstain),
       accuracy - abstention_rate                                         AS humility_deficit,
       incorrect_selection_rate, unparsed_rate_gold, unparsed_rate_abstain
FROM (
SELECT {by}
       CAST(clr_k AS INTEGER)                                             AS k,
       upper(clr_task)                                                    AS framing,
       count(gold_p_target)                                               AS n_pairs,
       count(*) - count(gold_p_target)                                    AS n_unpaired,
       list_avg(list_sort(list(gold_p_target)))                           AS accuracy,
       list_avg(list_sort(list(p_target) FILTER (WHERE gold_p_target IS NOT NULL)))
                                                                          AS abstention_rate,
       list_avg(list_sort(list(p_distractor) FILTER (WHERE gold_p_target IS NOT NULL)))
                                                                          AS incorrect_selection_rate,
       list_avg(list_sort(list(gold_p_unparsed)))                         AS unparsed_rate_gold,
       list_avg(list_sort(list(p_unparsed) FILTER (WHERE gold_p_target IS NOT NULL)))
                                                                          AS unparsed_rate_abstain
FROM pairs
GROUP BY ALL
)
ORDER BY ALL
