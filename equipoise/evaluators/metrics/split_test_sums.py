"""The test sums of split conformal, every segment and repeat, computed with numpy from the mask.

What it computes is ``test_rep_own`` of ``sql/conf_split.sql`` for LAC and plain APS: per
segment (a group, or a group and a coverage_by value) and repeat r, over the segment's test units
(mask bit r clear) whose option scores are listed, how many there are (n), how many options their
sets hold (sz: options with s <= q_hat of the unit's group in repeat r), how many sets hold the
target (cv: target score <= q_hat) and how many are empty (em: no option <= q_hat). A NULL q_hat
(k > n) is +infinity, as the SQL's coalesce makes it. Comparisons follow DuckDB's order of doubles
(``split_thresholds.order_key``: NaN above +infinity and equal to itself, -0.0 equal to 0.0); a NULL
option score counts nowhere, a NULL target score is never covered, and a unit without an option
score is empty in every repeat. The sums are integers, so they are the SQL's exactly
(``tests/test_split_test_sums.py`` compares them with the SQL table and with a direct count per
repeat), with one exception that the store's facts cannot produce: a group whose q_hat is NaN in
some repeats and NULL in others. There the SQL's shortcut (the range [q_lo, q_hi] of the group's
q_hat, with NULL read as +infinity, which is below NaN) no longer brackets every repeat's q_hat,
and its sums depart from the definition; these follow the definition. Over the facts a unit with
option scores always has a target score (1.0 where the target was not scored,
``sql/sample_probs.sql``), so a group's count of calibration scores, and with it whether q_hat is
NULL, is the same in every repeat.

Why a second implementation. The SQL computes, per unit, the options at or below its group's
smallest q_hat and lists its scores between the smallest and the largest q_hat (list lambdas over
every unit's scores), then groups the units once per 8-bit slice of their mask words: at 100
repeats over the 1M-prediction benchmark store (475k units) that took 0.85-1.55 s of one thread
per table (benchmarks/RESULTS.md, stop 40), against 0.51-0.87 s here, and the pass makes two such
tables (conformal_aps's, and coverage_by's, which conformal_lac reads). The same decomposition in
numpy: a unit's repeat-independent counts (options at or below the
group's smallest q_hat, target covered and set empty in every repeat) summed over every repeat's
calibration units at once by a matrix product of the units' calibration flags, and only the few
"border" scores between the smallest and the largest q_hat compared repeat by repeat.

Nothing loops over units in Python: loops are over chunks of units and over segments. The caller
(``conformal._numpy_test_rep_table``) hands the units over in runs of mask rows and adds the runs'
sums, so the arrays here hold one run (at 32,768 rows a run: 24.6-26.5 MiB at the peak,
tracemalloc, 1M-prediction store, 100 repeats).
"""

from __future__ import annotations

import numpy as np

from equipoise.evaluators.metrics.split_thresholds import calibration_flags, order_key

# units (or border scores) whose calibration flags are expanded at a time: this many x repeats
# bytes of flags, and four bytes more per flag as float32 for the product (about 8 MiB at 100 repeats)
CHUNK_ROWS = 16_384
# float32 sums of integer counts are exact below 2**24: a chunk's rows x the largest count of a
# unit stay below it (``_chunk``)
_EXACT = 1 << 24

SUMS = ("n", "sz", "cv", "em")


def compare_key(values: np.ndarray) -> np.ndarray:
    """Order keys under which ``<=`` is DuckDB's ``<=`` on doubles: ``order_key`` with -0.0 read as
    0.0 (DuckDB compares them equal; their bits differ)."""
    v = np.asarray(values, dtype=np.float64)
    return order_key(np.where(v == 0.0, 0.0, v))


def _by_segment(seg: np.ndarray, n_seg: int) -> np.ndarray:
    """The stable order that sorts ``seg`` (a radix sort where the segment numbers fit 16 bits)."""
    small = seg.astype(np.int16) if n_seg <= np.iinfo(np.int16).max else seg
    return np.argsort(small, kind="stable")


