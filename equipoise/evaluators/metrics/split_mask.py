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

Nothing here loops over units in Python: the loop is over repeats, each step a few vectorized
numpy operations over all the units handed over (over each stratum's slice where the strata are
at most ``SLICE_STRATA``, over every stratum at once beyond), plus a step per stratum only where
a stratum's guessed window missed its cutoff (``calibration_words``).
"""

from __future__ import annotations

import math

import numpy as np

_GAMMA = 0x9E3779B97F4A7C15
_MUL = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_M64 = (1 << 64) - 1


def split_hashes(kb: np.ndarray, r: int) -> np.ndarray:
    """h_r of every key base ``kb`` (uint64): output r + 1 of SplitMix64 seeded with it, i.e.
    z = kb + (r + 1) * gamma, z = (z ^ z >> 30) * m1, z = (z ^ z >> 27) * m2, h = z ^ z >> 31, all
    mod 2**64 (numpy's uint64 arithmetic wraps, which is the mod), as a new array; computed by
    ``_split_hashes_into``, the one copy of the arithmetic."""
    scratch = np.empty(max(1, min(len(kb), HASH_BLOCK)), dtype=np.uint64)
    return _split_hashes_into(kb, r, np.empty(len(kb), dtype=np.uint64), scratch)


def _split_hashes_into(kb: np.ndarray, r: int, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """``split_hashes(kb, r)`` written into ``out`` (returned), a block of ``len(tmp)`` values at a
    time with ``tmp`` as scratch: no array is allocated per repeat, and each block's eight passes
    stay in the processor's cache."""
    add = np.uint64(((r + 1) * _GAMMA) & _M64)
    step = len(tmp)
    for a in range(0, len(kb), step):
        b = min(len(kb), a + step)
        z, t = out[a:b], tmp[: b - a]
        np.add(kb[a:b], add, out=z)
        for shift, mul in ((30, _MUL[0]), (27, _MUL[1])):
            np.right_shift(z, np.uint64(shift), out=t)
            np.bitwise_xor(z, t, out=z)
            np.multiply(z, mul, out=z)
        np.right_shift(z, np.uint64(31), out=t)
        np.bitwise_xor(z, t, out=z)
    return out


# values hashed at a time by ``_split_hashes_into`` (its scratch: 256 KiB)
HASH_BLOCK = 32_768


# at most this many strata with calibration units in one call: each repeat compares and counts the
# units stratum by stratum, against the stratum's two bounds as scalars (four numpy calls per
# stratum); more strata: one comparison of every unit with per-unit bounds and one reduceat per
# count (benchmarks/RESULTS.md, stop 41: 400k units, 100 repeats, one thread; stratum by stratum
# 0.74-0.79 s against 0.85-1.00 at 64 strata, 1.30-1.77 against 1.71-1.77 at 256, about the same at 512)
SLICE_STRATA = 256


def n_cal(n: int, cal_num: int, cal_den: int) -> int:
    """round_half_up(cal_num / cal_den * n) in integers, as ``conf_mask.sql`` computes it."""
    return (2 * cal_num * n + cal_den) // (2 * cal_den)


# the guessed window of hash values around a stratum's cutoff (``calibration_words``): this many
# binomial sd of the n_cal-th smallest hash's position, and this many units more, on each side. Only
# speed depends on them: a repeat whose cutoff falls outside a stratum's window selects that
# stratum by ``np.partition`` instead (at 3.5 sd, by the normal approximation of the binomial,
# fewer than 1 in 2,000 (stratum, repeat) steps; not counted)
WINDOW_SD = 3.5
WINDOW_PAD = 8


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
    of one stratum share an item. Any order of the units within a stratum gives the same words;
    in tie-break order (conformal.py fetches them so) the window's sort needs one key, the hash.

    How, per repeat, for every stratum at once: the hashes are uniform on [0, 2**64), so a
    stratum's n_cal-th smallest lies near n_cal / N * 2**64. Each stratum gets a window [lo, hi]
    of hash values around that point (``WINDOW_SD``, ``WINDOW_PAD``; fixed for all repeats). Its
    units below lo are calibration, those above hi are test, and the first need = n_cal - (units
    below lo) of the units inside the window, in (hash, unit key, run_id) order, are calibration:
    one comparison of every unit with its stratum's two bounds, a count per stratum, and a sort of
    the few window units (a few % of each stratum). That holds wherever the window holds the cutoff
    (units below lo <= n_cal <= units up to hi), which the counts check; a stratum where it does not
    is selected in that repeat by ``np.partition`` (``_select``), as every stratum was before stop 38.
    Same words either way, bit for bit (tests: a full sort of each stratum in plain Python). Up to
    ``SLICE_STRATA`` strata the comparisons and counts run stratum by stratum against scalar bounds;
    beyond, against per-unit bounds in one call each. The hashes are computed in place, a block at
    a time (``_split_hashes_into``), of the units' own key bases or of the keys, whichever are fewer
    by half: on stop 41's synthetic chunks of 400k units, 100 repeats, 12-16% faster than one
    array operation at a time at 400 strata and 27-49% at 1-64 (benchmarks/RESULTS.md), with the
    same words.

    Memory: besides the words, a few arrays of one value per unit live at a time (the hashes of a
    repeat, each unit's window bounds and stratum, comparison flags); the process holding it runs
    beside a capped DuckDB (``registry.cap_pass_memory``), which does not see it.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n_units = int(np.sum(sizes))
    words = np.zeros(((repeats + 63) // 64, n_units), dtype=np.uint64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    cuts = np.array([n_cal(int(n), cal_num, cal_den) for n in sizes.tolist()], dtype=np.int64)
    live = np.flatnonzero((sizes > 0) & (cuts > 0))  # strata with calibration units
    if n_units == 0 or len(live) == 0:
        return words
    stratum = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)  # each unit's stratum
    lo, hi = _windows(sizes[live], cuts[live])
    live_starts, live_cuts = starts[live], cuts[live]
    need = np.zeros(len(sizes), dtype=np.int64)
    cal = np.zeros(n_units, dtype=bool)  # this repeat's calibration flags
    upto = np.zeros(n_units, dtype=bool)
    byte = np.zeros(n_units, dtype=np.uint8)  # 8 repeats' flags, bit r % 8 = repeat r
    shifted = np.empty(n_units, dtype=np.uint8)
    few = len(live) <= SLICE_STRATA
    if few:  # compared and counted stratum by stratum, against its bounds as scalars
        spans = [(int(starts[i]), int(ends[i])) for i in live.tolist()]
        # the flags of strata without calibration units are never written: False throughout
        n_below = np.zeros(len(live), dtype=np.int64)
        n_upto = np.zeros(len(live), dtype=np.int64)
        lo_s, hi_s = list(lo), list(hi)  # numpy uint64 scalars
    else:  # every unit at once, against its stratum's bounds spread to the units
        in_live = np.zeros(len(sizes), dtype=bool)
        in_live[live] = True
        unit_live = in_live[stratum]
        lo_u = np.zeros(len(sizes), dtype=np.uint64)
        hi_u = np.zeros(len(sizes), dtype=np.uint64)
        lo_u[live], hi_u[live] = lo, hi
        lo_u, hi_u = lo_u[stratum], hi_u[stratum]  # per unit: its stratum's window (0, 0: none)
    # the units' hashes, each repeat: of every unit's own key base where units are fewer than twice
    # the keys (hashing costs about what gathering does), else of the keys, gathered to the units
    per_unit = n_units < 2 * len(kb)
    base = kb[key_pos] if per_unit else kb
    z, tmp = np.empty(len(base), dtype=np.uint64), np.empty(min(len(base), HASH_BLOCK), dtype=np.uint64)
    h = z if per_unit else np.empty(n_units, dtype=np.uint64)
    for r in range(repeats):
        _split_hashes_into(base, r, z, tmp)
        if not per_unit:  # gathered a block at a time: numpy's index conversion stays a block long
            for a in range(0, n_units, HASH_BLOCK):
                np.take(z, key_pos[a : a + HASH_BLOCK], out=h[a : a + HASH_BLOCK])
        if few:
            for j, (a, b) in enumerate(spans):
                np.less(h[a:b], lo_s[j], out=cal[a:b])
                np.less_equal(h[a:b], hi_s[j], out=upto[a:b])
                n_below[j] = np.count_nonzero(cal[a:b])
                n_upto[j] = np.count_nonzero(upto[a:b])
        else:
            np.less(h, lo_u, out=cal)
            np.less_equal(h, hi_u, out=upto)
            cal &= unit_live
            upto &= unit_live
            n_below = np.add.reduceat(cal, live_starts, dtype=np.int64)
            n_upto = np.add.reduceat(upto, live_starts, dtype=np.int64)
            # reduceat sums to the next live start; strata between live ones have no flag set, so
            # these are each live stratum's own counts
        held = (n_below <= live_cuts) & (live_cuts <= n_upto)
        np.bitwise_xor(upto, cal, out=upto)  # the window's units (lo <= hi: cal is within upto)
        if not held.all():  # the guess missed: that stratum is selected in full, not by its window
            for i in np.flatnonzero(~held).tolist():
                a, b = int(starts[live[i]]), int(ends[live[i]])
                upto[a:b] = False
                _select(h, a, b, int(live_cuts[i]), key_rank, run_rank, cal)
        win = np.flatnonzero(upto)
        if len(win):
            hw = h[win]
            order = np.argsort(hw, kind="stable")
            order = order[np.argsort(stratum[win[order]], kind="stable")]  # by stratum, hash
            win, hw = win[order], hw[order]
            tie = np.flatnonzero((hw[1:] == hw[:-1]) & (stratum[win[1:]] == stratum[win[:-1]]))
            if len(tie) and not _tie_ordered(win[tie], win[tie + 1], key_rank, run_rank):
                # units of one stratum on the same hash (runs sharing an item) that came in another
                # order than (unit key, run_id): the full sort
                win = win[np.lexsort((run_rank[win], key_rank[win], hw, stratum[win]))]
            st = stratum[win]
            first = np.r_[0, np.flatnonzero(st[1:] != st[:-1]) + 1]
            rank = np.arange(len(win)) - np.repeat(first, np.diff(np.r_[first, len(win)]))
            need[live] = live_cuts - n_below
            cal[win[rank < need[st]]] = True
        np.left_shift(cal.view(np.uint8), r % 8, out=shifted)
        byte |= shifted
        if r % 8 == 7 or r == repeats - 1:  # a byte of the word complete: OR it in at its place
            words[r // 64] |= byte.astype(np.uint64) << np.uint64(r // 8 * 8 % 64)
            byte[:] = 0
    return words


def _tie_ordered(a: np.ndarray, b: np.ndarray, key_rank: np.ndarray, run_rank: np.ndarray) -> bool:
    """Whether every unit of ``a`` comes before the unit of ``b`` beside it in (unit key, run_id)
    order: then the stable sort by hash left the units tied on a hash in tie-break order."""
    ka, kb_ = key_rank[a], key_rank[b]
    return bool(np.all((ka < kb_) | ((ka == kb_) & (run_rank[a] <= run_rank[b]))))


def _windows(sizes: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per stratum (``sizes`` units, ``cuts`` calibration units, both > 0): the bounds lo, hi
    (uint64) of the window of hash values expected to hold its cutoff, WINDOW_SD binomial sd and
    WINDOW_PAD units either side of cut / size * 2**64 (clipped to [0, 2**64 - 1])."""
    lo, hi = [], []
    for n, k in zip(sizes.tolist(), cuts.tolist(), strict=True):
        w = WINDOW_SD * math.sqrt(k * (n - k) / n) + WINDOW_PAD
        lo.append(min(_M64, max(0, math.floor((k - w) / n * 2.0**64))))
        hi.append(min(_M64, math.ceil((k + w) / n * 2.0**64)))
    return np.array(lo, dtype=np.uint64), np.array(hi, dtype=np.uint64)


def _select(
    h: np.ndarray,
    a: int,
    b: int,
    k: int,
    key_rank: np.ndarray,
    run_rank: np.ndarray,
    cal: np.ndarray,
) -> None:
    """Set ``cal`` for units a..b-1 to whether they are among the first ``k`` in (hash, unit key,
    run_id) order: the k-th smallest hash by ``np.partition``, the units below it, and of those
    tied with it the first in (unit key, run_id) order."""
    hs, flags = h[a:b], cal[a:b]
    kth = np.partition(hs, k - 1)[k - 1]  # the k-th smallest hash: the cutoff's hash
    np.less(hs, kth, out=flags)
    tied = np.flatnonzero(hs == kth)
    need = k - int(np.count_nonzero(flags))
    if need < len(tied):  # the cutoff's ties ordered by (unit key, run_id): the first `need`
        rows = a + tied
        tied = tied[np.lexsort((run_rank[rows], key_rank[rows]))[:need]]
    flags[tied] = True
