"""The calibration mask of split conformal computed with numpy, for the option units of a store's facts.

What it computes is exactly the split that ``sql/conf_mask.sql`` defines (the module docstring of
``conformal`` documents the random stream): within each stratum (group x stratum value) the units
are ordered by (h_r, unit key, run_id), h_r = output r + 1 of SplitMix64 seeded with the unit key's
md5 base, and the first round_half_up(cal_fraction * N) are calibration in repeat r. The result is
the same mask words, bit for bit (``tests/test_split_mask.py`` compares the two on a store whose
runs tie on every hash, and this module with a full sort of each stratum).

Why a second implementation. Over the store's facts the units carry small integer keys (the item
code, a run rank, the stratum number), and the split is then a selection problem per stratum and
repeat: the n_cal-th smallest hash, found by ``np.partition`` in linear time, decides every unit
but the few whose hash equals it, which the tie-break orders. The SQL form cannot partition; it
lists and sorts a window of keys around the expected cutoff for every repeat side by side, in one
scan, and packs the answers into words with one CASE per repeat. At 1M predictions (475k units,
20 repeats) the mask table took 1.05-1.35 s of one thread that way, with the split hashes, the
largest single item of a metrics pass, against 0.67-0.78 s with this module (benchmarks/RESULTS.md,
stop 33). The SQL form stays the definition for every other unit set (views, TEMP base relations,
the sampling pools), where units are keyed by strings, and runs over the facts too where the units
fall in many strata (``conformal.NUMPY_MASK_MAX_STEPS``). Many units are handed to this module a run
of whole strata at a time (``conformal.NUMPY_MASK_CHUNK_UNITS``: these arrays are outside DuckDB's
memory cap).

Nothing here loops over units in Python: the loops are over repeats and strata (20 x a few dozen
at the defaults), each step a vectorized numpy operation over a stratum's units.
"""

from __future__ import annotations

import numpy as np

_GAMMA = 0x9E3779B97F4A7C15
_MUL = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_M64 = (1 << 64) - 1


def split_hashes(kb: np.ndarray, r: int) -> np.ndarray:
    """h_r of every key base ``kb`` (uint64): output r + 1 of SplitMix64 seeded with it, i.e.
    z = kb + (r + 1) * gamma, z = (z ^ z >> 30) * m1, z = (z ^ z >> 27) * m2, h = z ^ z >> 31, all
    mod 2**64 (numpy's uint64 arithmetic wraps, which is the mod)."""
    z = kb + np.uint64(((r + 1) * _GAMMA) & _M64)
    z = (z ^ (z >> np.uint64(30))) * _MUL[0]
    z = (z ^ (z >> np.uint64(27))) * _MUL[1]
    return z ^ (z >> np.uint64(31))


def n_cal(n: int, cal_num: int, cal_den: int) -> int:
    """round_half_up(cal_num / cal_den * n) in integers, as ``conf_mask.sql`` computes it."""
    return (2 * cal_num * n + cal_den) // (2 * cal_den)


def calibration_words(
    sizes: np.ndarray,
    key_pos: np.ndarray,
    key_rank: np.ndarray,
    run_rank: np.ndarray,
    kb: np.ndarray,
    repeats: int,
    cal_num: int,
    cal_den: int,
) -> np.ndarray:
    """The mask words of every unit: a (ceil(repeats / 64), units) uint64 array whose bit r % 64 of
    word r // 64 is set iff the unit is calibration in repeat r (one contiguous row per word).

    The units come stratum by stratum (group x stratum value): ``sizes`` are the strata's unit
    counts in that order. Per unit: ``key_pos`` (the index of its unit key in ``kb``, the keys' md5
    bases), ``key_rank`` (the unit key's rank in string order) and ``run_rank`` (its run_id's rank
    in string order): the tie-break (unit key, run_id) of equal hashes, which happen whenever runs
    of one stratum share an item.

    Memory: besides the words, a few arrays of one value per unit live at a time (the hashes of a
    repeat, a stratum's partition, the calibration flags); the process holding it runs beside a
    capped DuckDB (``registry.cap_pass_memory``), which does not see it.
    """
    n_units = int(np.sum(sizes))
    words = np.zeros(((repeats + 63) // 64, n_units), dtype=np.uint64)
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    starts = ends - np.asarray(sizes, dtype=np.int64)
    cuts = [n_cal(int(b - a), cal_num, cal_den) for a, b in zip(starts, ends, strict=True)]
    cal = np.empty(n_units, dtype=bool)
    for r in range(repeats):
        h = split_hashes(kb, r)[key_pos]  # the units' hashes
        bit = np.uint64(1 << (r % 64))
        for a, b, k in zip(starts, ends, cuts, strict=True):
            if k == 0:  # no calibration unit in this stratum
                continue
            hs, flags = h[a:b], cal[a:b]
            kth = np.partition(hs, k - 1)[k - 1]  # the k-th smallest hash: the cutoff's hash
            np.less(hs, kth, out=flags)
            tied = np.flatnonzero(hs == kth)
            need = k - int(np.count_nonzero(flags))
            if need < len(tied):  # the cutoff's ties ordered by (unit key, run_id): the first `need`
                rows = a + tied
                tied = tied[np.lexsort((run_rank[rows], key_rank[rows]))[:need]]
            flags[tied] = True
            np.bitwise_or(words[r // 64, a:b], bit, out=words[r // 64, a:b], where=flags)
    return words