def _chunk(largest: int) -> int:
    """Rows per chunk such that float32 sums of counts up to ``largest`` per row are exact."""
    return max(1, min(CHUNK_ROWS, (_EXACT - 1) // max(1, largest)))


def _segment_sums(
    seg: np.ndarray, flag_rows: np.ndarray, words: np.ndarray, weights: np.ndarray, n_seg: int, repeats: int
) -> np.ndarray:
    """(n_seg, repeats, k) int64: per segment and repeat, the sums of ``weights`` ((rows, k)
    non-negative integers) over the rows whose unit (``flag_rows``: the row's column of ``words``)
    calibrates in the repeat. ``seg`` is sorted (the rows of a segment are contiguous)."""
    out = np.zeros((n_seg, repeats, weights.shape[1]), dtype=np.int64)
    if len(seg) == 0:
        return out
    step = _chunk(int(weights.max()) if weights.size else 1)
    for a in range(0, len(seg), step):
        b = min(len(seg), a + step)
        f = calibration_flags(words[:, flag_rows[a:b]], repeats).astype(np.float32)
        w = weights[a:b].astype(np.float32)
        s = seg[a:b]
        cuts = np.flatnonzero(np.diff(s)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, b - a], strict=True):
            out[s[lo]] += np.rint(f[lo:hi].T @ w[lo:hi]).astype(np.int64)
    return out


def _border_sums(
    seg: np.ndarray,
    unit: np.ndarray,
    key: np.ndarray,
    group: np.ndarray,
    words: np.ndarray,
    q_key: np.ndarray,
    n_seg: int,
    repeats: int,
) -> np.ndarray:
    """(n_seg, repeats) int64: per segment and repeat, how many of the scores ``key`` (order keys,
    of units ``unit`` in segments ``seg``, sorted by segment) are <= their group's (``group``)
    threshold in that repeat (``q_key``: (groups, repeats) order keys), counted where the unit is
    a test unit in the repeat."""
    out = np.zeros((n_seg, repeats), dtype=np.int64)
    if len(seg) == 0:
        return out
    for a in range(0, len(seg), CHUNK_ROWS):
        b = min(len(seg), a + CHUNK_ROWS)
        hit = (key[a:b, None] <= q_key[group[a:b]]) & (calibration_flags(words[:, unit[a:b]], repeats) == 0)
        s = seg[a:b]
        starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1]
        out[s[starts]] += np.add.reduceat(hit, starts, axis=0, dtype=np.int64)
    return out


def test_sums(
    seg: np.ndarray,
    seg_group: np.ndarray,
    words: np.ndarray,
    has_target: np.ndarray,
    target: np.ndarray,
    opt_unit: np.ndarray,
    opt_score: np.ndarray,
    q: np.ndarray,
    repeats: int,
) -> dict[str, np.ndarray]:
    """``test_rep_own``'s sums: a (segments, repeats) int64 array per name of ``SUMS``.

    Per unit (only units whose option scores are listed; the SQL leaves the others out of every
    sum): ``seg`` its segment (0 .. segments - 1), ``words`` its mask words ((ceil(repeats / 64),
    units) uint64), ``has_target`` / ``target`` whether it has a target score and that score. Per
    option score (NULL ones left out): ``opt_unit`` its unit, ``opt_score`` the score. Per segment:
    ``seg_group`` its group (0 .. groups - 1). ``q``: (groups, repeats) float64 q_hat, +inf where
    NULL."""
    n_seg = len(seg_group)
    n_units = len(seg)
    q_key = compare_key(q)
    q_lo, q_hi = q_key.min(axis=1), q_key.max(axis=1)
    group = seg_group[seg]
    t_key = compare_key(target)
    o_key = compare_key(opt_score)
    o_group = group[opt_unit]
    # per unit: options at or below the group's smallest q_hat (in its set in every repeat), and
    # its smallest score (the set is empty in a repeat iff that score is above q_hat)
    lo = np.bincount(opt_unit[o_key <= q_lo[o_group]], minlength=n_units)
    # a unit without an option score keeps the largest uint64, above every key (NaN's included):
    # its set is empty in every repeat
    mn = np.full(n_units, np.iinfo(np.uint64).max, dtype=np.uint64)
    np.minimum.at(mn, opt_unit, o_key)
    covered = has_target & (t_key <= q_lo[group])  # covered in every repeat
    empty = mn > q_hi[group]  # empty in every repeat
    # the repeat-independent sums over a repeat's test units: over all units less over its
    # calibration units
    weights = np.stack([np.ones(n_units, dtype=np.int64), lo, covered, empty], axis=1)
    total = np.stack([np.bincount(seg, weights=w, minlength=n_seg) for w in weights.T], axis=1).astype(
        np.int64
    )  # float64 sums of integers far below 2**53: exact
    order = _by_segment(seg, n_seg)
    cal = _segment_sums(seg[order], order, words, weights[order], n_seg, repeats)
    out = {name: total[:, None, i] - cal[:, :, i] for i, name in enumerate(SUMS)}

    def border(unit: np.ndarray, key: np.ndarray) -> np.ndarray:
        """The border scores' counts <= q_hat, per segment and repeat, over test units."""
        by = _by_segment(seg[unit], n_seg)
        return _border_sums(seg[unit][by], unit[by], key[by], group[unit][by], words, q_key, n_seg, repeats)

    # the scores between the smallest and the largest q_hat: compared repeat by repeat
    between = (o_key > q_lo[o_group]) & (o_key <= q_hi[o_group])
    out["sz"] += border(opt_unit[between], o_key[between])
    units = np.arange(n_units)
    b_target = has_target & (t_key > q_lo[group]) & (t_key <= q_hi[group])
    out["cv"] += border(units[b_target], t_key[b_target])
    # a border unit's set is empty where its smallest score is above q_hat: its test count less
    # the repeats where that score is <= q_hat
    b_empty = (mn > q_lo[group]) & (mn <= q_hi[group])
    b_units = units[b_empty]
    ones = np.ones((len(b_units), 1), dtype=np.int64)
    by = _by_segment(seg[b_units], n_seg)
    tests = -_segment_sums(seg[b_units][by], b_units[by], words, ones[by], n_seg, repeats)[:, :, 0]
    np.add.at(tests, seg[b_units], 1)  # every border unit, less its calibration repeats
    out["em"] += tests - border(b_units, mn[b_empty])
    return out
