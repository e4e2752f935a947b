-- Mann-Whitney counted per distinct value, the CTEs that unc_auroc.sql (its discrete scores) and
-- unc_combiner_auroc.sql (the combiners' predictions) share. Input {long}: one row per (item,
-- partition) with _part (an integer partition key), _incorrect (the positive class) and _v (the
-- value; NULL = undefined). The rows collapse to counts per (_part, value), and one running sum
-- over those rows gives the negatives below each value: with ties counted one half,
-- 2U = sum over values v of pos(v) * (2 neg(< v) + neg(v)), an exact integer. NULL sorts last, so
-- it shifts no defined value's count, and is left out of n, n_incorrect and the sum.
-- {name}: per _part n_items (every row), n (defined values), n_incorrect (defined positives), _twice_u.
-- _incorrect is never NULL (correct is coalesced to false in the base views; the combiners' labels
-- come from it), so the negatives are the rows less the positives: a sum of 0/1 and a count
-- instead of two FILTERed counts, about 0.03 s less of unc_auroc's CPU at 1M predictions.
per_value AS (
    SELECT _part, _v,
           sum(_incorrect::INT)::BIGINT              AS _pos,
           (count(*) - sum(_incorrect::INT))::BIGINT AS _neg
    FROM ({long})
    GROUP BY ALL
),
below AS (
    SELECT *, sum(_neg) OVER (PARTITION BY _part ORDER BY _v ASC NULLS LAST) - _neg AS _neg_below
    FROM per_value
),
{name} AS (
    SELECT _part,
           sum(_pos + _neg)::BIGINT                                            AS n_items,
           coalesce(sum(_pos + _neg) FILTER (WHERE _v IS NOT NULL), 0)::BIGINT AS n,
           coalesce(sum(_pos) FILTER (WHERE _v IS NOT NULL), 0)::BIGINT        AS n_incorrect,
           sum(_pos * (2 * _neg_below + _neg)) FILTER (WHERE _v IS NOT NULL)   AS _twice_u
    FROM below
    GROUP BY _part
)
