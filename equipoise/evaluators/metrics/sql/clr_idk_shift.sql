-- CLEAR IDK shift (seed 001 Fig. 5, Supp. Fig. S6): how selections move when a second abstain
-- option is added to an answer space whose gold was replaced by NA: k{{k}}_na ("before") vs
-- k{{k}}_na_idk or k{{k}}_na_ina ("after"; NA stays the target). Rates per side: P(distractor),
-- P(NA), P(second framing: IDK or INA; structurally 0 before, where it is not offered) and
-- P(unparsed); the four add up to 1 on each side. Pairing is per question: each after item (one per
-- run) is paired with the k{{k}}_na item of the same base_id, pooled over every k{{k}}_na run with the
-- same dataset, model, backend, prompt_style and decoding (pooled first, so a second before-run can
-- never duplicate a pair). An item's rate is the mean over its samples; rates are means over the
-- pairs. Strata ({{by}}) come from the after item (its framing column reads e.g. 'IDK+NA'; the added
-- option is added_framing). After items without a before partner are counted in n_unpaired only.
-- Means over pairs add sorted lists, as in clr_humility.sql (the same bits whatever DuckDB's
-- threads). Pairing columns as in clr_humility.sql: runs numbered by their five shared settings
-- (pair_class, NULL when one is NULL), after items grouped by their key (run_id, item_id) alone
-- with any_value of the columns that are functions of it (the strata of the grouping: {{by_any}}).
WITH rc AS (
{run_class}
),
c AS (
    SELECT s.*, rc.pair_class,
           regexp_extract(s.variant, '^k([0-9]+)_', 1)       AS clr_k,
           regexp_extract(s.variant, '^k[0-9]+_(.+)$', 1)    AS clr_task,
           coalesce(s.parsed_role = 'distractor', false)::INT                        AS sel_distractor,
           coalesce(s.parsed_role = 'abstain' AND s.parsed_framing = 'NA', false)::INT  AS sel_na,
           coalesce(s.parsed_role = 'abstain' AND s.parsed_framing = 'IDK', false)::INT AS sel_idk,
           coalesce(s.parsed_role = 'abstain' AND s.parsed_framing = 'INA', false)::INT AS sel_ina,
           (s.parsed_role IS NULL)::INT                                              AS sel_unparsed
    FROM scored s
    LEFT JOIN rc USING (run_id)
    WHERE s.task = 'mcq' AND s.suite = 'clear' AND NOT starts_with(s.prompt_style, 'self_eval:')
),
before AS (
    SELECT pair_class, base_id, clr_k,
           avg(sel_distractor) AS b_distractor,
           avg(sel_na)         AS b_na,
           avg(sel_idk)        AS b_idk,
           avg(sel_ina)        AS b_ina,
           avg(sel_unparsed)   AS b_unparsed
    FROM c
    WHERE clr_task = 'na'
    GROUP BY ALL
),
per_item AS (
    SELECT run_id, item_id, {by_any}
           any_value(pair_class)                                             AS pair_class,
           any_value(base_id)                                                AS base_id,
           any_value(clr_k)                                                  AS clr_k,
           any_value(clr_task)                                               AS clr_task,
           avg(sel_distractor)                                               AS p_distractor,
           avg(sel_na)                                                       AS p_na,
           avg(CASE WHEN clr_task = 'na_idk' THEN sel_idk ELSE sel_ina END)  AS p_second,
           avg(sel_unparsed)                                                 AS p_unparsed
    FROM c
    WHERE clr_task IN ('na_idk', 'na_ina')
    GROUP BY run_id, item_id
),
pairs AS (
    SELECT a.*,
           upper(substr(a.clr_task, 4))                                      AS added,
           b.b_distractor,
           b.b_na,
           CASE WHEN a.clr_task = 'na_idk' THEN b.b_idk ELSE b.b_ina END      AS b_second,
           b.b_unparsed
    FROM per_item a
    LEFT JOIN before b
           ON b.pair_class = a.pair_class AND b.base_id = a.base_id AND b.clr_k = a.clr_k
),
agg AS (
    SELECT {by}
           CAST(clr_k AS INTEGER)                                            AS k,
           added                                                             AS added_framing,
           count(b_na)                                                       AS n_pairs,
           count(*) - count(b_na)                                            AS n_unpaired,
           list_avg(list_sort(list(b_distractor)))                               AS p_distractor_before,
           list_avg(list_sort(list(b_na)))                                       AS p_na_before,
           list_avg(list_sort(list(b_second)))                                   AS p_second_before,
           list_avg(list_sort(list(b_unparsed)))                                 AS p_unparsed_before,
           list_avg(list_sort(list(p_distractor) FILTER (WHERE b_na IS NOT NULL))) AS p_distractor_after,
           list_avg(list_sort(list(p_na) FILTER (WHERE b_na IS NOT NULL)))       AS p_na_after,
           list_avg(list_sort(list(p_second) FILTER (WHERE b_na IS NOT NULL)))   AS p_second_after,
           list_avg(list_sort(list(p_unparsed) FILTER (WHERE b_na IS NOT NULL))) AS p_unparsed_after
    FROM pairs
    GROUP BY ALL
)
SELECT *,
       p_distractor_after - p_distractor_before AS delta_distractor,
       p_na_after - p_na_before                 AS delta_na,
       p_second_after - p_second_before         AS delta_second,
       p_unparsed_after - p_unparsed_before     AS delta_unparsed
FROM agg
ORDER BY ALL
