-- Per run x item, the pool of its prediction samples that sampling-based conformal sets score
-- (conformal_sampling / conformal_coverage_by with pool 'item', the default; see
-- conf_sampling_units.sql for the definitions): one row per run x item of `scored`, computed once
-- per store (a write-time fact, facts.py) instead of by every metrics pass grouping every sample.
-- Rendered by conformal.sampling_pools_sql ({strata}: every column a conformal metric may group,
-- stratify or report coverage by, and dataset_id; the pool aggregates, votes and scores are the
-- same fragments of conformal.py that conf_sampling_units.sql renders).
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
    SELECT run_id, item_id, min(sample_index) AS first_sample, {pool_aggregates}
    FROM scored
    GROUP BY run_id, item_id
),
-- votes: the distinct chosen option ids sorted, and how many samples chose each (cs, aligned)
votes AS (
    {pool_votes}
),
item_options AS (
    {item_options}
)
SELECT v.run_id, v.item_id, {strata}, v.m, v.m_option, v.n_targets, v.target_option_id, v.hit,
       io.n_options, {pool_outcome}
FROM votes v
JOIN scored sc ON sc.run_id = v.run_id AND sc.item_id = v.item_id AND sc.sample_index = v.first_sample
LEFT JOIN item_options io ON io.dataset_id = sc.dataset_id AND io.config = sc.config AND io.item_id = v.item_id
