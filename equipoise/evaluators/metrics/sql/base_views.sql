-- Views every metric builds on. Created as TEMP views, so they also work on read-only stores.

-- One row per prediction sample (self-evaluation verdicts excluded), with its run, item strata,
-- the role of the parsed option and whether it hit the target. Unparseable and error rows stay (correct = false, parsed_role NULL).
CREATE OR REPLACE TEMP VIEW scored AS
SELECT p.run_id, p.item_id, p.sample_index, p.parsed_label, p.parse_method, p.outcome, p.raw_output,
       p.token_logprob_sum, p.token_logprob_mean, p.token_logprob_min, p.n_output_tokens, p.latency_ms,
       r.model, r.backend, r.prompt_style, r.dataset_id, r.config,
       i.base_id, i.task, i.suite, i.variant, i.target_label, i.target_role, i.has_gold,
       i.abstain_expected, i.n_options, i.k, i.framing, i.specialty, i.question_type,
       i.imaging_modality, i.difficulty, i.system_id, i.criterion_id, i.condition,
       o.role AS parsed_role, o.option_id AS parsed_option_id, o.framing AS parsed_framing,
       t.option_id AS target_option_id,
       coalesce(p.parsed_label = i.target_label, false) AS correct
FROM predictions p
JOIN runs r USING (run_id)
JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
JOIN options t ON t.dataset_id = r.dataset_id AND t.config = r.config AND t.item_id = p.item_id
              AND t.label = i.target_label
LEFT JOIN options o ON o.dataset_id = r.dataset_id AND o.config = r.config AND o.item_id = p.item_id
                   AND o.label = p.parsed_label
-- self-evaluation runs hold verdicts on another run's answers, not answers: they have their own
-- metric (self_eval_filtered_accuracy) and must not count as predictions anywhere else
WHERE NOT starts_with(r.prompt_style, 'self_eval:');

-- Option probabilities per sample: a softmax over the options that have a score. Options the
-- backend did not score (outside its top-k) are absent, not imputed; `covered` says how many
-- of the item's options were scored. The normaliser is summed over a list sorted by value, not by
-- a parallel sum: every probability is then the same double on every run (conformal sets and ties
-- at thresholds depend on exact values, and a parallel sum's order, hence its last bit, varies),
-- and the sorted order costs a cheap list sort instead of an ordered aggregate (label-ordered lists
-- took ~3x as long to build on a 1M-prediction store).
CREATE OR REPLACE TEMP VIEW option_probs AS
WITH g AS (
    SELECT run_id, item_id, sample_index, max(logprob) AS mx, count(*) AS covered, list(logprob) AS lps
    FROM option_scores
    GROUP BY run_id, item_id, sample_index
),
z AS (
    SELECT run_id, item_id, sample_index, mx, covered,
           list_sum(list_sort(list_transform(lps, lambda x: exp(x - mx)))) AS z
    FROM g
),
u AS (
    SELECT os.run_id, os.item_id, os.sample_index, os.label, exp(os.logprob - z.mx) / z.z AS prob, z.covered
    FROM option_scores os
    JOIN z USING (run_id, item_id, sample_index)
)
SELECT u.run_id, u.item_id, u.sample_index, u.label, o.option_id, o.role, u.prob, u.covered,
       i.n_options, u.label = i.target_label AS is_target
FROM u
JOIN runs r USING (run_id)
JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = u.item_id
JOIN options o ON o.dataset_id = r.dataset_id AND o.config = r.config AND o.item_id = u.item_id
              AND o.label = u.label
WHERE NOT starts_with(r.prompt_style, 'self_eval:');
