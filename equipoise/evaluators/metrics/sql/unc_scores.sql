-- Per-item uncertainty scores: one row per (run_id, item_id), higher = more uncertain unless the
-- column says confidence. Single-pass scores read sample 0; consistency scores (SC, SE, PRO) read
-- every sample of the item's pool: the item itself (pool 'item') or every item of the run that
-- shares its base_id (pool 'base': the shuffled permutations of one question, seed 002 4.3).
-- Answers are clustered by option identity (parsed_option_id), never by letter, so a shuffled
-- option keeps its cluster; samples without an option (unparsed, refusal, error) share one
-- '(no answer)' cluster. Nothing is dropped: a score that cannot be computed is NULL.
-- Templated by equipoise.evaluators.metrics.uncertainty (strata, pool key, regular expressions), which
-- appends the ORDER BY only where the rows are published (a sort is wasted under an aggregate).
-- Every sum of doubles is list_sum over a list sorted by value, never a parallel sum()/avg(): those
-- add in the order the threads (and the write-time batches, facts.py) deliver the rows, so their
-- last bits varied from one run to the next; a sorted list fixes the order (equal values are the
-- same double, so ties cannot reorder anything). Counts and averages of integers are exact anyway.
WITH s AS (
    SELECT sc.*, {pool_key} AS pool_key,
           coalesce(sc.parsed_option_id, '(no answer)') AS cluster
    FROM scored sc
),
pool AS (
    SELECT run_id, pool_key, count(*) AS m, avg(correct::INT) AS sample_accuracy
    FROM s
    GROUP BY run_id, pool_key
),
clusters AS (
    SELECT run_id, pool_key, cluster, count(*) AS n_c
    FROM s
    GROUP BY run_id, pool_key, cluster
),
consistency AS (
    SELECT c.run_id, c.pool_key,
           count(*)                                         AS n_clusters,
           1 - max(c.n_c) / any_value(p.m)                  AS sample_consistency,
           0.0 - list_sum(list_transform(list_sort(list(c.n_c / p.m)), lambda q: q * ln(q))) AS semantic_entropy
    FROM clusters c
    JOIN pool p ON p.run_id = c.run_id AND p.pool_key = c.pool_key
    GROUP BY c.run_id, c.pool_key
),
-- PRO: distinct sampled sequences (per prompt, i.e. per item and text) with their sequence
-- log-probability; entropy of their renormalised probabilities (log-sum-exp form).
seqs AS (
    SELECT run_id, pool_key, item_id, raw_output, list_avg(list_sort(list(token_logprob_sum))) AS lp
    FROM s
    WHERE token_logprob_sum IS NOT NULL
    GROUP BY run_id, pool_key, item_id, raw_output
),
seqs_c AS (
    SELECT run_id, pool_key, lp - max(lp) OVER (PARTITION BY run_id, pool_key) AS d
    FROM seqs
),
pro_d AS (
    SELECT run_id, pool_key, count(*) AS n_pro_sequences, list_sort(list(d)) AS ds
    FROM seqs_c
    GROUP BY run_id, pool_key
),
pro AS (
    SELECT run_id, pool_key, n_pro_sequences,
           ln(list_sum(list_transform(ds, lambda x: exp(x))))
             - list_sum(list_transform(ds, lambda x: exp(x) * x)) / list_sum(list_transform(ds, lambda x: exp(x))) AS pro
    FROM pro_d
),
s0 AS (
    SELECT s.*, r.decoding_json
    FROM s
    JOIN runs r USING (run_id)
    WHERE s.sample_index = 0
),
opt0 AS (
    SELECT run_id, item_id, count(*) AS n_scored_options,
           0.0 - list_sum(list_transform(list_sort(list(prob)),
                                         lambda q: CASE WHEN q > 0 THEN q * ln(q) ELSE 0 END)) AS option_entropy
    FROM option_probs
    WHERE sample_index = 0
    GROUP BY run_id, item_id
),
chosen0 AS (
    SELECT op.run_id, op.item_id,
           CASE WHEN op.prob > 0 THEN -ln(op.prob) ELSE 'inf'::DOUBLE END AS label_nll,
           -os.logprob AS label_nll_raw
    FROM option_probs op
    JOIN s0 ON s0.run_id = op.run_id AND s0.item_id = op.item_id AND s0.parsed_label = op.label
    JOIN option_scores os ON os.run_id = op.run_id AND os.item_id = op.item_id
                         AND os.sample_index = 0 AND os.label = op.label
    WHERE op.sample_index = 0
),
text0 AS (
    SELECT run_id, item_id,
           regexp_extract_all(raw_output, {conf_re}, 1) AS conf_num,
           regexp_extract_all(raw_output, {conf_re}, 2) AS conf_pct,
           len(regexp_extract_all(raw_output, '\S+'))            AS n_words,
           len(regexp_extract_all(raw_output, '\?+'))            AS n_questions,
           len(regexp_extract_all(raw_output, '(?i)\bwait\b'))   AS n_wait,
           len(regexp_extract_all(raw_output, {hedge_re}))       AS n_hedges
    FROM s0
),
conf AS (
    SELECT run_id, item_id, n_words, n_questions, n_wait, n_hedges,
           CASE WHEN len(conf_num) = 0 THEN NULL
                WHEN conf_pct[-1] = '%' THEN conf_num[-1]::DOUBLE / 100
                WHEN conf_num[-1]::DOUBLE <= 1 THEN conf_num[-1]::DOUBLE
                ELSE conf_num[-1]::DOUBLE / 100 END AS conf_raw
    FROM text0
)
SELECT {strata}
       s0.run_id, s0.item_id, s0.base_id, s0.outcome, s0.correct,
       p.m                                            AS n_samples,
       p.sample_accuracy,
       cs.n_clusters,
       cs.sample_consistency,
       cs.semantic_entropy,
       pr.n_pro_sequences,
       pr.pro,
       o.n_scored_options,
       s0.n_options,
       o.option_entropy,
       ch.label_nll,
       ch.label_nll_raw,
       -s0.token_logprob_mean                         AS avg_nll,
       -s0.token_logprob_min                          AS max_nll,
       -s0.token_logprob_sum                          AS g_nll,
       exp(s0.token_logprob_mean)                     AS geo_mean_token_prob,
       CASE WHEN json_valid(s0.decoding_json)
            THEN coalesce(TRY_CAST(json_extract_string(s0.decoding_json, '$.temperature') AS DOUBLE), 0) = 0
       END                                            AS sample0_greedy,
       CASE WHEN c.conf_raw BETWEEN 0 AND 1 THEN c.conf_raw END       AS elicited_confidence,
       CASE WHEN c.conf_raw BETWEEN 0 AND 1 THEN 1 - c.conf_raw END   AS elicited_uncertainty,
       s0.n_output_tokens,
       c.n_words,
       c.n_questions,
       c.n_wait,
       c.n_hedges
FROM s0
JOIN pool p ON p.run_id = s0.run_id AND p.pool_key = s0.pool_key
JOIN consistency cs ON cs.run_id = s0.run_id AND cs.pool_key = s0.pool_key
LEFT JOIN pro pr ON pr.run_id = s0.run_id AND pr.pool_key = s0.pool_key
LEFT JOIN opt0 o ON o.run_id = s0.run_id AND o.item_id = s0.item_id
LEFT JOIN chosen0 ch ON ch.run_id = s0.run_id AND ch.item_id = s0.item_id
JOIN conf c ON c.run_id = s0.run_id AND c.item_id = s0.item_id
