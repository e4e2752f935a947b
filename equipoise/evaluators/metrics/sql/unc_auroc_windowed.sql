-- unc_auroc's continuous scores ranked by a window partitioned by _part: the CTEs, ending in
-- g_continuous, that unc_auroc.sql splices in where the connection does not keep insertion order
-- (preserve_insertion_order off), so the plain sort of unc_auroc_sorted.sql could not be read in
-- its order; the same integers as that file. Input: one row per (item, continuous score) with
-- _part, _incorrect and _v (undefined = NaN), uncertainty._long_scores.
-- An untied value's first and last rank are both its row_number() in the sort; the few tied rows (a
-- neighbour in the sort order with the same value: lag / lead, in the same sort) are counted per
-- value, where the first rank is the smallest row_number of the value's rows (whatever order the
-- sort left the ties in) and the last = first + (count - 1). That replaces count(*) over a RANGE
-- frame (the last rank of every row: peer boundaries for all 3M rows at 1M predictions), which cost
-- about a sixth more CPU than rank() with lag / lead; row_number() instead of rank() (no peer
-- boundaries at all) was about 0.02-0.05 s less again.
ranked AS (
    SELECT _part, _incorrect, _v,
           row_number() OVER w                            AS _first,
           coalesce(lag(_v) OVER w = _v OR lead(_v) OVER w = _v, false) AS _tied
    FROM ({long_continuous})
    WINDOW w AS (PARTITION BY _part ORDER BY _v ASC)
),
-- per tied value: its positives times (first + last rank), first = its smallest row_number and
-- last = first + (count - 1)
ties AS (
    SELECT _part, sum(_sum) AS _sum
    FROM (SELECT _part, count(*) FILTER (WHERE _incorrect) * (2 * min(_first) + count(*) - 1) AS _sum
          FROM ranked
          WHERE _tied AND NOT isnan(_v)
          GROUP BY _part, _v)
    GROUP BY _part
),
-- per partition: the counts and the untied positives' ranks, as sums of 0/1 and rank columns
-- rather than FILTERed aggregates (four FILTER clauses over all 3M ranked rows cost about 0.02 s
-- more CPU at 1M predictions)
g_ranked AS (
    SELECT _part,
           count(*)::BIGINT                                                  AS n_items,
           sum(_d)::BIGINT                                                   AS n,
           sum(_p)::BIGINT                                                   AS n_incorrect,
           2 * sum(_u) - n_incorrect * (n_incorrect + 1)                     AS _untied_twice_u
    FROM (SELECT _part, (NOT isnan(_v))::INT AS _d, (_incorrect AND NOT isnan(_v))::INT AS _p,
                 CASE WHEN _incorrect AND NOT isnan(_v) AND NOT _tied THEN _first ELSE 0 END AS _u
          FROM ranked)
    GROUP BY _part
),
g_continuous AS (
    SELECT r._part, r.n_items, r.n, r.n_incorrect,
           CASE WHEN r.n_incorrect > 0
                THEN r._untied_twice_u + coalesce(t._sum, 0)
           END AS _twice_u
    FROM g_ranked r
    LEFT JOIN ties t ON t._part = r._part
)
