"""Split conformal prediction sets (seed 000 sections 3.2 / 4.3.1: LAC and APS, alpha 0.1, 30/70
stratified calibration / test split; seed 002 appendix G: sampling-based sets from M samples).

Everything is DuckDB SQL (``sql/conf_*.sql``); Python only validates parameters and pastes the SQL
fragments together. Per group ({by}, default model x config):

Units. ``conformal_lac`` / ``conformal_aps``: one unit per run x item, prediction sample
``sample_index`` (default 0), with the softmax option probabilities of ``option_probs`` (the LAC and
plain APS scores below are per-sample write-time facts, ``sql/sample_probs.sql``). Items without
option scores are not units; they are counted (``n_unscored``). Every option of the item is a
candidate; an option the backend did not score gets p = 0 (``n_target_unscored`` counts units whose
target is such an option). ``conformal_sampling``: one unit per run x pool of samples (``pool``:
'item' = the item's samples 0..M-1, 'base' = all samples of the run's items sharing a base_id, i.e.
option-shuffled copies of one question); options are matched by ``option_id`` (identity), never by
letter. A pool 'item' is one run x item, so its counts, vote and scores are per-pool write-time facts
(``sql/sampling_pools.sql``) that a connection with fixed base relations reads, one row per pool,
instead of grouping every sample (the views, and pool 'base', group the samples in the query).
Over the store's facts they are columns of ``facts_scored`` on each pool's first sample row and also
carry the integer item code and that row's rowid (``_pools_coded``): the pools join the option
units' mask table (below) by the rowid, as LAC does, not by the item_id string, and their own mask
reads the split keys of the codes that the option mask computed, so md5 runs once per item.

Nonconformity of option y:

- LAC: s = 1 - p(y).
- APS: s = sum of p over the options with p >= p(y) (ties included, as in seed 000's formula),
  computed as 1 - (mass strictly below p(y)): equal in exact arithmetic since the softmax sums to 1,
  and the least likely options (and unscored ones) then score exactly 1. With ``aps_randomized``
  the option's own mass is multiplied by U: s = 1 - below - (1 - U) p(y), U ~ Uniform(0, 1) from
  md5(seed, item_id, option_id), so the same item and option draw the same U in calibration and in
  prediction (and in every repeat and model).
- sampling: s = 1 - f(y), f(y) = (samples choosing option y) / M. M counts EVERY sample of the
  pool, unparsed, refusal and error samples included: they choose no option and dilute every f.
  Computed as (M - c) / M, one rounding of the exact rational (3 of 10 gives exactly the double 0.3,
  where 1 - 7/10 would round twice and give 0.30000000000000004).

Split (``repeats`` random splits, default 100): within each group and stratum (``stratify``, default
``target_role``: gold vs abstain targets) the units are ordered by (h, unit key, run_id) and the
first round_half_up(cal_fraction * N) are calibration (default 0.3), the rest test. The random
stream: unit key = item_id, or base_id for pool 'base'; s0 = the first 16 hex digits of
md5('<seed>:<unit key>') as an unsigned 64-bit integer; h of repeat r = output r + 1 of SplitMix64
seeded with s0, i.e. z = s0 + (r + 1) * 0x9E3779B97F4A7C15, z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9,
z = (z ^ z >> 27) * 0x94D049BB133111EB, h = z ^ z >> 31, all mod 2**64. It depends only on the seed,
the unit key and the repeat, so the same item is in the same part for every model of a repeat
(paired comparisons), and it is the same on any machine and DuckDB version (md5 and integer
arithmetic are defined; DuckDB's ``hash`` is not). md5 runs once per unit key, not per key and
repeat (md5 of units x repeats strings was most of these metrics' time). The order is never sorted in
full: a unit is calibration iff its key is <= the stratum's n_cal-th smallest key, found from the
counts below the ends of a narrow window of hash values around n_cal / N * 2**64 (checked, widened
where it misses) and a sort of the few keys inside it (``sql/conf_mask.sql``).

Calibration mask. Which units calibrate in which repeat depends only on the units (group, stratum,
run_id and unit key of each), the seed, the repeats and cal_fraction, never on the score. It is
computed once as one bit per unit and repeat (UBIGINT words m0, m1, ...: bit r % 64 of word r // 64
is set iff the unit is calibration in repeat r, so any number of repeats fits) and every per-repeat
sum is then computed without units x repeats rows: the calibration scores that q_hat needs as one
sorted list per group, filtered per repeat by its mask bit, and the test sums (units, covered, empty,
set size) as the sums over all units minus those over the repeat's calibration units, the latter
read from the units grouped once per 8-bit slice of their mask words (``SLICE_BITS``); only the few
units whose coverage or emptiness differs between repeats (a score between the repeats' smallest
and largest q_hat) get an aggregate per repeat (``sql/conf_split.sql``). When the base
relations are fixed for the connection (a read-only pass, ``registry.prepare(materialize=True)``),
LAC, APS and coverage_by share one unit set (sample ``sample_index`` of each run x item with option
scores), so its mask is a TEMP table computed once per connection and parameters, and LAC / plain
APS build their units on it, fetching each unit's scores (and coverage_by its column) by the rowid
the table holds, not by a join on the string keys (run_id, item_id). Over the store's facts the
table is built without a join on (run_id, item_id) (``_coded``): ``facts_scored`` carries each prediction's
scores and an integer item code (the item_id's rank in string order, so keyed by it the split is
the same), and the table keeps the target scores the thresholds read; there the split itself is
selected by numpy from those integer keys (``split_mask``: the same words bit for bit, 0.67-0.78
against 1.05-1.35 s of one thread at 1M predictions, ``NUMPY_MASK``; in runs of whole strata of
up to ``NUMPY_MASK_CHUNK_UNITS`` units, as its arrays are outside DuckDB's memory cap, and up to
``NUMPY_MASK_MAX_STEPS``). Otherwise
(views, and the
sampling pools) each query computes it inline, except that pools 'item' read that TEMP table when
the pass already holds it and the pools are exactly its units (checked in the same query; see
``_query``), which in a store of scored MCQ runs they are. The thresholds q_hat of LAC and plain APS
on that table are likewise a TEMP table per score and alpha (``_threshold_table``), so coverage_by
with score 'lac' and conformal_lac compute them once. Their test sums (per group and repeat, and per
coverage_by value) are TEMP tables too (``_test_rep_table``): coverage_by's per column, which
conformal_lac sums over the values when it finds one, and otherwise, over the store's facts, one per
group (elsewhere LAC and APS sum their own in their query); over the store's
facts numpy sums them (``split_test_sums``, ``NUMPY_TEST_SUMS``: the same integers, in 0.51-0.87 s
against the SQL's 0.85-1.55 s of one thread per table at 1M predictions and 100 repeats, runs
alternated, benchmarks/RESULTS.md stop 40).
coverage_by's column is carried as an integer
code read from a TEMP table per column and sample (``_cov_keys_table``): a stored column has
min / max statistics, so the split's groupings by that code use DuckDB's small-key aggregates.

Threshold: q_hat = the k-th smallest calibration score of the target, k = ceil((n+1)(1-alpha)),
computed in integers with alpha read as an exact fraction (see ``as_fraction``: a float is the simple
fraction it is nearest to, 0.1 -> 1/10, else its shortest decimal; a ``Fraction`` or "a/b" string is
taken as is). If k > n (few calibration
units) q_hat is undefined and every test set is the item's FULL option set. This is the split-conformal
quantile; the seeds' code ``np.quantile(s, ceil((n+1)(1-alpha))/n, method="higher")`` returns the
(k+1)-th order statistic instead (see ECOSYSTEM-NOTES "Conformal prediction").
Sampling scores are (m - c) / m, a handful of distinct values per group, so conformal_sampling
counts the calibration scores per value and repeat and picks q_hat from the running counts
(``_sampling_thresholds_sql``: the same order statistic) instead of sorting a band of scores.

Prediction set of a test unit: the options with s <= q_hat (same randomisation rule for APS);
coverage = target in set; sets may be empty (APS, or sampling when no option reaches the threshold).

Output per group: mean over repeats (each repeat: mean over its test units) of set size and coverage,
their sample standard deviations across repeats (summed in repeat order, so reruns give the same
doubles), q_hat mean / sd (over repeats with k <= n),
``n_full_repeats`` (repeats with k > n), n_cal / n_test per repeat, k (column ``k_order``, so it
never clashes with the stratum ``k``), empty-set rate.
``conformal_sampling`` adds majority-vote accuracy (the most chosen option is the target; ties go to
the smallest option_id; a pool where no sample chose an option has no vote and counts as wrong) and
hit rate in seed 002 G.2's sense (at least one of the M samples chose the target), over all units and
over the test units. ``conformal_coverage_by`` reports test coverage per value of another column
(``coverage_by``) with thresholds still calibrated per group.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from fractions import Fraction

import duckdb
import numpy as np

from equipoise.evaluators.metrics import columns, split_mask, split_test_sums, split_thresholds
from equipoise.evaluators.metrics.registry import (
    ITEM_CODE,
    POOL_FACT_COLUMNS,
    POOL_FACT_FIELDS,
    SQL_DIR,
    STRATA,
    Metric,
    _check_by,
    _materialized,
    cached_table,
    prepare,
    register,
    temp_tables,
    uses_facts,
)

# columns a split may be stratified by, or coverage reported by
CONF_STRATA: tuple[str, ...] = (
    *STRATA,
    "target_role",
    "has_gold",
    "abstain_expected",
    "task",
    "target_label",
)
SCORES: tuple[str, ...] = ("lac", "aps", "sampling")
_POOLS = {"item": "sc.item_id", "base": "sc.base_id"}
_MAX_DEN = 10**6
# half-width of the hash window searched for a stratum's split cutoff (``conf_split.sql``), in binomial
# standard deviations of the count below a fixed hash plus whole units: only speed depends on it (a
# window that misses the cutoff is widened to the full range), so the tests shrink it to 0 to
# exercise that path
WINDOW_SD = 6
WINDOW_PAD = 16
# buckets of [0, 1] counted for the band floor of the thresholds (``conf_split.sql``, ``bands``): only
# speed depends on it (more buckets: a band closer to its target size, more rows to count)
BAND_BUCKETS = 256
# bits of a mask word per slice of the test sums (``conf_split.sql``, ``test_slices``): the units are
# grouped once per slice, by the slice's value (2**SLICE_BITS of them); a power of two, so that a
# slice never straddles two words. Only speed depends on it (fewer, larger groupings vs more, smaller)
SLICE_BITS = 8
# over the store's facts, select the option units' split with numpy (``split_mask``) instead of the
# SQL of ``conf_mask.sql``: the same mask words, 0.67-0.78 against 1.05-1.35 s of one thread at 1M
# predictions (benchmarks/RESULTS.md, stop 33); the tests switch it off to
# compare the two bit for bit
NUMPY_MASK = True
# ... a run of whole strata of at most this many units (predictions of the sample with option
# scores) at a time (a larger stratum is a run of its own). Its arrays live outside DuckDB's memory
# limit, and the pass's cap sets aside only 48 MiB plus 3% of its limit for all such memory
# (``registry.PASS_OUTSIDE_*``). Measured at stop 33 (benchmarks/RESULTS.md): 26 MiB at 475k units,
# where the 1M-prediction passes peaked 365-377 MiB under a 415 MiB file, and 239 MiB at 4.75M
# units in one piece, more than the 155 MiB set aside there; so until stop 38 the SQL form ran above
# 750k units. Stop 38's window selection allocates about 25 bytes a unit more than the partition did
# (53-61 against 28-36 bytes a unit inside calibration_words at 20-100 repeats, tracemalloc, plus 20
# for the fetched keys and rowids; benchmarks/RESULTS.md), so a run holds at most 500k units: about
# the 37 MB that 750k units took before, at any store size (stop 41's in-place hashing: 43-50
# bytes a unit at 100 repeats against 60-66 before, tracemalloc). The SQL form, whose time grows faster
# than the repeats (its units carry one hash column per repeat: at 4.75M units 4.8 s of one thread
# for 20 repeats, 51.9 s for 100), is left to the views and the sampling pools
NUMPY_MASK_CHUNK_UNITS = 500_000
# ... and for at most this many (stratum, repeat) steps. Measured on stop 33's loop, one Python step
# per stratum and repeat (~10 us each at 1M predictions: 0.23 s for 33 strata x 20 repeats, 0.41 s
# for 1,000 x 20), where the SQL handles every stratum in one set-based pass. Stop 38's windows
# handle all strata of a repeat in one vectorized step, but a stratum whose window misses still
# takes a Python step; the limit has not been measured again and stays
NUMPY_MASK_MAX_STEPS = 20_000
# over the store's facts, pick the LAC / plain APS thresholds of every repeat with numpy
# (``split_thresholds``) instead of ``thr_own`` of ``conf_split.sql``: the same q_hat, bit for bit.
# At 100 repeats over the 1M benchmark store the SQL took 0.40-0.59 s of one thread and raised the
# RSS by 65-71 MiB (124 MiB with two threads), memory DuckDB's cap did not bound; the tests switch it
# off to compare the two (benchmarks/RESULTS.md, stop 39). Over groups in runs of at most
# NUMPY_MASK_CHUNK_UNITS units, like the mask; a group larger than that is left to the SQL. Held
# outside DuckDB (tracemalloc, 475k units, 100 repeats): 49 bytes a unit over 33 groups, 91 in one
NUMPY_THRESHOLDS = True
# LAC / plain APS test sums on the shared mask table over the store's facts summed by numpy
# (``split_test_sums``) instead of ``test_rep_own`` of ``conf_split.sql``: the same integers. The
# tests switch it off to compare the two. The units go to numpy in runs of at most
# NUMPY_TEST_SUMS_RUN_ROWS rows of the mask table, which bounds numpy's arrays (outside DuckDB's cap)
NUMPY_TEST_SUMS = True
NUMPY_TEST_SUMS_RUN_ROWS = 32_768

# The split's random stream (see the module docstring): SplitMix64 (Steele, Lea & Flood 2014) over
# unsigned 64-bit integers. SQL has no wrapping 64-bit multiply, so each product is taken in UHUGEINT
# (128 bits: the product of two 64-bit values always fits) and masked back to its low 64 bits.
_M64 = (1 << 64) - 1
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_MUL = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _u128(value: int) -> str:
    return f"'{value}'::UHUGEINT"  # a string literal: bare literals this large are read as DOUBLE


def _split_hashes_sql(repeats: int, source: str) -> str:
    """The query ``source`` (with a UBIGINT column ``kb``, the base of a unit key) plus columns h_0 ..
    h_{repeats-1}: h_r is output r + 1 of SplitMix64 seeded with kb, i.e. mix(kb + (r + 1) * gamma mod
    2**64). Plain integer columns, one projection per step of the stream (each step's input computed
    once, every repeat side by side), not lists transformed by lambdas: (r + 1) * gamma mod 2**64 is a
    literal per column, so each step is one 128-bit product (or sum) masked to 64 bits."""
    m = _u128(_M64)
    rs = range(repeats)
    cols = ", ".join(
        f"((kb::UHUGEINT + {_u128((r + 1) * SPLITMIX_GAMMA & _M64)}) & {m})::UBIGINT AS z_{r}" for r in rs
    )
    query = f"SELECT *, {cols} FROM ({source})"
    for shift, mul in zip((30, 27), SPLITMIX_MUL, strict=True):
        mixed = ", ".join(
            f"((xor(z_{r}, z_{r} >> {shift})::UHUGEINT * {_u128(mul)}) & {m})::UBIGINT AS z_{r}" for r in rs
        )
        query = f"SELECT * REPLACE ({mixed}) FROM ({query})"
    zs = ", ".join(f"z_{r}" for r in rs)
    hs = ", ".join(f"xor(z_{r}, z_{r} >> 31) AS h_{r}" for r in rs)
    return f"SELECT * EXCLUDE ({zs}), {hs} FROM ({query})"


def _split_hashes_expr(repeats: int) -> str:
    """SQL for the list of the split hashes of one unit key, repeats 0..repeats-1, given its base
    ``kb`` (UBIGINT) in the enclosing query: the columns of ``_split_hashes_sql`` (what the split
    computes) as one list, so a test can pin the stream the split uses."""
    hs = ", ".join(f"h_{r}" for r in range(repeats))
    return f"(SELECT [{hs}] FROM ({_split_hashes_sql(repeats, 'SELECT b AS kb FROM (SELECT kb AS b)')}))"


# repeats: 100 random calibration / test splits, the count issue 13 names. Until stop 39 the default
# was 20, chosen with the first metrics and kept while a pass at 100 peaked above the store file's
# size (the SQL thresholds, see NUMPY_THRESHOLDS); more splits only shrink the Monte Carlo error of
# the means and sds over splits (benchmarks/RESULTS.md, stop 39, for the cost)
COMMON_PARAMS: dict[str, object] = {
    "alpha": 0.1,
    "cal_fraction": 0.3,
    "repeats": 100,
    "seed": 0,
    "stratify": ("target_role",),
    "sample_index": 0,
}


def as_fraction(value: object, name: str) -> Fraction:
    """A probability in (0, 1) as an exact fraction, so that k and the split sizes are exact integers.

    A ``Fraction`` or an "a/b" / decimal string is taken as is. A float is read as the simple fraction
    it stands for when it is the double nearest one with denominator <= 10**6 (0.1 -> 1/10, 1/3 ->
    1/3: floating point cannot write these exactly, and reading 0.3333333333333333 as a decimal would
    move k at n = 2), otherwise as its shortest decimal repr (0.1234567 -> 1234567/10**7)."""
    try:
        if isinstance(value, Fraction):
            frac = value
        elif isinstance(value, str):
            frac = Fraction(value)
        elif isinstance(value, bool):
            raise TypeError("a bool is not a probability")
        else:
            number = float(value)  # type: ignore[arg-type]
            frac = Fraction(repr(number))
            simple = frac.limit_denominator(_MAX_DEN)
            if float(simple) == number:
                frac = simple
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}") from exc
    if not 0 < frac < 1:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return frac


def conformal_k(n: int, alpha: object) -> int:
    """k = ceil((n + 1)(1 - alpha)) in integer arithmetic (the SQL uses the same formula)."""
    a = as_fraction(alpha, "alpha")
    return ((n + 1) * (a.denominator - a.numerator) + a.denominator - 1) // a.denominator


def _int(params: dict, name: str, lo: int) -> int:
    """An integer parameter; it is pasted into SQL, so anything but a plain integer is refused here
    (a string such as '1; DROP TABLE runs' included), with the parameter's name in the message."""
    value = params[name]
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= lo  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def _column(value: object, name: str) -> str:
    if value not in CONF_STRATA:
        raise ValueError(f"{name}: unknown column {value!r}; allowed: {', '.join(CONF_STRATA)}")
    return str(value)


