"""The thresholds q_hat of split conformal, every group and repeat, computed with numpy from the mask.

What it computes is exactly ``thr_own`` of ``sql/conf_split.sql``: in repeat r, a group's
calibration units are those whose mask bit r is set; of them the n with a target score count,
and q_hat is the k-th smallest of those scores (the (n - k + 1)-th largest), k = ceil((n_cal + 1)
(1 - alpha)) from the group's calibration count n_cal; NULL where k > n. The value picked does not
depend on how ties are ordered, so the result is the SQL's bit for bit (``tests/test_split_thresholds.py``
compares them, and this module with a plain sort per group and repeat).

Why a second implementation. The SQL lists a band of each group's largest target scores once,
sorted, and then filters that list by every repeat's bit: one list expression per repeat, evaluated
side by side. At 100 repeats over the 1M-prediction benchmark store (475k units) that query took
0.40-0.59 s of one thread and raised the process's RSS by 65-71 MiB (124 MiB with two threads),
memory that the pass's cap on DuckDB did not bound: the reason a pass at 100 splits peaked above
the store file's size (benchmarks/RESULTS.md, stop 39). Here a group's band is a partial sort of its scores
(``np.argpartition``), and each repeat's q_hat is the score of its (n - k + 1)-th calibration unit
in that band, largest first.

Nothing loops over units in Python: the loop is over groups (tens, not units), each step a few
vectorized operations over the group's units.
"""

from __future__ import annotations

import math

import numpy as np

# the band of a group's largest scores that is expected to hold every repeat's pick: with j the
# largest pick (n - k + 1) over the repeats and p the group's calibration share, the band holds
# (j + BAND_SD * sqrt(j) + BAND_PAD) / p units. Only speed depends on it: a repeat whose pick falls
# outside the band (fewer than j calibration units in it) selects from the whole group
BAND_SD = 3.5
BAND_PAD = 8
# rows of bit flags expanded at a time where only their counts are needed (units without a target
# score): this many units x one byte per bit of their mask words (2 MiB at 100 repeats)
_COUNT_ROWS = 16_384


def order_key(values: np.ndarray) -> np.ndarray:
    """An unsigned 64-bit key per double that sorts as DuckDB sorts doubles: numbers in numeric
    order, every NaN above +inf (all NaNs one key). The bits of a non-negative double sort as
    unsigned integers once the sign bit is set; a negative one's bits, inverted, sort below them."""
    v = np.where(np.isnan(values), np.nan, values)  # one NaN bit pattern (positive, quiet)
    bits = v.view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))


def calibration_flags(words: np.ndarray, repeats: int) -> np.ndarray:
    """The (units, repeats) uint8 flags of mask words ``words`` ((ceil(repeats / 64), units)
    uint64): 1 where the unit is calibration in the repeat (bit r % 64 of word r // 64). Each unit's
    words as little-endian bytes are its bits in repeat order, which ``np.unpackbits`` spreads out."""
    n = words.shape[1]
    little = np.ascontiguousarray(words.T).astype("<u8", copy=False)
    bits = np.unpackbits(little.view(np.uint8).reshape(n, -1), axis=1, bitorder="little")
    return bits[:, :repeats]


def calibration_counts(words: np.ndarray, repeats: int) -> np.ndarray:
    """Per repeat, how many of the units of ``words`` are calibration (int64, length repeats)."""
    counts = np.zeros(repeats, dtype=np.int64)
    for a in range(0, words.shape[1], _COUNT_ROWS):
        counts += calibration_flags(words[:, a : a + _COUNT_ROWS], repeats).sum(axis=0, dtype=np.int64)
    return counts


def thresholds(
    group: np.ndarray,
    scored: np.ndarray,
    score: np.ndarray,
    words: np.ndarray,
    n_cal: np.ndarray,
    k_order: np.ndarray,
    repeats: int,
) -> tuple[np.ndarray, np.ndarray]:
    """q_hat of every group and repeat: ``(q, defined)``, two (groups, repeats) arrays, q the
    threshold where ``defined`` (float64) and ``defined`` False where q_hat is NULL.

    Per unit: ``group`` (the group's index, 0 .. groups - 1), ``scored`` (whether it has a target
    score), ``score`` (that score; any value where not scored) and its mask words ``words``
    ((ceil(repeats / 64), units) uint64, as ``split_mask.calibration_words`` gives them). Per group:
    ``n_cal`` (its calibration units in every repeat) and ``k_order`` (k)."""
    n_groups = len(n_cal)
    q = np.zeros((n_groups, repeats), dtype=np.float64)
    defined = np.zeros((n_groups, repeats), dtype=bool)
    if len(group) == 0:
        return q, defined
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(n_groups + 1))
    for g in range(n_groups):
        rows = order[bounds[g] : bounds[g + 1]]
        if len(rows) == 0:
            continue
        has = scored[rows]
        # n per repeat: the calibration units less those without a target score
        n = int(n_cal[g]) - calibration_counts(words[:, rows[~has]], repeats)
        k = int(k_order[g])
        ok = k <= n
        if not ok.any():
            continue
        pick = n - k + 1  # the pick's place among the calibration scores, largest first
        kept = rows[has]  # the scored units: indices, not a copy of their words
        got = _picks(score[kept], words, kept, np.where(ok, pick, 0), len(rows), int(n_cal[g]), repeats)
        q[g, ok], defined[g, ok] = got[ok], True
    return q, defined


def _picks(
    values: np.ndarray,
    words: np.ndarray,
    units: np.ndarray,
    pick: np.ndarray,
    n_units: int,
    n_cal: int,
    repeats: int,
) -> np.ndarray:
    """Per repeat, the ``pick[r]``-th largest of ``values`` among the units whose bit r is set
    (``pick[r]`` >= 1 and at most their number; 0: not asked, NaN returned). ``values[i]`` is the
    score of unit ``units[i]``, whose mask words are ``words[:, units[i]]``.

    From a band of the largest values, sorted once: a repeat's pick is its pick[r]-th calibration
    unit in the band, where the band holds that many. A repeat whose band falls short selects from
    all the group's values (``_select_all``). Memory: a few arrays of one value per unit of the
    group, never units x repeats."""
    out = np.full(repeats, np.nan)
    key = order_key(values)
    need = int(pick.max())
    band = math.ceil((need + BAND_SD * math.sqrt(need) + BAND_PAD) * n_units / n_cal)
    if band < len(values):
        top = np.argpartition(key, len(values) - band)[len(values) - band :]
    else:
        top = np.arange(len(values))
    top = top[np.argsort(key[top], kind="stable")[::-1]]  # largest first
    band_words = words[:, units[top]]
    one = np.uint64(1)
    for r in np.flatnonzero(pick > 0).tolist():
        j = int(pick[r])
        cal = np.flatnonzero((band_words[r // 64] >> np.uint64(r % 64)) & one)
        out[r] = values[top[cal[j - 1]]] if len(cal) >= j else _select_all(values, key, words, units, r, j)
    return out


def _select_all(
    values: np.ndarray, key: np.ndarray, words: np.ndarray, units: np.ndarray, r: int, j: int
) -> float:
    """The ``j``-th largest of ``values`` among the units whose bit ``r`` is set, selected from all
    of them (``np.argpartition`` on the order key): where a repeat's band fell short."""
    cal = np.flatnonzero((words[r // 64][units] >> np.uint64(r % 64)) & np.uint64(1))
    at = cal[np.argpartition(key[cal], len(cal) - j)[len(cal) - j]]
    return float(values[at])
