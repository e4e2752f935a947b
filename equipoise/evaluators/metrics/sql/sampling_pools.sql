-- Per run x item, the pool of its prediction samples that sampling-based conformal sets score
-- (conformal_sampling / conformal_coverage_by with pool 'item', the default; see
-- conf_sampling_units.sql for the definitions): one row per run x item of `scored`, computed once
-- per store (a write-time fact, facts.py) instead of by every metrics pass grouping every sample.
-- Rendered by conformal.sampling_pools_sql ({strata}: every column a conformal metric may group,
-- stratify or report coverage by, and dataset_id).
--
-- Every column of `scored` a pool is grouped or stratified by comes from the sample's `runs` row
-- (keyed by run_id) or its `items` row (keyed by the run's dataset_id and config and the item_id):
-- constant over the samples of one run x item, so a pool 'item' is exactly one run x item and its
-- strata are those of any of its samples: they are joined from the pool's first sample (one join
-- of the narrow pool rows, about half the cost of carrying every stratum through the grouping).
--   m                 samples of the pool: ALL of them, unparsed, refusal and error included;
--   m_option          samples that chose an option;
--   n_targets         0 (no target id), 1 or 2 (several): only pools with exactly 1 are units;
--   target_option_id  the target's option identity;
--   hit               some sample chose the target;
--   n_options         distinct option identities of the item (`options`);
--   mv_correct        the majority vote is the target: the most chosen option, ties to the
--                     smallest option_id (string order); no vote at all counts as wrong;
--   ss                the score s = 1 - f = (m - c) / m (one rounding) of every option identity of
--                     the item: the chosen ones in option_id order, then 1.0 for each option no
--                     sample chose (NULL when the item has no options);
--   st                the target's score (NULL when the item has no options).
WITH pools AS (
    SELECT run_id, item_id, min(sample_index) AS first_sample, count(*) AS m,
           count(parsed_option_id) AS m_option,
           CASE WHEN min(target_option_id) IS NULL THEN 0
                WHEN min(target_option_id) = max(target_option_id) THEN 1 ELSE 2 END AS n_targets,
           min(target_option_id) AS target_option_id,
           coalesce(bool_or(parsed_option_id = target_option_id), false) AS hit,
           coalesce(list(parsed_option_id) FILTER (WHERE parsed_option_id IS NOT NULL), []) AS chosen
    FROM scored
    GROUP BY run_id, item_id
),
-- votes: the distinct chosen option ids sorted, and how many samples chose each (cs, aligned)
votes AS (
    SELECT *, opts[list_position(cs, list_max(cs))] AS mv_option_id,
           len(list_filter(chosen, lambda x: x = target_option_id)) AS c_target
    FROM (SELECT *, list_transform(opts, lambda d: len(list_filter(chosen, lambda x: x = d))) AS cs
          FROM (SELECT *, list_sort(list_distinct(chosen)) AS opts FROM pools))
),
item_options AS (
    SELECT dataset_id, config, item_id, count(DISTINCT option_id) AS n_options
    FROM options
    GROUP BY dataset_id, config, item_id
)
SELECT v.run_id, v.item_id, {strata}, v.m, v.m_option, v.n_targets, v.target_option_id, v.hit,
       io.n_options, coalesce(v.mv_option_id = v.target_option_id, false) AS mv_correct,
       CASE WHEN io.n_options IS NOT NULL THEN
           list_concat(list_transform(v.cs, lambda c: (v.m - c)::DOUBLE / v.m),
                       list_resize([]::DOUBLE[], io.n_options - len(v.cs), 1.0))
       END AS ss,
       CASE WHEN io.n_options IS NOT NULL THEN (v.m - v.c_target)::DOUBLE / v.m END AS st
FROM votes v
JOIN scored sc ON sc.run_id = v.run_id AND sc.item_id = v.item_id AND sc.sample_index = v.first_sample
LEFT JOIN item_options io ON io.dataset_id = sc.dataset_id AND io.config = sc.config AND io.item_id = v.item_id