def _stratify(params: dict) -> list[str]:
    cols = params["stratify"]
    cols = [] if cols is None else [cols] if isinstance(cols, str) else list(cols)  # type: ignore[arg-type]
    return [_column(c, "stratify") for c in cols]


# a CTE's head in the composed queries: its name at the start of a line (every fragment writes them
# so) or right after the query's WITH
_CTE_HEAD = re.compile(r"(?:^|(?<=\AWITH ))(\w+) AS (?:NOT MATERIALIZED |MATERIALIZED )?\(", re.MULTILINE)
# what is not code: a comment to the end of its line, or a string literal
_NOT_CODE = re.compile(r"--[^\n]*|'(?:[^']|'')*'")


def _referenced_ctes(sql: str) -> str:
    """``sql`` (WITH, CTEs, the final statement) without the CTEs that nothing it runs refers to.

    Why: a conformal query is composed of whole fragments (units, mask, split, summary), and a
    metric that reads its thresholds or test sums from the connection's tables leaves most of the
    split's CTEs unreferenced. DuckDB never runs those, but it parses every one of them: at 1M
    predictions that was 5-15 ms of each query's planning (20 repeats write one expression per
    repeat in most of them), about 0.06 CPU s over conformal_aps, coverage_by and conformal_lac.
    The result is the same query: the kept CTEs are the text of the originals, in their order, with
    the comments before each. Parentheses and names are read from the code alone (comments and
    string literals blanked); a name is a reference wherever it appears as a word, in any case, so a
    CTE is kept rather than dropped when in doubt, and a query this scan cannot read with certainty
    (block comments, quoted identifiers, a CTE head the pattern misses, a name defined twice) is
    returned as it is."""
    code = _NOT_CODE.sub(lambda m: " " * len(m.group()), sql)
    # only what the composed fragments write: no block comments or quoted identifiers (whose
    # brackets the scan would count), names compared in lower case as DuckDB does
    if not code.startswith("WITH ") or "/*" in code or '"' in code:
        return sql
    ctes: list[tuple[str, int, int, int]] = []  # name, start of its text, end of its head, end
    start = len("WITH ")
    for head in _CTE_HEAD.finditer(code):
        if head.start() < start:  # a head inside the previous CTE's body
            continue
        if code[start : head.start()].strip() not in ("", ","):
            return sql  # text that is no separator before this head: a CTE the pattern missed, or a
            # line of the final statement that looks like a head; either way, leave the query as is
        depth, pos = 0, head.end() - 1
        for pos in range(head.end() - 1, len(code)):
            depth += {"(": 1, ")": -1}.get(code[pos], 0)
            if depth == 0:
                break
        else:
            return sql  # unbalanced: leave the query to DuckDB's parser as it is
        ctes.append((head.group(1).lower(), start, head.end(), pos + 1))
        start = pos + 1
    if not ctes:
        return sql
    names = {name for name, *_ in ctes}
    if len(names) < len(ctes):
        return sql  # a name defined twice: DuckDB's error, not ours to hide

    def refs(text: str) -> set[str]:
        return names & set(re.findall(r"\w+", text.lower()))

    body = {name: code[h:e] for name, _, h, e in ctes}
    final = start
    wanted, todo = set(), refs(code[final:])
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo |= refs(body[name]) - wanted
    kept = [sql[s:e].lstrip().removeprefix(",").lstrip("\n") for name, s, _, e in ctes if name in wanted]
    rest = sql[final:].lstrip().removeprefix(",").lstrip()
    return "WITH " + ",\n".join(kept) + "\n" + rest if kept else rest


def _render(name: str, **values: object) -> str:
    return (SQL_DIR / name).read_text(encoding="utf-8").format(**values)


def _common(by: Sequence[str], params: dict) -> dict[str, object]:
    """Template values shared by every fragment (all validated: nothing user-typed reaches SQL raw)."""
    by = _check_by(by)
    alpha = as_fraction(params["alpha"], "alpha")
    cal = as_fraction(params["cal_fraction"], "cal_fraction")
    strat = _stratify(params)
    return {
        "by_cols": by,
        "strat_cols": strat,
        "by": "".join(f"{c}, " for c in by),
        "by_list": ", ".join(by) if by else "NULL",
        "sc_by_list": ", ".join(f"sc.{c}" for c in by) if by else "NULL",
        "gid_by": ", ".join(["gid", *by]),
        "g_by": "".join(f"g.{c}, " for c in by),
        "g_gid_by": ", ".join(["gid", *(f"g.{c}" for c in by)]),
        "strat_list": ", ".join(f"sc.{c}" for c in strat) if strat else "NULL",
        "alpha_num": alpha.numerator,
        "alpha_den": alpha.denominator,
        "alpha": repr(float(alpha)),
        "cal_num": cal.numerator,
        "cal_den": cal.denominator,
        "repeats": _int(params, "repeats", 1),
        "seed": _int(params, "seed", 0),
        "sample_index": _int(params, "sample_index", 0),
        "win_sd": float(WINDOW_SD),
        "win_pad": float(WINDOW_PAD),
        "band_buckets": BAND_BUCKETS,
    }


def _below(p: str) -> str:
    """APS mass strictly below probability ``p``: the unit's sorted list ``ps`` summed in order."""
    return f"coalesce(list_sum(list_filter(ps, lambda y: y < {p})), 0.0)"


def _aps_randomized(score: str, params: dict) -> bool:
    """Whether the scores are randomised APS (U depends on the seed and the option's identity, so
    they are computed from option rows, never read from the per-sample facts)."""
    return score == "aps" and bool(params.get("aps_randomized"))


def _option_score_sql(score: str, params: dict) -> dict[str, str]:
    """Template values of ``conf_option_units.sql`` for one score: the per-unit query ``probs``,
    what ``base`` takes from it, and the unit's score list ``ss`` and target score ``st``.

    The query groups ``option_probs`` itself, with the formulas of ``sample_probs`` (the fact tests
    compare the two paths cell by cell): what a connection whose ``sample_probs`` is a view (it
    would join ``scored`` again on every call) and randomised APS (U depends on the seed and the
    option's identity) use. LAC and plain APS on fixed base relations read the per-sample facts
    instead, on the shared mask table (``_cached_option_units``), and never render this."""
    sample = _int(params, "sample_index", 0)
    if score not in ("lac", "aps"):
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    randomized = _aps_randomized(score, params)
    pu_agg, pu_cols = "", ""
    if score == "lac":  # 1 - p of each option
        opt_list, opt_score, target_score = "ps", "1.0 - o", "1.0 - p_target"
    elif not randomized:
        opt_list, opt_score, target_score = "ps", f"1.0 - {_below('o')}", f"1.0 - {_below('p_target')}"
    else:
        # U ~ Uniform(0, 1): 52 bits of md5(seed, item, option identity), so the same item and option
        # draw the same U in calibration and in prediction, in every repeat and model
        u = (
            f"((('0x' || substr(md5('{_int(params, 'seed', 0)}:aps:' || item_id || ':' || option_id), 1, 13))"
            "::BIGINT + 0.5) / 4503599627370496.0)"
        )
        pu = f"{{'p': prob, 'u': {u}}}"

        def rand(x: str) -> str:
            p, w = f"struct_extract({x}, 'p')", f"struct_extract({x}, 'u')"
            return f"1.0 - {_below(p)} - (1.0 - {w}) * {p}"

        pu_agg = f", list({pu}) AS pu, any_value({pu}) FILTER (WHERE is_target) AS tu"
        pu_cols = ", pr.pu, pr.tu"
        opt_list, opt_score, target_score = "pu", rand("o"), rand("tu")
    return {
        "probs_sql": (
            "SELECT run_id, item_id, list_sort(list(prob)) AS ps, count(*) AS n_scored, "
            "bool_or(is_target) AS has_target, max(prob) FILTER (WHERE is_target) AS p_target"
            f"{pu_agg} FROM option_probs WHERE sample_index = {sample} GROUP BY run_id, item_id"
        ),
        "base_cols": (
            ", coalesce(no.n_opt, 0) - coalesce(pr.n_scored, 0) AS n_unscored_options, pr.ps, pr.p_target"
            + pu_cols
        ),
        "ss_expr": (
            f"list_concat(list_transform({opt_list}, lambda o: {opt_score}), "
            "list_resize([]::DOUBLE[], greatest(n_unscored_options, 0), 1.0))"
        ),
        "st_expr": f"CASE WHEN has_target THEN {target_score} ELSE 1.0 END",
    }


