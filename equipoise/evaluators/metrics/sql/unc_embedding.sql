-- Embedding dispersion of an item's pool of samples (seed 004, 3.3 and appendix D.1): EigenEmbed
-- = trace of the embeddings' covariance (1/N normalisation) = mean squared distance from the
-- centroid; RDS = total L1 distance of the embeddings from their centroid. Embeddings come from a
-- caller-supplied encoder and arrive long (text, d, v) as _unc_embeddings. Error samples (no
-- text) are not embedded and are counted out through n_embedded versus n_samples.
-- Every sum or mean of doubles adds a value-sorted list (list_sum / list_avg of list_sort), not a
-- parallel sum() / avg(), whose order, so last bits, follows DuckDB's threads.
WITH s AS (
    SELECT sc.*, {pool_key} AS pool_key FROM scored sc
),
pool AS (
    SELECT run_id, pool_key, count(*) AS n_samples FROM s GROUP BY run_id, pool_key
),
e AS (
    SELECT s.run_id, s.pool_key, s.item_id, s.sample_index, x.d, x.v
    FROM s JOIN _unc_embeddings x ON x.text = s.raw_output
    WHERE s.outcome <> 'error'
),
centroid AS (
    SELECT run_id, pool_key, d, list_avg(list_sort(list(v))) AS mu FROM e GROUP BY run_id, pool_key, d
),
per_sample AS (
    SELECT e.run_id, e.pool_key, e.item_id, e.sample_index,
           list_sum(list_sort(list((e.v - c.mu) * (e.v - c.mu)))) AS sq,
           list_sum(list_sort(list(abs(e.v - c.mu)))) AS l1
    FROM e JOIN centroid c ON c.run_id = e.run_id AND c.pool_key = e.pool_key AND c.d = e.d
    GROUP BY e.run_id, e.pool_key, e.item_id, e.sample_index
),
agg AS (
    SELECT run_id, pool_key, count(*) AS n_embedded, list_avg(list_sort(list(sq))) AS eigen_embed,
           list_sum(list_sort(list(l1))) AS rds
    FROM per_sample GROUP BY run_id, pool_key
)
SELECT {strata} s.run_id, s.item_id, p.n_samples, coalesce(a.n_embedded, 0) AS n_embedded,
       a.eigen_embed, a.rds
FROM s
JOIN pool p ON p.run_id = s.run_id AND p.pool_key = s.pool_key
LEFT JOIN agg a ON a.run_id = s.run_id AND a.pool_key = s.pool_key
WHERE s.sample_index = 0
ORDER BY ALL