def _ids_sql(source: str, values: dict) -> str:
    """CTEs gkeys / skeys numbering the distinct values of the grouping and stratum columns in sort
    order (NULLs last): the same numbers as dense_rank() over the rows, from a hash DISTINCT and a
    sort of the few distinct keys instead of a sort of every row."""
    out = []
    for name, id_col, cols in (("gkeys", "gid", values["by_cols"]), ("skeys", "sid", values["strat_cols"])):
        if cols:
            out.append(f"{name} AS ({_numbering_sql(cols, id_col, source)})")
        else:
            out.append(f"{name} AS (SELECT 1 AS {id_col})")
    return ",\n".join(out) + ","


def _numbering_sql(cols: Sequence[str], id_col: str, source: str) -> str:
    """The distinct values of ``cols`` in ``source`` numbered ``id_col`` in sort order (``_ids_sql``)."""
    listed = ", ".join(cols)
    return (
        f"SELECT {listed}, row_number() OVER (ORDER BY {listed}) AS {id_col} "
        f"FROM (SELECT DISTINCT {listed} FROM {source})"
    )


def _ids_on(alias: str, cols: Sequence[str]) -> str:
    return " AND ".join(f"{alias}.{c} IS NOT DISTINCT FROM sc.{c}" for c in cols) or "true"


# pools of several items (pool 'base' only: an 'item' pool is one item): distinct option identities
# over all of them
_MULTI_ITEM_OPTIONS = """multi_item_options AS (
    SELECT x.gid, x.sid, x.run_id, x.ukey, count(DISTINCT o.option_id) AS n_options
    FROM (
        SELECT DISTINCT s.gid, s.sid, s.run_id, s.ukey, s.dataset_id, s.config, s.item_id
        FROM samp s
        SEMI JOIN (SELECT gid, sid, run_id, ukey FROM pools WHERE item_min <> item_max) mp
            USING (gid, sid, run_id, ukey)
    ) x
    JOIN options o USING (dataset_id, config, item_id)
    GROUP BY x.gid, x.sid, x.run_id, x.ukey
),"""
_NO_MULTI_ITEM_OPTIONS = """multi_item_options AS (
    SELECT NULL::BIGINT AS gid, NULL::BIGINT AS sid, NULL::VARCHAR AS run_id, NULL::VARCHAR AS ukey,
           NULL::BIGINT AS n_options
    WHERE false
),"""


# A pool's counts, majority vote and sampling scores, written once for the two queries that build
# pools: the write-time fact of pools 'item' (``sql/sampling_pools.sql``) and the query grouping
# the samples itself (``sql/conf_sampling_units.sql``: views, pool 'base'), so the two cannot drift
# apart. The definitions are in conf_sampling_units.sql's header.
# aggregates over a pool's samples
_POOL_AGGREGATES = """count(*) AS m, count(parsed_option_id) AS m_option,
           CASE WHEN min(target_option_id) IS NULL THEN 0
                WHEN min(target_option_id) = max(target_option_id) THEN 1 ELSE 2 END AS n_targets,
           min(target_option_id) AS target_option_id,
           coalesce(bool_or(parsed_option_id = target_option_id), false) AS hit,
           coalesce(list(parsed_option_id) FILTER (WHERE parsed_option_id IS NOT NULL), []) AS chosen"""
# the pool rows of {pools} with the chosen option ids sorted (string order) and how many samples
# chose each (opts, cs aligned), the majority vote (the first largest count: ties go to the smallest
# option_id) and the target's count
_POOL_VOTES = """SELECT *, opts[list_position(cs, list_max(cs))] AS mv_option_id,
           len(list_filter(chosen, lambda x: x = target_option_id)) AS c_target
    FROM (SELECT *, list_transform(opts, lambda d: len(list_filter(chosen, lambda x: x = d))) AS cs
          FROM (SELECT *, list_sort(list_distinct(chosen)) AS opts FROM {pools}))"""
# distinct option identities per item
_ITEM_OPTIONS = """SELECT dataset_id, config, item_id, count(DISTINCT option_id) AS n_options
    FROM options
    GROUP BY dataset_id, config, item_id"""


def _pool_outcome(pool: str, n_options: str) -> str:
    """Select-list items of a voted pool row ``pool`` (``_POOL_VOTES``) with ``n_options`` option
    identities: mv_correct (no vote counts as wrong), the scores ss of every option identity (the
    chosen ones as (m - c) / m, one rounding, then 1.0 for each option no sample chose) and the
    target's st; NULL scores when the item has no options."""
    return (
        f"coalesce({pool}.mv_option_id = {pool}.target_option_id, false) AS mv_correct,\n"
        f"       CASE WHEN {n_options} IS NOT NULL THEN\n"
        f"           list_concat(list_transform({pool}.cs, lambda c: ({pool}.m - c)::DOUBLE / {pool}.m),\n"
        f"                       list_resize([]::DOUBLE[], {n_options} - len({pool}.cs), 1.0))\n"
        "       END AS ss,\n"
        f"       CASE WHEN {n_options} IS NOT NULL THEN ({pool}.m - {pool}.c_target)::DOUBLE / {pool}.m\n"
        "       END AS st"
    )


POOLS_RELATION = "sampling_pools"


def sampling_pools_sql() -> str:
    """The per run x item sample pools of conformal_sampling with pool 'item' (``sql/sampling_pools.sql``,
    a SELECT over ``scored`` and ``options``), with every column a conformal metric may group,
    stratify or report coverage by (``CONF_STRATA``): a write-time fact (``facts.py``)."""
    cols = dict.fromkeys(["dataset_id", *(c for c in CONF_STRATA if c != "run_id")])
    return _render(
        "sampling_pools.sql",
        strata=", ".join(f"sc.{c}" for c in cols),
        pool_aggregates=_POOL_AGGREGATES,
        pool_votes=_POOL_VOTES.format(pools="pools"),
        item_options=_ITEM_OPTIONS,
        pool_outcome=_pool_outcome("v", "io.n_options"),
    )


def pool_facts_sql() -> str:
    """Per run x item of ``scored``, its pool 'item' (``sql/sampling_pools.sql``) keyed by (run_id,
    item_id, first_sample), the pool's smallest sample_index, without strata: what facts.py writes
    onto that sample's row of ``facts_scored`` (``registry.POOL_FACT_COLUMNS``), whose other columns
    are the strata the pool's row would join from that same sample."""
    return _render(
        "sampling_pools.sql",
        strata="v.first_sample",
        pool_aggregates=_POOL_AGGREGATES,
        pool_votes=_POOL_VOTES.format(pools="pools"),
        item_options=_ITEM_OPTIONS,
        pool_outcome=_pool_outcome("v", "io.n_options"),
    )


def _pooled(score: str, params: dict) -> bool:
    """Whether the units are sample pools of one run x item (conformal_sampling, pool 'item')."""
    return score == "sampling" and params.get("pool", "item") == "item"


def _prepare_pools(con: duckdb.DuckDBPyConnection, score: str, params: dict) -> None:
    """Make the relation ``sampling_pools`` that the units of a connection with fixed base relations
    read for pool 'item' (``conf_sampling_units_pooled.sql``): a view over the store's fact table
    when the facts are in use, else a TEMP table computed once from the connection's ``scored`` (so a
    pass computing several sampling metrics groups the samples once). Views (a connection that may
    write) compute the units from the samples in every query (``conf_sampling_units.sql``)."""
    if not _fixed(con) or not _pooled(score, params):
        return
    if uses_facts(con):
        # the pools are the facts_scored rows that carry one (each pool's first sample row, facts.py),
        # with their rowid sc_row: the key of the shared option mask table (``_query``)
        cols = dict.fromkeys(["run_id", "item_id", "dataset_id", *CONF_STRATA, ITEM_CODE])
        pool = ", ".join(f"{c} AS {f}" for c, f in zip(POOL_FACT_COLUMNS, POOL_FACT_FIELDS, strict=True))
        con.execute(
            f"""CREATE OR REPLACE TEMP VIEW {POOLS_RELATION} AS
                SELECT rowid AS sc_row, {", ".join(cols)}, {pool}
                FROM main.facts_scored WHERE pool_m IS NOT NULL"""
        )
    else:
        cached_table(con, POOLS_RELATION, sampling_pools_sql())


def _pools_coded(con: duckdb.DuckDBPyConnection | None, score: str, params: dict, fixed: bool) -> bool:
    """Whether the units are pools 'item' read from the store's facts (``_prepare_pools``), whose
    rows carry the integer item code (``registry.ITEM_CODE``, facts.py) and the rowid ``sc_row`` of
    the pool's row in ``facts_scored``. They join the shared option mask table by that rowid, as
    LAC's units do (``_query``: the pool's row is its first sample's, the mask's unit row where that
    is the mask's sample), and their inline mask reads the split keys of the codes, the table the
    option mask over the facts reads (``_split_keys_source``), so md5 runs once per item in a pass,
    not once for the option units and again for the pools. The code has the item_id's string
    order, so the split (ordered by (h, item_id, run_id)) is the same. ``fixed``: ``_fixed(con)``,
    already looked up by the caller (a catalog query)."""
    return fixed and _pooled(score, params) and con is not None and _coded(con)


def _units_sql(
    score: str, values: dict, params: dict, cov: str | None, from_facts: bool = False, coded: bool = False
) -> str:
    """The CTEs ending in ``units`` of a metric's own query; ``coded`` (pool 'item' over the store's
    facts, ``_pools_coded``): the pooled units also carry the pool's integer item code."""
    cov_expr = f"sc.{cov}" if cov else "NULL"
    # only the columns the units need (not sc.*: ~40 columns, raw_output included, which at 10M
    # predictions is what ran out of memory)
    keep = ["run_id", "item_id", "dataset_id", "config", *values["by_cols"], *values["strat_cols"]]
    if cov:
        keep.append(cov)
    ids = {"gid_on": _ids_on("g", values["by_cols"]), "sid_on": _ids_on("s", values["strat_cols"])}
    if score == "sampling":
        pool = params.get("pool", "item")
        if pool not in _POOLS:
            raise ValueError(f"pool must be one of {sorted(_POOLS)}, got {pool!r}")
        if from_facts and pool == "item":
            # one row per pool, computed once (``_prepare_pools`` made the relation)
            return _render(
                "conf_sampling_units_pooled.sql",
                cov_expr=cov_expr,
                unit_cols=", ".join(
                    dict.fromkeys([*keep, *POOL_FACT_FIELDS, *([ITEM_CODE, "sc_row"] * coded)])
                ),
                code_cols=f", {ITEM_CODE}, sc_row" if coded else "",
                id_ctes=_ids_sql("sc_all", values),
                **ids,
                **values,
            )
        keep += ["base_id", "parsed_option_id", "target_option_id"]
        cols = ", ".join(dict.fromkeys(keep))
        return _render(
            "conf_sampling_units.sql",
            pool_col=_POOLS[str(pool)],
            pool_aggregates=_POOL_AGGREGATES,
            pool_votes=_POOL_VOTES.format(pools="pools WHERE n_targets = 1"),
            item_options=_ITEM_OPTIONS,
            pool_outcome=_pool_outcome("p", "p.n_options"),
            multi_item_options=_MULTI_ITEM_OPTIONS if pool == "base" else _NO_MULTI_ITEM_OPTIONS,
            cov_expr=cov_expr,
            unit_cols=cols,
            id_ctes=_ids_sql("sc_all", values),
            **ids,
            **values,
        )
    return _render(
        "conf_option_units.sql",
        sc0_materialized="NOT MATERIALIZED" if from_facts else "MATERIALIZED",
        cov_expr=cov_expr,
        unit_cols=", ".join(dict.fromkeys(keep)),
        id_ctes=_ids_sql("sc0", values),
        **ids,
        **_option_score_sql(score, params),
        **values,
    )


def _bit(r: int) -> str:
    """The UBIGINT literal of repeat r's bit in its mask word m{r // 64}."""
    return f"'{1 << (r % 64)}'::UBIGINT"


def _cal(r: int, row: str = "") -> str:
    """SQL: the unit is calibration in repeat r (its mask bit is set); ``row``: the prefix of its mask
    words' names (e.g. "x." for a struct x)."""
    return f"({row}m{r // 64} & {_bit(r)}) <> 0"


def _test(r: int) -> str:
    """SQL: the unit is test in repeat r (its mask bit is clear)."""
    return f"(m{r // 64} & {_bit(r)}) = 0"


def _words(repeats: int) -> int:
    return (repeats + 63) // 64


def _word_cols(repeats: int, alias: str = "") -> str:
    """SQL column list of a unit's mask words m0, m1, ... (``alias.m0``, ... with an ``alias``)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}m{w}" for w in range(_words(repeats)))


def _null_words(repeats: int) -> str:
    """SQL select list: the mask words m0, m1, ... of a unit without option scores (all NULL)."""
    return ", ".join(f"NULL::UBIGINT AS m{w}" for w in range(_words(repeats)))


def _mask_sql(repeats: int) -> dict[str, str]:
    """Template values of ``conf_mask.sql``, one expression per repeat r, side by side: the hash
    columns h_r, the counts of keys below a stratum's guessed hash window [lo, hi) and its sorted keys
    (wl_r, listed in the same scan), the checked window (wlo_r, whi_r), need_r and ok_r (the guess
    held the cutoff), the cutoff (the need_r-th key of wl_r, or of the widened window's keys where the
    guess missed; split into ch_r and cu_r), and the mask words of a unit (bit r: its key (h_r, uid)
    is at or below the cutoff (ch_r, cu_r))."""
    rs = range(repeats)
    key = "(h_{r}::UHUGEINT << 64) + uid::UHUGEINT"
    guess = "h_{r} >= lo AND (hi IS NULL OR h_{r} < hi)"
    in_window = "h_{r} >= wlo_{r} AND (whi_{r} IS NULL OR h_{r} < whi_{r})"
    cut_agg = (
        f"list_sort(list(CASE WHEN {in_window} THEN {key} END) "
        f"FILTER (WHERE {in_window}))[any_value(need_{{r}})] AS hu_{{r}}"
    )
    words = []
    for w in range(_words(repeats)):
        terms = [
            f"CASE WHEN u.h_{r} < c.ch_{r} OR (u.h_{r} = c.ch_{r} AND u.uid <= c.cu_{r}) "
            f"THEN {_bit(r)} ELSE 0::UBIGINT END"
            for r in range(64 * w, min(64 * (w + 1), repeats))
        ]
        words.append("(" + "\n           | ".join(terms) + f") AS m{w}")
    sep = ",\n           "
    return {
        "hash_names": ", ".join(f"h_{r}" for r in rs),
        "below": sep.join(f"count_if(h_{r} < lo) AS c_lo_{r}" for r in rs),
        "window_lists": sep.join(
            f"list_sort(list(CASE WHEN {guess} THEN {key} END) FILTER (WHERE {guess})) AS wl_{r}".format(r=r)
            for r in rs
        ),
        "window_cols": sep.join(
            f"CASE WHEN w.c_lo_{r} < st.n_cal THEN st.lo ELSE 0::UBIGINT END AS wlo_{r}, "
            f"CASE WHEN {c_hi} >= st.n_cal THEN st.hi END AS whi_{r}, "
            f"(st.n_cal - CASE WHEN w.c_lo_{r} < st.n_cal THEN w.c_lo_{r} ELSE 0 END)::BIGINT AS need_{r}, "
            f"w.c_lo_{r} < st.n_cal AND {c_hi} >= st.n_cal AS ok_{r}"
            for r in rs
            for c_hi in [f"(w.c_lo_{r} + coalesce(len(w.wl_{r}), 0))"]
        ),
        "all_ok": " AND ".join(f"ok_{r}" for r in rs),
        "cut_aggs": sep.join(cut_agg.format(r=r) for r in rs),
        "cut_pick": sep.join(
            f"CASE WHEN w.ok_{r} THEN d.wl_{r}[w.need_{r}] ELSE m.hu_{r} END AS hu_{r}" for r in rs
        ),
        "cut_cols": sep.join(
            f"(hu_{r} >> 64)::UBIGINT AS ch_{r}, (hu_{r} & 18446744073709551615::UHUGEINT)::BIGINT AS cu_{r}"
            for r in rs
        ),
        "mask_words": sep.join(words),
    }


def _per_repeat(template: str, repeats: int) -> str:
    """One aggregate per repeat, side by side: ``template`` formatted with r, {cal} / {test} (the
    repeat's mask bit set / clear) and {q} (the column of its threshold)."""
    return ",\n           ".join(
        template.format(r=r, cal=_cal(r), test=_test(r), q=f"q_{r}") for r in range(repeats)
    )


def _listed(template: str, repeats: int) -> str:
    """``template`` formatted per repeat r (with r and {cal}: the repeat's mask bit of a list element
    x is set), as one SQL list literal."""
    return "[" + ", ".join(template.format(r=r, cal=_cal(r, "x.")) for r in range(repeats)) + "]"


def _split_extra(score: str, repeats: int) -> dict[str, str]:
    """Template values of ``conf_split.sql``: q_hat's calibration scores (one sorted band list per
    group, filtered per repeat by its mask bit), the per-repeat aggregates over the unit rows
    (counts of calibration, the test units whose outcome depends on the repeat), the slices of the
    mask words that give every repeat's test sums (``test_slices``), and the lists that turn them
    into one row per repeat, and a test unit's option counts at or below q_lo / q_hi (``n_lo``,
    ``n_hi``); for sampling units also the majority-vote and hit sums."""
    counts = ["n", "lo", "cv", "em"]
    words = _words(repeats)
    # a test unit's options with s <= q (q: q_lo or q_hi of its group)
    n_le = {q: f"len(list_filter(u.ss, lambda x: x <= q.{q}))" for q in ("q_lo", "q_hi")}
    if score == "sampling":
        # every sampling score (m - c) / m lies in [0, 1]: at q >= 1 every option is in the set
        # (most groups: q_hat = 1 in every repeat), counted without filtering the list
        n_le = {q: f"CASE WHEN q.{q} >= 1.0 THEN len(u.ss) ELSE {e} END" for q, e in n_le.items()}
    slice_aggs = "count(*) AS n, sum(n_lo) AS lo, count_if(cv_all) AS cv, count_if(em_all) AS em"
    extra = {"per_rep_extra": "", "rep_stats_extra": "", "test_unit_cols": ""}
    if score == "sampling":
        counts += ["mv", "ht"]
        slice_aggs += ", count_if(mv_correct) AS mv, count_if(hit) AS ht"
        extra = {
            "test_unit_cols": ", u.mv_correct, u.hit",
            "per_rep_extra": ", sum(mv)::DOUBLE / sum(n) AS mv_acc, sum(ht)::DOUBLE / sum(n) AS hit",
            "rep_stats_extra": ",\n           list_avg(list(mv_acc ORDER BY rep)) AS mv_accuracy_test"
            ",\n           list_avg(list(hit ORDER BY rep)) AS hit_rate_test",
        }
    # slice j: SLICE_BITS bits of a mask word, repeats j * SLICE_BITS .. (j + 1) * SLICE_BITS - 1
    per_word = 64 // SLICE_BITS
    slices = "\n    UNION ALL\n    ".join(
        f"SELECT gid, cov, {j} AS j, ((m{j // per_word} >> {SLICE_BITS * (j % per_word)}) "
        f"& {(1 << SLICE_BITS) - 1}::UBIGINT)::INTEGER AS v,\n"
        f"           {slice_aggs}\n    FROM test_units\n    GROUP BY gid, cov, v"
        for j in range((repeats + SLICE_BITS - 1) // SLICE_BITS)
    )
    # test sums of a repeat: all units minus its calibration units, plus its border units or options
    border = {"lo": "bo.bd", "cv": "bu.bcv", "em": "bu.bem"}
    rep_cols = ",\n           ".join(
        f"(t.{c} - coalesce(c.{c}, 0){f' + coalesce({border[c]}, 0)' if c in border else ''})::BIGINT"
        f" AS {'sz' if c == 'lo' else c}"
        for c in counts
    )
    return {
        **extra,
        "n_lo": n_le["q_lo"],
        "n_hi": n_le["q_hi"],
        # a band unit as a struct of its target score and mask words; per repeat, the scores of the
        # band's calibration units (the sorted list filtered by the repeat's bit: still sorted)
        "band_row": "{" + ", ".join(["'st': u.st", *(f"'m{w}': u.m{w}" for w in range(words))]) + "}",
        "band_lists": _listed("list_transform(list_filter(bl, lambda x: {cal}), lambda x: x.st)", repeats),
        "null_aggs": _per_repeat("count_if({cal}) AS nn_{r}", repeats),
        "null_n": _listed("nn_{r}", repeats),
        "full_aggs": _per_repeat(
            "count_if({cal} AND st IS NOT NULL) AS fn_{r}, max(st, m_top) FILTER (WHERE {cal}) AS ft_{r}",
            repeats,
        ),
        "full_n": _listed("fn_{r}", repeats),
        "full_top": _listed("ft_{r}", repeats),
        "q_cols": ", ".join(f"coalesce(qs[{r + 1}], 'infinity'::DOUBLE) AS q_{r}" for r in range(repeats)),
        "test_slices": slices,
        "slice_sums": ", ".join(f"sum({c}) AS {c}" for c in counts),
        "bu_aggs": _per_repeat(
            "count_if({test} AND cv_border AND st <= {q}) AS bcv_{r}, "
            "count_if({test} AND em_border AND mn > {q}) AS bem_{r}",
            repeats,
        ),
        "bu_cv": _listed("bcv_{r}", repeats),
        "bu_em": _listed("bem_{r}", repeats),
        "border_aggs": _per_repeat("count_if({test} AND s <= {q}) AS bd_{r}", repeats),
        "bd_list": _listed("bd_{r}", repeats),
        "mask_cols": _word_cols(repeats, "u"),
        "test_rep_cols": rep_cols,
        "slice_bits": str(SLICE_BITS),
    }


def _split_keys_sql(values: dict, keys: str, coded: bool = False) -> str:
    """The split hashes of every distinct unit key of ``keys`` (a query with one column ``ukey``), as
    columns h_0, h_1, ... (repeat r), and its rank ``uk`` in string order (the tie-break of the split
    order, as an integer). md5 runs once per key; the hashes are integer columns (``_split_hashes_sql``).

    ``coded``: ``keys`` has one row per item, ``ukey`` its integer code (``registry.ITEM_CODE``: the
    item_id's rank in string order) and ``s`` the item_id string, which md5 reads; the code is
    then the key and its own rank (any strictly increasing map of the strings gives the same order)."""
    key, rank = ("s", "ukey") if coded else ("ukey", "row_number() OVER (ORDER BY ukey)")
    based = f"SELECT ukey, {rank} AS uk, {_key_base_sql(values['seed'], key)} AS kb FROM ({keys})"
    return f"SELECT * EXCLUDE (kb) FROM ({_split_hashes_sql(values['repeats'], based)})"


def _key_base_sql(seed: int, key: str) -> str:
    """SQL: the split stream's seed s0 of unit key ``key`` (an expression), the first 16 hex digits of
    md5('<seed>:<key>') as a UBIGINT (module docstring)."""
    return f"('0x' || substr(md5('{seed}:' || {key}), 1, 16))::UBIGINT"


def _split_keys_source(con: duckdb.DuckDBPyConnection | None, values: dict, key_col: str) -> str:
    """Where the split hashes come from: computed for the query's own units, or, when the base
    relations are fixed for the connection (a read-only pass over many metrics, see
    ``registry.prepare``), from a TEMP table of every item_id / base_id of ``scored`` computed once
    per seed and repeat count and shared by the conformal metrics of the pass (the hashes depend on
    nothing but the key, the seed and the repeat, so the shared table gives the same numbers)."""
    if not _fixed(con):
        # the item code is a fact column: a query's own units never carry it (md5 would hash the code)
        assert key_col != ITEM_CODE
        return _split_keys_sql(values, "SELECT DISTINCT ukey FROM units")
    assert con is not None
    coded = key_col == ITEM_CODE  # keyed by the facts' integer item code (``_coded``)
    keys = (
        f"SELECT {ITEM_CODE} AS ukey, any_value(item_id) AS s FROM main.facts_scored GROUP BY {ITEM_CODE}"
        if coded
        else f"SELECT DISTINCT {key_col} AS ukey FROM scored"
    )
    table = cached_table(
        con, _split_keys_table(values, key_col), lambda: _split_keys_sql(values, keys, coded)
    )
    return f"SELECT * FROM {table}"


def _split_keys_table(values: dict, key_col: str) -> str:
    """The name of a connection's shared TEMP table of split hashes (``_split_keys_source``)."""
    return f"_conf_split_keys_{key_col}_{values['seed']}_{values['repeats']}"  # validated integers


def _fixed(con: duckdb.DuckDBPyConnection | None) -> bool:
    """Whether the base relations are fixed tables for ``con`` (facts or TEMP tables, not views)."""
    return con is not None and _materialized(con)


def _key_col(score: str, params: dict) -> str:
    return "base_id" if score == "sampling" and params.get("pool", "item") == "base" else "item_id"


# what the split (``conf_split.sql``) reads of a unit besides its mask: a metric's inline mask
# carries these through, and no more (the pools' counts and target id, read by the summary from
# ``units``, would only widen the materialized rows: at 10M predictions they spilled)
_SPLIT_COLS = "gid, sid, run_id, ukey, cov, ss, st"
_SAMPLING_SPLIT_COLS = _SPLIT_COLS + ", mv_correct, hit"


def _inline_mask(
    con: duckdb.DuckDBPyConnection | None,
    score: str,
    values: dict,
    params: dict,
    cols: str | None = None,
    key_col: str | None = None,
) -> str:
    """The CTEs of ``conf_mask.sql`` computing the mask of the query's own ``units``, passing the
    columns ``cols`` of each unit through to ``unit_mask`` (default: what the split reads). A
    metric's own query carries them (at 10M predictions that was faster than joining the mask back
    to the units on their four identity columns), without run_id and ukey once the unit's integer
    key is computed (the shared mask table keeps the units' rowids instead, see
    ``_option_mask_table``); ``key_col``: the split keys' column (default: the score's unit key)."""
    if cols is None:
        cols = _SAMPLING_SPLIT_COLS if score == "sampling" else _SPLIT_COLS
    keys = _split_keys_source(con, values, key_col or _key_col(score, params))
    mask = _render(
        "conf_mask.sql",
        split_keys_sql=keys,
        **values,
        **_mask_sql(values["repeats"]),
    )
    return f"mask_units AS (SELECT {cols} FROM units),\n{mask},\n"


def _row_relation(con: duckdb.DuckDBPyConnection, relation: str) -> str:
    """The table holding base relation ``relation`` on a connection with fixed base relations, so
    that its ``rowid`` can be read: the connection's TEMP table of that name, or over the store's
    facts ``facts_scored`` for ``scored`` (the TEMP view over it has no rowid). Over the facts no
    query asks for ``sample_probs`` rowids (the option units are ``_coded`` there and read the
    scores from ``facts_scored``), and that relation has no table of its own (facts.FACTS_FORMAT 8)."""
    if not uses_facts(con):
        return relation
    if relation != "scored":
        raise ValueError(f"over the store's facts, {relation!r} has no table of its own to read rowids from")
    return "main.facts_scored"


def _mask_identity_sql(con: duckdb.DuckDBPyConnection, values: dict) -> str:
    """CTEs ``base`` (every prediction of the sample: gid, sid, run_id, ukey, the rowid sc_row of its
    row in ``scored`` and has_probs) and ``units`` (those with option scores) of the shared mask
    table: the identity columns of the LAC units (``conf_option_units.sql``), numbered the same way
    (``_ids_sql``). The rowids are why: the metrics reading the table (``_cached_option_units``)
    fetch a unit's scores and reported column by an integer (the relations are fixed for the
    connection) instead of joining on the two string keys (run_id, item_id) in every metric.

    Over the store's facts (``_coded``) ukey is the integer item code and the rows carry the
    target scores (``_TARGETS``), all from ``facts_scored``. Otherwise ukey = item_id and the rows
    carry sp_row, the rowid of the prediction's ``sample_probs`` row (NULL: no option scores): that
    one string join is paid here, once per connection."""
    keep = ", ".join(dict.fromkeys(["run_id", "item_id", *values["by_cols"], *values["strat_cols"]]))
    sample = values["sample_index"]
    if _coded(con):
        # the store's facts: facts_scored holds the item's integer code and, per prediction, whether
        # it has option scores (n_scored) and the scores themselves, so neither string join is made
        # (no sp_row: the metrics fetch the score lists from facts_scored by sc_row; the target
        # scores, all the thresholds read, ride along into the mask table, read in the same scan)
        return f"""sc0 AS NOT MATERIALIZED (  -- each consumer rescans the few columns it reads
    SELECT rowid AS sc_row, {keep}, {ITEM_CODE}, n_scored IS NOT NULL AS has_probs, {_TARGET_EXPRS}
    FROM main.facts_scored WHERE sample_index = {sample}
),
{_ids_sql("sc0", values)}
base AS (
    SELECT g.gid, s.sid, sc.run_id, sc.{ITEM_CODE} AS ukey, sc.sc_row, sc.has_probs, {_TARGETS}
    FROM sc0 sc
    JOIN gkeys g ON {_ids_on("g", values["by_cols"])}
    JOIN skeys s ON {_ids_on("s", values["strat_cols"])}
),
units AS (SELECT gid, sid, run_id, ukey, sc_row, {_TARGETS} FROM base WHERE has_probs)"""
    return f"""sc0 AS NOT MATERIALIZED (  -- each consumer rescans the few columns it reads
    SELECT rowid AS sc_row, {keep} FROM {_row_relation(con, "scored")} WHERE sample_index = {sample}
),
sp0 AS (
    SELECT rowid AS sp_row, run_id, item_id
    FROM {_row_relation(con, "sample_probs")}
    WHERE sample_index = {sample}
),
{_ids_sql("sc0", values)}
base AS (
    SELECT g.gid, s.sid, sc.run_id, sc.item_id AS ukey, sc.sc_row, sp.sp_row,
           sp.sp_row IS NOT NULL AS has_probs
    FROM sc0 sc
    JOIN gkeys g ON {_ids_on("g", values["by_cols"])}
    JOIN skeys s ON {_ids_on("s", values["strat_cols"])}
    LEFT JOIN sp0 sp ON sp.run_id = sc.run_id AND sp.item_id = sc.item_id
),
units AS (SELECT gid, sid, run_id, ukey, sc_row, sp_row FROM base WHERE has_probs)"""


def _option_mask_table(con: duckdb.DuckDBPyConnection, values: dict) -> str:
    """The TEMP table of the option units' calibration mask (computed here if missing): one row per
    prediction of the sample (gid, sid, sc_row, then sp_row, or over the facts the target scores (see
    ``_mask_identity_sql``), mask words m0, ...; NULL words: the item has no option scores, so it is
    no unit). Not the strings run_id and item_id: they made the rows the mask query materializes
    and writes several times wider, and only the queries joining the table to units of their own
    need them, which fetch them by sc_row (``_mask_with_identity``).

    The mask depends on the unit set (group, stratum, run_id and unit key of each unit), the seed,
    the repeats and cal_fraction, never on the score: LAC, APS (randomised or not) and coverage_by
    share one unit set. The table is named by a hash of everything its query depends on
    (``_mask_table_name``), so a connection computes it once per unit set and parameters, and finds
    it without rendering the query; the identity query (``_mask_identity_sql``) gives the identity
    columns of the LAC units."""
    table = _mask_table_name(con, values)
    if table in temp_tables(con):
        return table
    if NUMPY_MASK and _coded(con) and _coded_mask_table(con, table, values):
        return table
    con.execute(f"CREATE TEMP TABLE {table} AS {_option_mask_query(con, values)}")
    return table


def _coded_mask_table(con: duckdb.DuckDBPyConnection, table: str, values: dict) -> bool:
    """Create the option units' mask table ``table`` over the store's facts (``_coded``) with the
    split selected by numpy (``split_mask.calibration_words``): the same rows and columns as
    ``_option_mask_query``'s, and the same mask words bit for bit. Returns False, creating nothing,
    where the units fall in more strata than ``NUMPY_MASK_MAX_STEPS`` allows (the SQL is then faster).

    The items' md5 bases are computed here, not read from the split keys' TEMP table
    (``_split_keys_source``): sampling pools that are not the option units compute that table, and
    md5 runs again for them.

    SQL gives each prediction of the sample its group and stratum numbers, item code, run rank and
    target scores (``_mask_identity_sql``, staged in a TEMP table), and each item of the units its
    md5 base; numpy computes the words of the units; SQL joins them back by the rowid sc_row."""
    identity = _mask_identity_sql(con, values)
    staged = f"{table}_staged"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {staged} AS WITH {identity},
        run_ranks AS (  -- run_id's rank among the units' runs: the tie-break after the item code
            SELECT run_id, row_number() OVER (ORDER BY run_id) - 1 AS rk
            FROM (SELECT DISTINCT run_id FROM units)
        )
        SELECT b.* EXCLUDE (run_id), r.rk FROM base b LEFT JOIN run_ranks r USING (run_id)"""
    )
    try:
        # the strata (gid, sid) and their unit counts, in order; too many strata: the SQL's one
        # set-based pass is faster, and nothing is fetched
        strata = columns.fetch(
            con,
            f"SELECT gid, sid, count(*) AS n FROM {staged} WHERE has_probs "
            "GROUP BY gid, sid ORDER BY gid, sid",
        )
        sizes = strata["n"]
        if len(sizes) * values["repeats"] > NUMPY_MASK_MAX_STEPS:
            return False
        kb = _key_base_sql(values["seed"], "any_value(item_id)")
        keys = columns.fetch(
            con,
            f"SELECT ukey, {kb} AS kb FROM main.facts_scored "
            f"JOIN (SELECT DISTINCT ukey FROM {staged} WHERE has_probs) ON ukey = {ITEM_CODE} "
            f"WHERE sample_index = {values['sample_index']} GROUP BY ukey",
        )
        lookup = np.full(int(keys["ukey"].max()) + 1 if len(keys["ukey"]) else 1, -1, dtype=np.int32)
        lookup[keys["ukey"]] = np.arange(len(keys["ukey"]), dtype=np.int32)
        names = _word_cols(values["repeats"])
        con.execute(
            f"CREATE TEMP TABLE {table} AS SELECT gid, sid, sc_row, {_TARGETS}, "
            f"{_null_words(values['repeats'])} FROM {staged} WHERE NOT has_probs"
        )
        chunks = _mask_chunks(sizes)
        for first, last in chunks:
            where = "has_probs" if len(chunks) == 1 else _strata_range(strata, first, last)
            _mask_chunk(con, table, staged, where, sizes[first : last + 1], keys["kb"], lookup, values, names)
    except BaseException:
        # never leave part of the table: a later metric of the pass would take it for the whole
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
        raise
    finally:
        con.execute(f"DROP TABLE IF EXISTS temp.{staged}")
    return True


def _mask_chunks(sizes: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive strata (first, last index, inclusive) of at most ``NUMPY_MASK_CHUNK_UNITS``
    units each (a larger stratum is a run of its own): the numpy split handles one run at a time,
    so its arrays never hold more units than that, however large the store."""
    chunks: list[tuple[int, int]] = []
    first, held = 0, 0
    for i, n in enumerate(sizes.tolist()):
        if held and held + n > NUMPY_MASK_CHUNK_UNITS:
            chunks.append((first, i - 1))
            first, held = i, 0
        held += n
    if held:
        chunks.append((first, len(sizes) - 1))
    return chunks


def _strata_range(strata: columns.Columns, first: int, last: int) -> str:
    """SQL: the units of strata ``first`` .. ``last`` (in (gid, sid) order) of ``strata``."""
    g0, s0 = int(strata["gid"][first]), int(strata["sid"][first])
    g1, s1 = int(strata["gid"][last]), int(strata["sid"][last])
    return (
        f"has_probs AND (gid > {g0} OR (gid = {g0} AND sid >= {s0})) "
        f"AND (gid < {g1} OR (gid = {g1} AND sid <= {s1}))"
    )


def _mask_chunk(
    con: duckdb.DuckDBPyConnection,
    table: str,
    staged: str,
    where: str,
    sizes: np.ndarray,
    kb: np.ndarray,
    lookup: np.ndarray,
    values: dict,
    names: str,
) -> None:
    """Append to ``table`` the units of ``staged`` that ``where`` selects (whole strata, ``sizes``
    their unit counts in order) with their mask words, selected by ``split_mask.calibration_words``
    from the md5 bases ``kb`` of the items (``lookup``: item code -> index in ``kb``)."""
    # the units stratum by stratum, in integer columns as narrow as their values (this memory is
    # outside DuckDB's cap): item code, run rank, rowid; within a stratum in tie-break order (item
    # code, run rank), so that calibration_words orders the units of a window by their hash alone
    units = columns.fetch(
        con,
        f"SELECT ukey, rk::INTEGER AS rk, sc_row FROM {staged} WHERE {where} ORDER BY gid, sid, ukey, rk",
    )
    ukey = units["ukey"]
    key_pos = lookup[ukey]
    if len(key_pos) and int(key_pos.min()) < 0:  # the keys query missed a unit's item: a bug here
        raise RuntimeError(f"{table}: {int(np.sum(key_pos < 0))} units have no split key")
    if len(key_pos) < len(kb):  # a part of the units: hash only their own items in every repeat
        own, key_pos = np.unique(key_pos, return_inverse=True)
        kb = kb[own]
    words = split_mask.calibration_words(
        sizes,
        key_pos,
        ukey,  # the item code is the item_id's rank in string order (registry.ITEM_CODE)
        units["rk"],
        kb,
        values["repeats"],
        values["cal_num"],
        values["cal_den"],
    )
    cols = {"sc_row": units["sc_row"], **{f"m{w}": words[w] for w in range(len(words))}}
    del units, ukey, key_pos, words
    with columns.registered(con, cols) as reg:
        con.execute(
            f"""INSERT INTO {table}
                SELECT t.gid, t.sid, t.sc_row, {", ".join(f"t.{c}" for c in _TARGET_COLS)}, {names}
                FROM {staged} t JOIN {reg} w USING (sc_row)
                WHERE {where}"""
        )


def _option_mask_query(con: duckdb.DuckDBPyConnection, values: dict) -> str:
    """The query of the option units' mask table (``_option_mask_table``); it reads the shared split
    keys of item_id, or of its integer code over the facts (``_split_keys_source``: computed there
    if this connection lacks them)."""
    identity = _mask_identity_sql(con, values)
    # units keyed by item_id or its integer code; the table keeps the rowids, not the strings
    # run_id and item_id (see ``_option_mask_table``)
    coded = _coded(con)
    rows = f"sc_row, {_TARGETS}" if coded else "sc_row, sp_row"
    key_col = ITEM_CODE if coded else "item_id"
    mask = _inline_mask(con, "lac", values, {}, f"gid, sid, run_id, ukey, {rows}", key_col)
    return (
        f"WITH {identity},\n{mask}SELECT * FROM unit_mask\n"
        f"UNION ALL SELECT gid, sid, {rows}, {_null_words(values['repeats'])} FROM base WHERE NOT has_probs"
    )


# what the option mask table carries of each unit's target where it is built from the facts
# (``_coded``): its scores, which the thresholds read, and whether the backend scored it, which is
# all conformal_lac reads of its units when it adds up coverage_by's test sums (``_query``)
_TARGET_COLS = ("lac_target", "aps_target", "has_target")
_TARGETS = ", ".join(_TARGET_COLS)
_TARGET_EXPRS = "lac_target, aps_target, target_prob IS NOT NULL AS has_target"


def _coded(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the option units' mask table is built from the store's facts, whose ``facts_scored``
    carries the integer item code (``registry.ITEM_CODE``) and each prediction's option scores
    (``registry.SCORED_PROBS_COLUMNS``): the table's unit key is then that code, it holds each
    unit's target scores (``_TARGETS``, what the thresholds read: no join there), and the metrics
    read the score lists (and coverage_by its column) from ``facts_scored`` by the table's sc_row
    (``_cached_option_units``); otherwise they read them from ``sample_probs`` by its sp_row."""
    return uses_facts(con)


def _mask_table_name(con: duckdb.DuckDBPyConnection, values: dict) -> str:
    """The name of the option units' mask table: a hash of what its query (``_option_mask_query``)
    depends on, i.e. the relations it reads (the store's facts or the connection's TEMP tables), the
    unit set (grouping and stratum columns, sample) and the split (seed, repeats, cal_fraction) and
    window knobs; the key (item_id, or its code over the facts) and the SQL are fixed for the
    process (the table is TEMP). Not
    a hash of the query itself: rendering it took ~20 ms, paid by every metric that only looks the
    table up."""
    names = ("by_cols", "strat_cols", "sample_index", "seed", "repeats", "cal_num", "cal_den")
    key = [uses_facts(con), *(values[k] for k in (*names, "win_sd", "win_pad"))]
    return "_conf_mask_" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]


def _existing_option_mask(con: duckdb.DuckDBPyConnection, values: dict) -> str | None:
    """The option units' mask table for these parameters if this connection has already computed it
    (a pass that ran LAC, APS or coverage_by), else None: nothing is computed here."""
    table = _mask_table_name(con, values)
    return table if table in temp_tables(con) else None


def _cached_option_units(
    con: duckdb.DuckDBPyConnection, table: str, score: str, values: dict, cov: str | None
) -> str:
    """``base`` and ``units`` of LAC / plain APS read from the mask table and the per-sample facts:
    the mask table already holds every prediction's group, stratum and unit key, so only the scores
    and, for coverage_by, the reported column are fetched by the rowid the mask table holds
    (``_mask_identity_sql``): over the store's facts both from ``facts_scored`` in one join
    (``_coded``), otherwise the scores from ``sample_probs`` and the column from ``scored``;
    ``gkeys`` gives the grouping values of the output (numbered as in the mask's query)."""
    sample = values["sample_index"]
    by = values["by_cols"]
    if by:
        numbered = _numbering_sql(by, "gid", f"scored WHERE sample_index = {sample}")
        # a TEMP table per grouping and sample: every metric reading the mask table needs the same
        # numbering, which took a scan and a grouping of the sample's rows by the strings per query
        key = repr([uses_facts(con), by, sample])
        name = "_conf_gkeys_" + hashlib.sha256(key.encode()).hexdigest()[:16]
        gkeys = f"gkeys AS (SELECT * FROM {cached_table(con, name, numbered)})"
    else:
        gkeys = "gkeys AS (SELECT 1 AS gid)"
    words = _word_cols(values["repeats"], "t")
    scored = _row_relation(con, "scored")
    # coverage_by: the reported column as the integer code of its value (``cov_keys``), so that the
    # split groups, materializes and joins an integer, not (often) a string; the summary maps the
    # codes back (``_cov_decode``). The codes are read from a TEMP table (``_cov_keys_table``)
    cov_keys = f"{COV_KEYS} AS (SELECT v, code FROM {_cov_keys_table(con, cov, sample)}),\n" if cov else ""
    coded = _coded(con)
    # the scores' relation and the mask table's rowid into it
    relation, row = (
        ("main.facts_scored", "sc_row") if coded else (_row_relation(con, "sample_probs"), "sp_row")
    )
    scores = f"target_prob IS NOT NULL AS has_target, f.{score}_scores AS ss, f.{score}_target AS st"
    code = f"JOIN {COV_KEYS} ck ON ck.v IS NOT DISTINCT FROM f.{cov} WHERE f.sample_index = {sample}"
    cov_join, cov_col = "", "NULL"
    if cov and coded:  # the scores and the column from the same rows: one join
        probs = f"SELECT f.rowid AS sc_row, {scores}, ck.code AS {cov} FROM {relation} f {code}"
        cov_col = f"pr.{cov}"
    else:
        probs = f"SELECT f.rowid AS {row}, {scores} FROM {relation} f WHERE f.sample_index = {sample}"
        if cov:
            cov_join = (
                f"\n    JOIN (SELECT f.rowid AS sc_row, ck.code AS {cov} FROM {scored} f {code}) sc "
                "ON sc.sc_row = t.sc_row"
            )
            cov_col = f"sc.{cov}"
    return f"""{gkeys},
{cov_keys}probs AS (
    {probs}
),
base AS (  -- every prediction of the sample: its group and whether it has option scores
    SELECT t.gid, {values["g_by"]}t.m0 IS NOT NULL AS has_probs FROM {table} t JOIN gkeys g USING (gid)
),
units AS (
    SELECT t.gid, t.sid, {cov_col} AS cov, pr.ss, pr.st,
           NOT pr.has_target AS target_unscored, {words}
    FROM {table} t
    JOIN probs pr ON pr.{row} = t.{row}{cov_join}
    WHERE t.m0 IS NOT NULL
)"""


def _cov_keys_table(con: duckdb.DuckDBPyConnection, cov: str, sample: int) -> str:
    """The TEMP table of the integer codes of coverage_by's column ``cov`` on a connection with fixed
    base relations (computed here if missing): each distinct value v of the sample's predictions and
    its rank ``code`` in sort order (NULL last).

    Why a table, not a CTE: DuckDB keeps the min / max statistics of a stored column, so the code
    joined from the table has a known small range, and the groupings of the split by (gid, cov) use
    its perfect-hash aggregate; a code computed by row_number() in the query has no statistics, and
    every such grouping fell back to a general hash aggregate: that was about a quarter of
    coverage_by's test sums at 1M predictions (0.50 -> 0.37 CPU s with one thread). The name says
    what the rows depend on: the relation read (facts or the connection's TEMP ``scored``), the
    column (validated, ``_column``) and the sample."""
    source = "f" if uses_facts(con) else "t"
    return cached_table(
        con,
        f"_conf_cov_keys_{source}_{cov}_{sample}",
        f"SELECT v, row_number() OVER (ORDER BY v) AS code FROM (SELECT DISTINCT {cov} AS v FROM "
        f"{_row_relation(con, 'scored')} WHERE sample_index = {sample})",
    )


def _mask_with_identity(
    con: duckdb.DuckDBPyConnection, table: str, values: dict, units_only: bool = False
) -> str:
    """The option units' mask table ``table`` with each row's run_id and ukey (= item_id), for the
    queries that join it to units of their own (randomised APS, the sampling pools): the table holds
    the rowid ``sc_row`` of the prediction's ``scored`` row, not the strings (they made the mask's
    rows several times wider), so they are fetched by that integer; ``units_only``: only the rows
    that are units (mask words not NULL)."""
    where = " WHERE mk.m0 IS NOT NULL" if units_only else ""
    scored = _row_relation(con, "scored")
    return (
        f"(SELECT mk.*, sc.run_id, sc.item_id AS ukey FROM {table} mk JOIN (SELECT rowid AS sc_row, run_id, "
        f"item_id FROM {scored} WHERE sample_index = {values['sample_index']}) sc USING (sc_row){where})"
    )


# the split's own threshold CTE (``conf_split.sql``): per group and repeat n_cal, k_order, q_hat
_OWN_THRESHOLDS = "thr_own"


def _threshold_table(con: duckdb.DuckDBPyConnection, mask: str, score: str, values: dict) -> str:
    """The TEMP table of the LAC / plain APS thresholds on the shared mask table ``mask`` (rows of
    ``conf_split.sql``'s ``thr_own``: gid, rep, n_cal, k_order, q_hat), computed here if missing.

    Why: q_hat depends on the units' group, stratum, calibration mask and target score and on alpha,
    never on coverage_by's column, so conformal_lac and conformal_coverage_by (score 'lac', run on
    the same connection) need the same thresholds, and the first to run computes them for both (the
    query reads only the target score and mask words of each unit, a narrow join). The name is a hash
    of everything they depend on: the mask table's name (itself a hash of the relations read, the
    unit set and the split), the score and alpha; the SQL is fixed for the process (the table is
    TEMP)."""
    table = "_conf_thr_" + _threshold_key(mask, score, values)
    if table in temp_tables(con):
        return table
    if NUMPY_THRESHOLDS and _coded(con) and _numpy_threshold_table(con, table, mask, score, values):
        return table
    con.execute(f"CREATE TEMP TABLE {table} AS {_threshold_query(con, mask, score, values)}")
    return table


def _numpy_threshold_table(
    con: duckdb.DuckDBPyConnection, table: str, mask: str, score: str, values: dict
) -> bool:
    """Create ``_threshold_table``'s table ``table`` over the store's facts (``_coded``: the mask
    table ``mask`` holds each unit's target score) with q_hat picked by numpy
    (``split_thresholds.thresholds``): the rows and types of ``thr_own`` (gid, rep, n_cal,
    k_order, q_hat), the same values bit for bit.

    SQL counts the units per group and stratum (n_cal: round half up of the calibration share of
    each stratum, summed over the group's strata, as ``conf_split.sql``'s ``strata`` and
    ``group_n``), and hands numpy the units run of groups by run of groups (at most
    ``NUMPY_MASK_CHUNK_UNITS`` units a run): group, target score and mask words, nothing per
    repeat. Returns False, creating nothing, where one group has more units than a run may hold:
    numpy would hold that whole group outside DuckDB's cap, and the SQL's memory is bounded by it
    (e.g. a 10M store grouped by nothing)."""
    repeats, num, den = values["repeats"], values["alpha_num"], values["alpha_den"]
    strata = columns.fetch(
        con, f"SELECT gid, count(*) AS n FROM {mask} WHERE m0 IS NOT NULL GROUP BY gid, sid ORDER BY gid, sid"
    )
    gids = np.unique(strata["gid"])
    n_units = np.zeros(len(gids), dtype=np.int64)
    n_cal = np.zeros(len(gids), dtype=np.int64)
    at = np.searchsorted(gids, strata["gid"])
    np.add.at(n_units, at, strata["n"])
    if len(n_units) and int(n_units.max()) > NUMPY_MASK_CHUNK_UNITS:
        return False
    cal = values["cal_num"], values["cal_den"]
    np.add.at(n_cal, at, [split_mask.n_cal(int(n), *cal) for n in strata["n"]])
    # k = ceil((n_cal + 1)(1 - alpha)) in Python's integers, as the SQL's HUGEINT arithmetic
    k_order = np.array([((int(n) + 1) * (den - num) + den - 1) // den for n in n_cal], dtype=np.int64)
    q = np.zeros((len(gids), repeats))
    defined = np.zeros((len(gids), repeats), dtype=bool)
    names = _word_cols(repeats)
    for first, last in _mask_chunks(n_units):
        units = columns.fetch(
            con,
            f"SELECT gid, {score}_target IS NOT NULL AS scored, coalesce({score}_target, 0) AS st, {names} "
            f"FROM {mask} WHERE m0 IS NOT NULL AND gid BETWEEN {int(gids[first])} AND {int(gids[last])}",
        )
        words = np.stack([units.pop(f"m{w}") for w in range(_words(repeats))])
        part = slice(first, last + 1)
        group = np.searchsorted(gids[part], units.pop("gid"))
        q[part], defined[part] = split_thresholds.thresholds(
            group, units["scored"], units["st"], words, n_cal[part], k_order[part], repeats
        )
        del units, words, group
    cols = {
        "gid": np.repeat(gids, repeats),
        "rep": np.tile(np.arange(repeats, dtype=np.int64), len(gids)),
        "n_cal": np.repeat(n_cal, repeats),
        "k_order": np.repeat(k_order, repeats),
        "q": np.where(defined, q, np.nan).ravel(),  # NaN: NULL (columns' convention) ...
        "q_nan": (defined & np.isnan(q)).ravel(),  # ... and a NaN q_hat said apart
    }
    _create_from_columns(
        con,
        table,
        mask,
        cols,
        "rep::BIGINT AS rep, n_cal::BIGINT AS n_cal, k_order::BIGINT AS k_order, "
        "CASE WHEN q_nan THEN 'nan'::DOUBLE ELSE q END AS q_hat",
    )
    return True


def _create_from_columns(
    con: duckdb.DuckDBPyConnection, table: str, mask: str, cols: columns.Columns, select: str
) -> None:
    """Create TEMP ``table`` from numpy's ``cols``: their gid cast to the type of the mask table
    ``mask``'s gid (what the SQL's rows of the same table carry), then ``select`` over the other
    columns (their SQL types)."""
    gid_type = con.execute(f"DESCRIBE SELECT gid FROM {mask}").fetchone()[1]
    with columns.registered(con, cols) as reg:
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT gid::{gid_type} AS gid, {select} FROM {reg}")


def _test_rep_table(
    con: duckdb.DuckDBPyConnection, table: str, mask: str, score: str, values: dict, cov: str | None
) -> None:
    """Create ``table``: the test sums (``conf_split.sql``'s ``test_rep_own``) of LAC / plain APS
    units on the shared mask table ``mask`` per group and code of column ``cov`` (NULL without),
    by numpy over the store's facts (``_numpy_test_rep_table``) or else by the SQL
    (``_test_rep_query``)."""
    if NUMPY_TEST_SUMS and _coded(con):
        _numpy_test_rep_table(con, table, mask, score, values, cov)
        return
    con.execute(f"CREATE TEMP TABLE {table} AS {_test_rep_query(con, mask, score, values, cov)}")


def _test_rep_query(
    con: duckdb.DuckDBPyConnection, mask: str, score: str, values: dict, cov: str | None
) -> str:
    """The SQL of ``_test_rep_table``: ``test_rep_own`` over the units of ``_cached_option_units``,
    with the thresholds of ``_threshold_table``."""
    own = f"SELECT * FROM {_OWN_TEST_REP}"
    split = _render(
        "conf_split.sql",
        units_m_sql="SELECT u.*, NULL::BIGINT AS m_top FROM units u",
        thr_q_sql=f"SELECT * FROM {_threshold_table(con, mask, score, values)}",
        test_rep_sql=own,
        **values,
        **_split_extra(score, values["repeats"]),
    )
    units = _cached_option_units(con, mask, score, values, cov)
    return _referenced_ctes(f"WITH {units},\n{split}\n{own}")


def _numpy_test_rep_table(
    con: duckdb.DuckDBPyConnection, table: str, mask: str, score: str, values: dict, cov: str | None
) -> None:
    """Create ``table`` with the rows and types of ``conf_split.sql``'s ``test_rep_own`` (gid, cov,
    rep, n, sz, cv, em) for LAC / plain APS units on the shared mask table ``mask`` over the store's
    facts (``_coded``), per group and, for coverage_by, per integer code of column ``cov`` (NULL
    without): summed by numpy (``split_test_sums``) from the units' mask words, target and option
    scores, with the thresholds of ``_threshold_table``. The same integers as the SQL.

    The sums add up over any partition of the units, so the units are fetched in runs of at most
    ``NUMPY_TEST_SUMS_RUN_ROWS`` rows of the mask table (by its rowid), each run's option scores as
    one row per score, and the runs' sums are added: numpy's memory, outside DuckDB's cap, is
    bounded by the run, whatever the size of the store or of a group."""
    repeats = values["repeats"]
    thr = columns.fetch(
        con,
        "SELECT gid, q_hat IS NULL AS q_null, coalesce(q_hat, 0) AS q "
        f"FROM {_threshold_table(con, mask, score, values)} ORDER BY gid, rep",
    )
    gids = np.unique(thr["gid"])
    q_all = np.where(thr["q_null"], np.inf, thr["q"]).reshape(len(gids), repeats)  # NULL: the full set
    del thr
    names = _word_cols(repeats, "t")
    cov_col, cov_join = "0", ""
    if cov is not None:
        cov_col = "ck.code"
        cov_join = (
            f" JOIN (SELECT v, code FROM {_cov_keys_table(con, cov, values['sample_index'])}) ck "
            f"ON ck.v IS NOT DISTINCT FROM f.{cov}"
        )
    scores = "main.facts_scored f ON f.rowid = t.sc_row"
    first, last = con.execute(f"SELECT min(rowid), max(rowid) FROM {mask}").fetchone()
    keys: list[np.ndarray] = []  # per run: its segments' (group index << 32 | code)
    sums: list[dict[str, np.ndarray]] = []  # per run: its segments' sums
    step = NUMPY_TEST_SUMS_RUN_ROWS
    for a in range(int(first or 0), int(last or -1) + 1, step):
        where = (
            f"t.rowid BETWEEN {a} AND {a + step - 1} AND t.m0 IS NOT NULL AND f.{score}_scores IS NOT NULL"
        )
        units = columns.fetch(
            con,
            f"SELECT t.gid, t.sc_row, {names}, f.{score}_target IS NOT NULL AS has_t, "
            f"coalesce(f.{score}_target, 0) AS st, {cov_col} AS cov FROM {mask} t JOIN {scores}{cov_join} "
            f"WHERE {where}",
        )
        if len(units["gid"]) == 0:
            continue
        opts = columns.fetch(
            con,
            f"SELECT sc_row, x FROM (SELECT t.sc_row, unnest(f.{score}_scores) AS x FROM {mask} t "
            f"JOIN {scores} WHERE {where}) WHERE x IS NOT NULL",
        )
        group = np.searchsorted(gids, units["gid"])
        in_thr = group < len(gids)
        in_thr[in_thr] = gids[group[in_thr]] == units["gid"][in_thr]
        if not in_thr.all():  # units of a group without thresholds join no q_hat: not test units
            units, group = columns.take(units, in_thr), group[in_thr]
            if len(group) == 0:
                continue
        # each option score's unit: its rowid looked up among the run's units' rowids, sorted (a
        # run's rowids are spread over the whole fact table: a dense map over their range would
        # not be bounded by the run); an option of a unit left out above matches none
        rows = units.pop("sc_row")
        by_row = np.argsort(rows)
        sorted_rows = rows[by_row]
        opt_rows = opts.pop("sc_row")
        at = np.minimum(np.searchsorted(sorted_rows, opt_rows), len(rows) - 1)
        kept = sorted_rows[at] == opt_rows
        opt_unit = by_row[at]
        del rows, by_row, sorted_rows, opt_rows, at
        if not kept.all():
            opt_unit, opts["x"] = opt_unit[kept], opts["x"][kept]
        # the run's segments: its (group, code) pairs, numbered in that order
        seg_keys, seg = np.unique(
            (group.astype(np.int64) << 32) | units["cov"].astype(np.int64), return_inverse=True
        )
        words = np.stack([units.pop(f"m{w}") for w in range(_words(repeats))])
        sums.append(
            split_test_sums.test_sums(
                seg,
                (seg_keys >> 32).astype(np.int64),
                words,
                units["has_t"],
                units["st"],
                opt_unit,
                opts["x"],
                q_all,
                repeats,
            )
        )
        keys.append(seg_keys)
        del units, opts, words, opt_unit
    all_keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    seg_keys, at = np.unique(all_keys, return_inverse=True)
    cols = {
        "gid": np.repeat(gids[seg_keys >> 32], repeats),
        "cov": np.repeat(seg_keys & 0xFFFFFFFF, repeats),
        "rep": np.tile(np.arange(repeats, dtype=np.int64), len(seg_keys)),
    }
    for name in split_test_sums.SUMS:
        total = np.zeros((len(seg_keys), repeats), dtype=np.int64)
        if sums:
            np.add.at(total, at, np.concatenate([s[name] for s in sums]))
        cols[name] = total.ravel()
    cov_sql = "cov::BIGINT" if cov is not None else "NULL::BIGINT"
    sums_sql = ", ".join(f"{name}::BIGINT AS {name}" for name in split_test_sums.SUMS)
    _create_from_columns(con, table, mask, cols, f"{cov_sql} AS cov, rep::BIGINT AS rep, {sums_sql}")


def _threshold_query(con: duckdb.DuckDBPyConnection, mask: str, score: str, values: dict) -> str:
    """The query of ``_threshold_table``: the split's thresholds over the mask table's units."""
    sample = values["sample_index"]
    words = _word_cols(values["repeats"], "t")
    # the split's columns the threshold CTEs do not read are typed constants (they are bound, not run)
    if _coded(con):  # the mask table holds the target scores
        st, join = f"t.{score}_target", ""
    else:
        st = "pr.st"
        probs = f"SELECT rowid AS sp_row, {score}_target AS st FROM {_row_relation(con, 'sample_probs')}"
        join = f"    JOIN ({probs} WHERE sample_index = {sample}) pr ON pr.sp_row = t.sp_row\n"
    units = (
        f"units AS (\n    SELECT t.gid, t.sid, NULL::INTEGER AS cov, NULL::DOUBLE[] AS ss, {st} AS st, "
        f"{words}\n    FROM {mask} t\n{join}"
        "    WHERE t.m0 IS NOT NULL\n)"
    )
    split = _render(
        "conf_split.sql",
        units_m_sql="SELECT u.*, g.m AS m_top FROM units u JOIN group_n g USING (gid)",
        thr_q_sql=f"SELECT * FROM {_OWN_THRESHOLDS}",
        test_rep_sql=f"SELECT * FROM {_OWN_TEST_REP}",
        **values,
        **_split_extra(score, values["repeats"]),
    )
    return _referenced_ctes(f"WITH {units},\n{split}\nSELECT * FROM {_OWN_THRESHOLDS}")


def _sampling_thresholds_sql(repeats: int) -> str:
    """``thr_q`` of ``conf_split.sql`` for sampling scores: the same rows as its ``thr_own`` (gid,
    rep, n_cal, k_order, q_hat), counted per distinct target score instead of read from a sorted
    band of scores.

    Why: a sampling score is (m - c) / m for a pool of m samples, so a group's target scores take
    a handful of distinct values (3 with m = 2: 0, 0.5 and 1), and ``thr_own``'s band (the scores
    in the bucket of the T-th largest and above) then held a third or more of the group's units,
    sorted and filtered once per repeat: about a quarter of conformal_sampling's CPU at 1M
    predictions. Here the units are grouped once by (gid, st) with one calibration count per
    repeat (``count_if`` of its mask bit), and per group and repeat q_hat is the largest score v
    with at least n - k + 1 calibration scores >= v (a running sum over the few values, largest
    first): the (n - k + 1)-th largest calibration score, i.e. the k-th smallest, exactly the
    element ``thr_own`` picks (n = the calibration units with a target score; k > n: NULL). Rows:
    groups x repeats x distinct scores, so the cost grows with the distinct scores, at most one
    per unit for pools of many sizes, still one grouping of the units."""
    counts = _per_repeat("count_if({cal}) AS sc_{r}", repeats)
    return f"""SELECT t.gid, t.rep, t.n_cal, t.k_order::BIGINT AS k_order, q.q_hat
    FROM thr t
    LEFT JOIN (
        SELECT gid, rep,
               max(st) FILTER (WHERE k_order <= n_scores AND above >= n_scores - k_order + 1) AS q_hat
        FROM (SELECT c.gid, c.rep, c.st, t.k_order,
                     sum(c.c) OVER (PARTITION BY c.gid, c.rep ORDER BY c.st DESC
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS above,
                     sum(c.c) OVER (PARTITION BY c.gid, c.rep) AS n_scores
              FROM (SELECT gid, st, unnest(range({repeats})) AS rep, unnest({_listed("sc_{r}", repeats)}) AS c
                    FROM (SELECT gid, st, {counts}
                          FROM units_m
                          WHERE st IS NOT NULL
                          GROUP BY gid, st)) c
              JOIN thr t ON t.gid = c.gid AND t.rep = c.rep)
        GROUP BY gid, rep
    ) q ON q.gid = t.gid AND q.rep = t.rep"""


# the split's own per-repeat test sums (``conf_split.sql``): per group, coverage_by value and repeat
_OWN_TEST_REP = "test_rep_own"


def _test_rep_prefix(mask: str, score: str, values: dict) -> str:
    """The name prefix of the TEMP tables of coverage_by's per-value test sums (rows of
    ``conf_split.sql``'s ``test_rep_own``: gid, cov, rep, n, sz, cv, em) on the shared mask table
    ``mask``; a table is this prefix, '_' and the coverage_by column (``_query`` makes and reads them).

    Why: the test sums are integer counts over the test units, so a group's sums (what
    conformal_lac / plain APS report from) are exactly the sums over the coverage_by values of
    coverage_by's rows for the same units, mask, thresholds and score lists, whichever column
    it reported by (its values partition the units). Where coverage_by runs before conformal_lac on
    a pass connection (the callers' order: ``equipoise metrics`` and metrics_bench pass the metrics
    in name order, and both are in lane group ``conformal``), conformal_lac reads them instead of
    aggregating every unit again; otherwise it computes them itself, with the same result, so
    only speed depends on the order. They depend on what the thresholds depend on (the mask table,
    the score and alpha) and, through the score lists, on nothing else: the sample is part of the
    mask table's name."""
    return "_conf_trep_" + _threshold_key(mask, score, values)


def _group_test_rep_table(mask: str, score: str, values: dict) -> str:
    """The TEMP table of the per-group test sums (``test_rep_own``'s rows, cov NULL) that numpy
    computes for conformal_lac / plain APS on the shared mask table ``mask`` where no coverage_by
    table of the same units, score and alpha is held (``_numpy_test_rep_table``). Its name is not
    ``_test_rep_prefix``'s, so it is never read as a coverage_by table."""
    return "_conf_trepg_" + _threshold_key(mask, score, values)


def _threshold_key(mask: str, score: str, values: dict) -> str:
    """The name part of a TEMP table that depends on what the thresholds depend on: the shared mask
    table ``mask`` (its name a hash of the relations read, the unit set and the split), the score
    and alpha (``_threshold_table``, ``_test_rep_prefix``)."""
    key = [mask, score, values["alpha_num"], values["alpha_den"]]
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


# the CTE of the integer codes of coverage_by's column (``_cached_option_units``): value v, code
COV_KEYS = "cov_keys"


def _cov_decode(coded: bool) -> dict[str, str]:
    """Template values of ``conf_coverage_by.sql`` that give the reported value of a unit's ``cov``:
    decoded from ``COV_KEYS`` where the units carry its integer code, else ``cov`` itself."""
    if coded:
        return {"cov_value": "any_value(ck.v)", "cov_join": f"\nLEFT JOIN {COV_KEYS} ck ON ck.code = ts.cov"}
    return {"cov_value": "ts.cov", "cov_join": ""}


# the extra result column of a sampling query that reads the option units' mask table: whether its
# units were exactly the mask table's units (else its numbers are discarded, see ``_run_query``)
_MASK_OK = "_conf_shared_mask_ok"


def _query(
    score: str,
    by: Sequence[str],
    params: dict,
    con: duckdb.DuckDBPyConnection | None,
    cov: str | None,
    summary: str,
    share_mask: bool = False,
    **summary_values: object,
) -> str:
    """The whole query of a conformal metric: units, their calibration mask, the split
    (``conf_split.sql``) and the summary.

    Where the mask comes from: with fixed base relations (see ``_option_mask_table``) the option
    metrics read the connection's shared mask table, LAC and plain APS build their units on it,
    randomised APS (scores from ``option_probs``) joins it to its own units; otherwise (views: the
    relations may change between calls; sampling: its units are pools, built by the same query that
    scores them) the mask is CTEs of the metric's own query.

    ``share_mask`` (sampling with pool 'item' on fixed base relations): when the connection already
    holds the option units' mask table for the same parameters, the pools read their mask words
    from it instead of computing the mask: the mask depends only on the unit set (group, stratum,
    run_id and item_id of each unit), so where the pools are exactly the option units (every
    prediction of the sample has option scores and every pool one target, as in a store of scored
    MCQ runs) it is the same mask. Whether they are is checked in the same query: every pool joins a
    mask unit with equal (run_id, item_id) (over the facts: the mask unit of the same
    ``facts_scored`` row, by the rowid sc_row of the pool's first sample row, see ``_pools_coded``),
    both sides being unique on that key, and equal
    (gid, sid) (compared after the join, see below), and the two counts are equal; the result then
    has the column ``_MASK_OK`` (see ``_run_query``, which computes the inline mask instead where it
    is false)."""
    values = _common(by, params)
    fixed = _fixed(con)  # one look at the catalog: rendering below creates no base relation
    # LAC and plain APS on fixed base relations build their units on the shared mask table
    # (``_cached_option_units``, below); every other query renders its own units (which also
    # validates the score and the pool before their columns are used)
    cached = fixed and score in ("lac", "aps") and not _aps_randomized(score, params)
    coded_pools = _pools_coded(con, score, params, fixed)
    units = "" if cached else _units_sql(score, values, params, cov, fixed, coded_pools)
    words = _word_cols(values["repeats"], "mk") + ", "
    # m_top (the group's size, from group_n) is read only by the split's own threshold CTEs
    # (thr_own): sampling counts its thresholds per value (``_sampling_thresholds_sql``) and LAC /
    # plain APS on the shared mask read theirs from a table, so their units carry NULL, no join
    own_thresholds = score != "sampling" and not cached
    m_top, m_join = ("g.m", " JOIN group_n g USING (gid)") if own_thresholds else ("NULL::BIGINT", "")
    joined = (
        f"SELECT u.*, {{words}}{m_top} AS m_top FROM units u JOIN {{table}} mk USING (gid, sid, run_id, ukey)"
        + m_join
    )
    mask_ctes, check, shared = "", "", None
    # sampling scores take few distinct values: their thresholds are counted per value
    thr_q_sql = f"SELECT * FROM {_OWN_THRESHOLDS}"
    if score == "sampling":
        thr_q_sql = _sampling_thresholds_sql(values["repeats"])
    test_rep_sql = f"SELECT * FROM {_OWN_TEST_REP}"
    target_units = "units"  # what the option summary counts n_target_unscored from
    if share_mask and fixed and _pooled(score, params):
        assert con is not None
        shared = _existing_option_mask(con, values)
    if shared is not None:
        # joined on (run_id, ukey) alone, each pool's (gid, sid) compared with its mask unit's in the
        # check: with the four keys in the join, DuckDB joined the grouping strings instead of gid
        # (through gkeys), which took most of the metric's time
        if coded_pools:  # joined by the rowid of the pool's row in facts_scored (``_prepare_pools``)
            mask_units, on = f"(SELECT * FROM {shared} WHERE m0 IS NOT NULL)", "mk.sc_row = u.sc_row"
        else:
            mask_units = _mask_with_identity(con, shared, values, units_only=True)
            on = "mk.run_id = u.run_id AND mk.ukey = u.ukey"
        units_m = (
            f"SELECT u.*, {words}u.gid = mk.gid AND u.sid = mk.sid AS same_gs, {m_top} AS m_top "
            f"FROM units u JOIN {mask_units} mk ON {on}{m_join}"
        )
        # the pools counted from `strata` (the split's count of `units` per group and stratum), not by
        # another scan of the pools
        check = (
            "mask_check AS (  -- the pools are exactly the units of the shared mask table\n"
            "    SELECT n = (SELECT count_if(same_gs) FROM units_m)\n"
            f"       AND n = (SELECT count(*) FROM {shared} WHERE m0 IS NOT NULL) AS ok\n"
            "    FROM (SELECT coalesce(sum(n_stratum), 0) AS n FROM strata)\n),\n"
        )
    elif not fixed or score == "sampling":
        if coded_pools:  # the mask keyed by the item code (``_pools_coded``): the same split
            cols = _SAMPLING_SPLIT_COLS.replace("ukey", f"{ITEM_CODE} AS ukey")
            mask_ctes = _inline_mask(con, score, values, params, cols, ITEM_CODE)
        else:
            mask_ctes = _inline_mask(con, score, values, params)
        units_m = f"SELECT u.*, {m_top} AS m_top FROM unit_mask u{m_join}"
    else:
        assert con is not None
        table = _option_mask_table(con, values)
        if not cached:  # randomised APS: its own units, joined to the mask table
            units_m = joined.format(words=words, table=_mask_with_identity(con, table, values))
        else:
            units = _cached_option_units(con, table, score, values, cov)
            # the thresholds from the connection's shared table (computed there if missing): the
            # split's own threshold CTEs are then not referenced
            thr_q_sql = f"SELECT * FROM {_threshold_table(con, table, score, values)}"
            units_m = f"SELECT u.*, {m_top} AS m_top FROM units u{m_join}"
            prefix = _test_rep_prefix(table, score, values)
            held = temp_tables(con)
            coded = _coded(con)
            if cov is not None:  # coverage_by: its per-value test sums, kept for LAC / APS
                kept_test_rep = f"{prefix}_{cov}"
                test_rep_sql = f"SELECT * FROM {kept_test_rep}"
                if kept_test_rep not in held:
                    _test_rep_table(con, kept_test_rep, table, score, values, cov)
            else:
                found = sorted(t for t in held if t.startswith(f"{prefix}_"))
                from_table = bool(found) or (NUMPY_TEST_SUMS and coded)
                if found:  # any coverage_by column: its values partition the group's test units
                    test_rep_sql = (
                        "SELECT gid, NULL AS cov, rep, sum(n)::BIGINT AS n, sum(sz)::BIGINT AS sz, "
                        f"sum(cv)::BIGINT AS cv, sum(em)::BIGINT AS em FROM {found[0]} GROUP BY gid, rep"
                    )
                elif from_table:  # numpy's per-group sums over the facts
                    group_sums = _group_test_rep_table(table, score, values)
                    if group_sums not in held:
                        _numpy_test_rep_table(con, group_sums, table, score, values, None)
                    test_rep_sql = f"SELECT * FROM {group_sums}"
                if coded and from_table:
                    # the units' thresholds and test sums are read from tables: the flags the
                    # mask table holds give n_target_unscored without joining the score lists
                    # (where the units feed the test sums too, this measured slower: not there)
                    flags = f"SELECT gid, NOT has_target AS target_unscored FROM {table}"
                    target_units = f"({flags} WHERE m0 IS NOT NULL)"

    split = _render(
        "conf_split.sql",
        units_m_sql=units_m,
        thr_q_sql=thr_q_sql,
        test_rep_sql=test_rep_sql,
        **values,
        **_split_extra(score, values["repeats"]),
    )
    check_col = ""
    if shared is not None:
        ok = "(SELECT ok FROM mask_check)"
        # the coverage_by summary's SELECT is a GROUP BY
        check_col = f", {f'any_value({ok})' if summary == 'conf_coverage_by.sql' else ok} AS {_MASK_OK}"
    rendered = _render(
        summary,
        mask_check_col=check_col,
        target_units=target_units,
        **_cov_decode(cached and cov is not None),
        **values,
        **summary_values,
    )
    return _referenced_ctes(f"WITH {units},\n{mask_ctes}{split},\n{check}{rendered}")


def _run_query(
    con: duckdb.DuckDBPyConnection,
    score: str,
    by: Sequence[str],
    params: dict,
    cov: str | None,
    summary: str,
    **summary_values: object,
) -> columns.Columns:
    """Run a metric's query, reading the connection's shared option mask where it may
    (``_query``'s ``share_mask``); if the check column says the pools were not the mask's units
    (or there is no row to say it), the result is discarded and the query with the metric's own
    inline mask gives it."""
    got = columns.fetch(con, _query(score, by, params, con, cov, summary, True, **summary_values))
    if _MASK_OK not in got:
        return got
    ok = columns.n_rows(got) > 0 and all(v is True for v in columns.values(got[_MASK_OK]))
    if ok:
        return {k: v for k, v in got.items() if k != _MASK_OK}
    return columns.fetch(con, _query(score, by, params, con, cov, summary, **summary_values))


def _summary(score: str) -> str:
    """The summary query of conformal_lac / conformal_aps / conformal_sampling."""
    return "conf_sampling_summary.sql" if score == "sampling" else "conf_option_summary.sql"


def _coverage_by_args(by: Sequence[str], params: dict) -> tuple[str, str]:
    """conformal_coverage_by's score and reported column, validated."""
    score = params["score"]
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    cov = _column(params["coverage_by"], "coverage_by")
    if cov in by:
        raise ValueError(f"coverage_by {cov!r} is already a grouping column")
    return str(score), cov


def _runner(score: str):
    def run(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
        prepare(con)
        _prepare_pools(con, score, params)
        return _run_query(con, score, by, params, None, _summary(score))

    return run


def _coverage_by(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    prepare(con)
    score, cov = _coverage_by_args(by, params)
    _prepare_pools(con, score, params)
    return _run_query(con, score, by, params, cov, "conf_coverage_by.sql", cov_name=cov)


register(
    Metric(
        name="conformal_lac",
        description="split conformal prediction with LAC scores (1 - p(target)) over option probabilities: "
        "mean / sd over repeated stratified calibration-test splits of set size and coverage, q_hat",
        sql="conf_option_units.sql",
        needs=("predictions", "option_scores"),
        default_by=("model", "config"),
        params=dict(COMMON_PARAMS),
        compute_fn=_runner("lac"),
    )
)
register(
    Metric(
        name="conformal_aps",
        description="split conformal prediction with APS scores (probability mass of the options at "
        "least as likely as the target; optional seeded randomisation): set size, coverage, q_hat",
        sql="conf_option_units.sql",
        needs=("predictions", "option_scores"),
        default_by=("model", "config"),
        params={**COMMON_PARAMS, "aps_randomized": False},
        compute_fn=_runner("aps"),
    )
)
register(
    Metric(
        name="conformal_sampling",
        description="sampling-based conformal sets (1 - share of the M samples choosing the option): "
        "set size, coverage, q_hat, majority-vote accuracy and hit rate",
        sql="conf_sampling_units.sql",
        needs=("predictions",),
        default_by=("model", "config"),
        params={**COMMON_PARAMS, "pool": "item"},
        compute_fn=_runner("sampling"),
    )
)
register(
    Metric(
        name="conformal_coverage_by",
        description="test coverage and set size of the conformal sets (thresholds calibrated per group) "
        "per value of another column",
        sql="conf_coverage_by.sql",
        needs=("predictions", "option_scores"),
        default_by=("model", "config"),
        params={
            **COMMON_PARAMS,
            "score": "lac",
            "coverage_by": "specialty",
            "aps_randomized": False,
            "pool": "item",
        },
        compute_fn=_coverage_by,
    )
)
