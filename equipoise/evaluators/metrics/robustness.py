"""Robustness metrics: flips between a base and a perturbed variant, McNemar, paired bootstrap of the
uncertainty change, and percentile bootstrap CIs for accuracy (seed 004 sections 3.4, 3.5 and 5).

Pairs (``rob_pairs.sql``, TEMP views rebuilt on every call): a base item of variant ``base_variant``
(default 'original') and a perturbed item of variant ``perturbed_variant`` (default 'plus_nota';
e.g. 'minus_correct_plus_nota', or MedAbstain 'NA' vs 'NAP') with the same ``base_id``, in runs that
share dataset_id, model, backend, prompt_style and decoding settings, sample ``sample_index`` (default
0, the greedy sample) of each. "Correct" is the parsed option being the item's target, so under
-correct+nota choosing NOTA is correct (seed 004 5.2: it is the target there). Unparsed samples are
wrong and counted. Strata for grouping are the base side's; default grouping model x prompt_style.

Baseline uncertainty (param ``uncertainty``): ``option_prob`` (default) = 1 - p(chosen option), p the
softmax over the scored options (``option_probs``; NULL when no option was chosen or it was not
scored); ``token_mean`` = -token_logprob_mean, the average token NLL (ANLL). Pairs whose uncertainty is
NULL are counted (``n_with_uncertainty`` / ``n_missing``) and left out of uncertainty means.

- ``flip_analysis`` (``rob_flip.sql``): per group and category (stable_correct, correct_to_wrong,
  wrong_to_correct, stable_wrong; all four always present): n, share of pairs, mean baseline
  uncertainty, the mean of its pool (initially correct for the first two, initially wrong for the
  last two) and ``relative_uncertainty = (mean_subset - mean_pool) / mean_pool`` (seed 004 Table 3).
- ``mcnemar`` (``rob_mcnemar.sql``): b = correct->wrong, c = wrong->correct. Rule: when b + c <
  ``exact_below`` (default 25) the exact binomial test, statistic min(b, c), p = min(1, 2 *
  BinomCDF(min(b, c); b + c, 1/2)), the CDF the sum of binomial coefficients over 2^(b + c) (in
  exact integers up to b + c = 2^14); otherwise chi-square with continuity correction, statistic
  (|b - c| - 1)^2 / (b + c), 1 degree of freedom, p = P(chi2_1 > stat) = erfc(sqrt(stat / 2))
  (Edwards' formula as statsmodels writes it;
  ``exact_tests`` computes both tails, and the tests check them against statsmodels and scipy). With
  b + c = 0 the exact p is 1. ``significant`` = p <= ``alpha`` (0.05). Base samples with no perturbed
  partner cannot be paired; they are counted in ``n_base_unpaired`` rather than dropped silently.
- ``paired_bootstrap_uncertainty`` (``rob_paired_diffs.sql``): d_i = perturbed - base uncertainty over
  pairs with both defined; ``mean_diff`` = mean(d); ``n_boot`` (2000) resamples of the d vector with
  replacement, each replicate's mean; 100(1 - ``alpha``)% percentile CI (numpy linear-interpolation
  percentiles); ``p_value`` = min(1, 2 min(share of replicate means <= 0, share >= 0)).
- ``bootstrap_ci`` (``rob_item_accuracy.sql``): accuracy per group (any data, all samples, unparsed =
  wrong) with a percentile bootstrap CI that resamples items (a (run, item) with all its samples):
  replicate accuracy = sum of resampled correct counts / sum of resampled sample counts. Items are
  resampled as multinomial counts over their distinct kinds (see the stream below), which is the
  same bootstrap distribution as drawing item indices, at a cost independent of the item count.

Bootstraps are seeded (param ``seed``, a non-negative integer, default 0) per group, so a group's
interval does not depend on which other groups exist or how the rows are grouped around it. The
stream, written out so that anyone can reproduce it: the group's key values (in ``by`` order; NULL as
the empty string, integral floats as integers, e.g. ``k`` 3.0 -> '3') are joined with the unit
separator '\\x1f', hashed with SHA-256, and the first 8 bytes read as a little-endian unsigned integer
``h``; the generator is ``numpy.random.default_rng([seed, h])``. Replicate r takes the n indices
``floor(u * n)`` from the next n uniforms ``u`` of ``rng.random`` (row-major: all of replicate 0,
then replicate 1, ...). Replicates are drawn in blocks to bound memory; the stream is the same
whatever the block size. A large group's replicates are also split into parts computed in parallel,
each from a copy of the generator jumped ahead (``PCG64.advance``: one 64-bit output per uniform) to
its first replicate's uniforms, so the parts draw exactly the numbers of one sequential pass.
``bootstrap_ci`` draws from the same per-group generator differently: the
group's items are reduced to their distinct kinds (m samples, c correct) sorted by (m, c) with
``n_kind`` items each (n = sum of ``n_kind``), and the replicate counts are the rows of
``rng.multinomial(n, n_kind / n, size=n_boot)`` (one call, float64 probabilities); replicate r's
accuracy is sum(counts_r * c) / sum(counts_r * m). The SQL does the pairing and aggregation;
Python only resamples the small per-group vectors that SQL returns.

Parameters are checked before any SQL runs: unknown names, out-of-range or non-integral numbers and
variant names outside ``[A-Za-z0-9_.:+-]`` raise ``ValueError``; nothing a caller passes is pasted
into SQL unchecked.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np

from equipoise.evaluators.metrics import columns
from equipoise.evaluators.metrics.exact_tests import binom_cdf_half, chi2_sf_1df
from equipoise.evaluators.metrics.registry import (
    ITEM_CODE,
    REGISTRY,
    RUN_CLASS_SQL,
    SQL_DIR,
    Metric,
    _check_by,
    _materialized,
    register,
    render_sql,
    temp_tables,
    uses_facts,
)
from equipoise.evaluators.store import scalar

DEFAULT_BY: tuple[str, ...] = ("model", "prompt_style")
UNCERTAINTY: dict[str, tuple[str, str]] = {
    "option_prob": ("1 - s.chosen_prob", "1 - p(chosen option) over the scored options"),
    "token_mean": ("-s.token_logprob_mean", "-token_logprob_mean (average token NLL)"),
}
_VARIANT_RE = re.compile(r"^[A-Za-z0-9_.:+-]+$")
# uniforms drawn per block of replicates (the stream does not depend on it): 2^16 cells, so the
# three reused buffers of _fill_means (512 KiB each) stay in the CPU cache
_BLOCK_CELLS = 1 << 16
_SPLIT_CELLS = 1 << 22  # at least this many uniforms per part of a split group bootstrap


# ---------------------------------------------------------------------------------------------
# parameters and the pairs view
# ---------------------------------------------------------------------------------------------
def _check_names(metric: str, params: dict) -> None:
    """Unknown parameter names are an error: a typo (``n_boots``) must not silently fall back to a
    default and produce a plausible but different result."""
    unknown = sorted(set(params) - set(REGISTRY[metric].params))
    if unknown:
        raise ValueError(
            f"{metric}: unknown parameter(s) {unknown}; known: {', '.join(sorted(REGISTRY[metric].params))}"
        )


def _int_param(params: dict, name: str, default: int, minimum: int) -> int:
    """An integer parameter; accepts ints, integral floats and decimal strings (as a command line
    gives them), never truncates (2.5 is an error, not 2) and never accepts booleans."""
    v = params.get(name, default)
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if isinstance(v, (int, np.integer)) or (isinstance(v, (float, np.floating)) and float(v).is_integer()):
        out = int(v)
    elif isinstance(v, str) and re.fullmatch(r"[+-]?[0-9]+", v.strip()):
        out = int(v.strip())
    else:
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def _variant(params: dict, name: str) -> str:
    v = params[name]
    if not isinstance(v, str) or not _VARIANT_RE.match(v):
        raise ValueError(f"{name} must be a variant name of letters, digits and _.:+- only, got {v!r}")
    return v


# the columns of rob_samples that rob_pairs and rob_base_unpaired read (the pairing key and each
# side's values), besides the grouping's strata
_SAMPLE_COLUMNS = (
    "run_id", "_is_base", "pair_class", "base_id", "item_id", "correct", "_unparsed", "uncertainty",
)  # fmt: skip


def _variant_range(con: duckdb.DuckDBPyConnection, base: str, perturbed: str) -> str:
    """rob_pairs.sql's range test on the two variant names (a filter DuckDB pushes into the scan),
    or nothing where the connection compares strings under a collation other than the default
    binary one: the names are ordered here by code point, which only binary comparison shares."""
    if scalar(con, "SELECT current_setting('default_collation')"):
        return ""
    return "AND sc.variant BETWEEN '{}' AND '{}'".format(*sorted((base, perturbed)))


def _pairs_view(con: duckdb.DuckDBPyConnection, params: dict, by: Sequence[str]) -> None:
    """Create the views rob_samples, rob_pairs and rob_base_unpaired (``sql/rob_pairs.sql``) for the
    pairing of ``params``, the pair views carrying the strata of ``by`` (the metrics group by no
    other): copying all fifteen strata strings of every sample and pair into the cache cost more
    than the pairing join."""
    kind = params.get("uncertainty", "option_prob")
    if not isinstance(kind, str) or kind not in UNCERTAINTY:
        raise ValueError(f"unknown uncertainty {kind!r}; known: {', '.join(UNCERTAINTY)}")
    sample_index = _int_param(params, "sample_index", 0, 0)
    base, perturbed = _variant(params, "base_variant"), _variant(params, "perturbed_variant")
    if base == perturbed:
        raise ValueError(f"base_variant and perturbed_variant are both {base!r}")
    expr, doc = UNCERTAINTY[kind]
    strata = [c for c in dict.fromkeys(_check_by(by)) if c != "run_id"]  # run_id is always there
    text = (SQL_DIR / "rob_pairs.sql").read_text(encoding="utf-8")
    sql = text.format(
        base_strata="".join(f"b.{c}, " for c in strata),
        base_variant=base,
        perturbed_variant=perturbed,
        variant_range=_variant_range(con, base, perturbed),
        sample_index=sample_index,
        uncertainty_expr=expr,
        uncertainty_doc=doc,
        run_class=RUN_CLASS_SQL,
    )
    if not _materialized(con):
        con.execute(sql)
        return
    # Fixed base relations (a read-only pass over many metrics, see registry.prepare): the pairs
    # (a join of the base and perturbed samples, each with its chosen option probability from
    # scored_probs) are the same for flip_analysis, mcnemar and paired_bootstrap_uncertainty, so
    # they are computed once per pairing and grouping into TEMP tables and the views select from
    # them. The key is the rendered SQL (it names the strata).
    key = "_rob_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
    pairs, unpaired = f"{key}_pairs", f"{key}_base_unpaired"
    if pairs not in temp_tables(con):
        con.execute(sql)  # views only, nothing computed yet
        # both pair views read rob_samples twice (base and perturbed side): compute its few
        # columns they use once, build the two tables from it, then restore the plain views
        cols = ", ".join(dict.fromkeys([*strata, *_SAMPLE_COLUMNS]))
        con.execute(
            f"""CREATE TEMP TABLE {key}_s AS SELECT {cols} FROM rob_samples;
            CREATE OR REPLACE TEMP VIEW rob_samples AS SELECT * FROM {key}_s;
            CREATE TEMP TABLE {unpaired} AS SELECT * FROM rob_base_unpaired;
            CREATE TEMP TABLE {pairs} AS SELECT * FROM rob_pairs;
            DROP TABLE {key}_s;"""
        )
        con.execute(sql)  # rob_samples back to the plain view (of the pairing built last)
    con.execute(
        f"""CREATE OR REPLACE TEMP VIEW rob_pairs AS SELECT * FROM {pairs};
        CREATE OR REPLACE TEMP VIEW rob_base_unpaired AS SELECT * FROM {unpaired};"""
    )


def _alpha(params: dict) -> float:
    v = params.get("alpha", 0.05)
    try:
        alpha = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a number in (0, 1), got {v!r}") from None
    if isinstance(v, bool) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be a number in (0, 1), got {v!r}")
    return alpha


def _n_boot(params: dict) -> int:
    return _int_param(params, "n_boot", 2000, 1)


def _seed(params: dict) -> int:
    return _int_param(params, "seed", 0, 0)


# ---------------------------------------------------------------------------------------------
# seeded resampling
# ---------------------------------------------------------------------------------------------
def _key_part(v: object) -> str:
    pandas = sys.modules.get("pandas")  # a caller's pandas NA; a metrics pass never imports pandas
    if v is None or (isinstance(v, float) and np.isnan(v)) or (pandas is not None and v is pandas.NA):
        return ""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def group_rng(seed: int, key: Sequence[object]) -> np.random.Generator:
    """The generator for one group: seeded by ``seed`` and a hash of the group's key values."""
    text = "\x1f".join(_key_part(v) for v in key)
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed), h])


def percentile_ci(reps: np.ndarray, alpha: float) -> tuple[float, float]:
    """Equal-tailed percentile interval (numpy's default linear interpolation between order stats)."""
    lo, hi = np.percentile(reps, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def bootstrap_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Replicate means of ``x`` resampled with replacement (vectorised per block)."""
    out = np.empty(n_boot)
    _fill_means(x, rng, out)
    return out


def _fill_means(x: np.ndarray, rng: np.random.Generator, out: np.ndarray) -> None:
    """Write into ``out`` the means of ``len(out)`` consecutive replicates drawn from ``rng``: per
    block of b replicates, ``idx = (rng.random((b, n)) * n).astype(np.int64)`` and
    ``x[idx].mean(axis=1)``, computed in place.

    Why in place: with fresh arrays per block (uniforms, indices, gathered values) most of the time
    went to allocating and first touching them; one set of buffers of about ``_BLOCK_CELLS`` cells,
    reused for every block, stays in the CPU cache. The operations and their order are those of
    the plain form (multiply by n, truncate to int64, gather, mean along the row), so every bit of
    the result is the same.
    """
    n = len(x)
    block = max(1, min(len(out), _BLOCK_CELLS // max(n, 1)))
    u = np.empty((block, n))
    idx = np.empty((block, n), dtype=np.int64)
    g = np.empty((block, n))
    done = 0
    while done < len(out):
        b = min(block, len(out) - done)
        ub, ib, gb = u[:b], idx[:b], g[:b]
        rng.random(out=ub)
        np.multiply(ub, n, out=ub)
        np.copyto(ib, ub, casting="unsafe")  # truncation = floor for u * n >= 0, as astype(int64)
        # mode="clip" skips take's per-index range check (about 40% of the gather's time), which can
        # never fire: u = j / 2^53 with j < 2^53, so n - u * n >= n / 2^53, more than half the spacing
        # of the doubles just below n (for n a power of two, n - n / 2^53 is itself a double), so
        # the product rounds below n and every index is in [0, n - 1]
        np.take(x, ib, out=gb, mode="clip")
        np.mean(gb, axis=1, out=out[done : done + b])
        done += b


def _rng_at(rng: np.random.Generator, draws: int) -> np.random.Generator:
    """A generator that continues ``rng``'s stream ``draws`` doubles ahead; ``rng`` must be backed
    by ``np.random.PCG64`` exactly (the caller checks). ``rng`` itself is not moved.

    ``default_rng`` is PCG64, whose ``random`` takes one 64-bit output per double, so jumping
    ``draws`` outputs ahead (``PCG64.advance``, O(log draws)) lands where drawing ``draws``
    uniforms would: a group's replicates can be split into parts drawn in parallel, with the same
    numbers as one sequential pass.
    """
    twin = np.random.PCG64()
    twin.state = rng.bit_generator.state
    twin.advance(draws)
    return np.random.Generator(twin)


def bootstrap_means_parts(
    x: np.ndarray, n_boot: int, rng: np.random.Generator, parts: int
) -> list[tuple[Callable[[], None], np.ndarray]]:
    """The replicate means of ``bootstrap_means(x, n_boot, rng)`` as up to ``parts`` independent
    tasks: returns ``(task, out)`` pairs where running every task (in any order, on any thread)
    fills the concatenation of the ``out`` arrays with exactly those means. Each part draws from a
    copy of the generator advanced to its first replicate (``_rng_at``); with fewer than
    ``_SPLIT_CELLS`` cells per part, or a generator not backed by PCG64 (no exact advance), it is one task.
    """
    n = len(x)
    parts = max(1, min(parts, n_boot, (n * n_boot) // _SPLIT_CELLS))
    if type(rng.bit_generator) is not np.random.PCG64:  # only PCG64 can be advanced exactly
        parts = 1
    out = np.empty(n_boot)
    bounds = [n_boot * i // parts for i in range(parts + 1)]
    tasks: list[tuple[Callable[[], None], np.ndarray]] = []
    for lo, hi in itertools.pairwise(bounds):
        part_rng = rng if parts == 1 else _rng_at(rng, lo * n)
        view = out[lo:hi]
        tasks.append((functools.partial(_fill_means, x, part_rng, view), view))
    return tasks


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------
def _flip(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    _check_names("flip_analysis", params)
    _pairs_view(con, params, by)
    got = columns.fetch(con, render_sql(REGISTRY["flip_analysis"], by, params))
    return {k: v for k, v in got.items() if k != "ord"}


def mcnemar_test(b: int, c: int, exact_below: int = 25) -> tuple[str, float, float]:
    """(method, statistic, p) for discordant counts b, c, by the rule in the module docstring."""
    if b < 0 or c < 0 or exact_below < 1:
        raise ValueError(f"need b, c >= 0 and exact_below >= 1, got b={b}, c={c}, exact_below={exact_below}")
    n = b + c
    if n < exact_below:
        stat = min(b, c)
        p = 1.0 if n == 0 else min(1.0, 2.0 * binom_cdf_half(stat, n))
        return "exact", float(stat), p
    stat = (abs(b - c) - 1) ** 2 / n
    return "chi2", float(stat), chi2_sf_1df(stat)


def _mcnemar(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    _check_names("mcnemar", params)
    alpha, exact_below = _alpha(params), _int_param(params, "exact_below", 25, 1)
    _pairs_view(con, params, by)
    out = columns.fetch(con, render_sql(REGISTRY["mcnemar"], by, params))
    b, c = out["n_correct_to_wrong"], out["n_wrong_to_correct"]
    tests = [mcnemar_test(int(x), int(y), exact_below) for x, y in zip(b, c, strict=True)]
    out["n_discordant"] = b + c
    out["method"] = np.array([t[0] for t in tests], dtype=object)
    out["statistic"] = np.array([t[1] for t in tests], dtype=float)
    out["p_value"] = np.array([t[2] for t in tests], dtype=float)
    out["significant"] = out["p_value"] <= alpha
    return out


def _boot_threads(con: duckdb.DuckDBPyConnection) -> int:
    """Threads for the per-group bootstraps: DuckDB's own thread setting, so a caller who limits
    the connection's threads limits this too."""
    threads = scalar(con, "SELECT current_setting('threads')")
    return max(1, int(threads)) if threads is not None else 1


def _paired_bootstrap(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    _check_names("paired_bootstrap_uncertainty", params)
    alpha, n_boot, seed = _alpha(params), _n_boot(params), _seed(params)
    _pairs_view(con, params, by)
    got = columns.fetch(con, render_sql(REGISTRY["paired_bootstrap_uncertainty"], by, params))

    # Every group draws from its own generator (group_rng), and a large group's replicates are
    # split into parts that each continue its stream at their first replicate
    # (bootstrap_means_parts), so all parts of all groups run in parallel threads (numpy releases
    # the GIL while drawing and gathering) with results identical to a loop: with three groups on
    # two threads, whole groups would leave one thread idle for a third of the time.
    workers = _boot_threads(con)
    keys = _keys(got, by)
    diffs = [np.asarray([] if d is None else d, dtype=float) for d in got["diffs"]]
    split = [
        bootstrap_means_parts(d, n_boot, group_rng(seed, k), workers) if len(d) else []
        for k, d in zip(keys, diffs, strict=True)
    ]
    tasks = [task for parts in split for task, _ in parts]
    if workers > 1 and len(tasks) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda task: task(), tasks))
    else:
        for task in tasks:
            task()

    def one(
        d: np.ndarray, parts: list[tuple[Callable[[], None], np.ndarray]]
    ) -> tuple[int, float, float, float, float]:
        if len(d) == 0:
            return (0, np.nan, np.nan, np.nan, np.nan)
        reps = np.concatenate([view for _, view in parts])
        lo, hi = percentile_ci(reps, alpha)
        p = min(1.0, 2.0 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
        return (len(d), float(d.mean()), lo, hi, p)

    rows = [one(d, parts) for d, parts in zip(diffs, split, strict=True)]
    out = {k: v for k, v in got.items() if k != "diffs"}
    out["n_used"] = np.array([r[0] for r in rows], dtype=np.int64)
    for i, name in enumerate(("mean_diff", "ci_low", "ci_high", "p_value"), start=1):
        out[name] = np.array([r[i] for r in rows], dtype=float)
    p = out["p_value"]
    out["significant"] = columns.where_valid(p <= alpha, ~np.isnan(p))
    return _echo(out, n_boot=n_boot, seed=seed, alpha=alpha)


def _keys(got: columns.Columns, by: Sequence[str]) -> list[tuple]:
    """Each row's values of the grouping columns ``by`` (None for NULL): the key of its generator."""
    n = columns.n_rows(got)
    return list(zip(*(columns.values(got[b]) for b in by), strict=True)) if by else [()] * n


def _echo(out: columns.Columns, **params: object) -> columns.Columns:
    """``out`` with each parameter as a column repeated on every row."""
    n = columns.n_rows(out)
    return {**out, **{k: columns.constant(v, n) for k, v in params.items()}}


def multinomial_bootstrap_ratio(
    c: np.ndarray, m: np.ndarray, n_kind: np.ndarray, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Replicate values of sum(c) / sum(m) over items resampled with replacement, drawn as counts.

    Drawing n items with replacement from items of K kinds (kind k: ``n_kind[k]`` items, each
    with c[k] correct of m[k] samples) only matters through how many of each kind are drawn, and
    those counts are Multinomial(n, n_kind / n). One ``rng.multinomial`` call of shape
    (n_boot, K) therefore gives the whole bootstrap at a cost independent of the number of items.
    """
    n = int(n_kind.sum())
    counts = rng.multinomial(n, n_kind / n, size=n_boot).astype(float)
    return (counts @ c) / (counts @ m)


def _item_key(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """What rob_item_accuracy.sql reads each sample's item from: over the store's current facts the
    integer ``ITEM_CODE`` of ``facts_scored`` (via ``scored_probs``, which keeps it), the rank of
    item_id among the items, so grouping the samples by (strata, run_id, code) forms the same items
    as by the item_id string; otherwise ``scored``'s item_id. Hashing and comparing the id strings
    was most of the per-item aggregate (bootstrap_ci about 0.10 -> 0.08 CPU s at 1M predictions,
    one DuckDB thread); the items' (m, c) kinds, so every result, are the same either way."""
    if uses_facts(con):
        return {"source": "scored_probs", "item_key": ITEM_CODE}
    return {"source": "scored", "item_key": "item_id"}


def _bootstrap_ci(con: duckdb.DuckDBPyConnection, by: Sequence[str], params: dict) -> columns.Columns:
    _check_names("bootstrap_ci", params)
    alpha, n_boot, seed = _alpha(params), _n_boot(params), _seed(params)
    got = columns.fetch(con, render_sql(REGISTRY["bootstrap_ci"], by, {**params, **_item_key(con)}))
    lows, highs = [], []
    for key, c, m, k in zip(_keys(got, by), got["c"], got["m"], got["n_kind"], strict=True):
        if not isinstance(c, (list, np.ndarray)) or len(c) == 0:  # by=[] and no predictions: one NULL row
            lows.append(np.nan)
            highs.append(np.nan)
            continue
        reps = multinomial_bootstrap_ratio(
            np.asarray(c, dtype=float),
            np.asarray(m, dtype=float),
            np.asarray(k, dtype=np.int64),
            n_boot,
            group_rng(seed, tuple(key)),
        )
        lo, hi = percentile_ci(reps, alpha)
        lows.append(lo)
        highs.append(hi)
    out = {k: v for k, v in got.items() if k not in ("c", "m", "n_kind")}
    out["ci_low"] = np.array(lows, dtype=float)
    out["ci_high"] = np.array(highs, dtype=float)
    return _echo(out, n_boot=n_boot, seed=seed, alpha=alpha)


_PAIR_PARAMS = {
    "base_variant": "original",
    "perturbed_variant": "plus_nota",
    "sample_index": 0,
    "uncertainty": "option_prob",
}

register(
    Metric(
        name="flip_analysis",
        description="stable / flipped categories between a base and a perturbed variant with the "
        "relative baseline uncertainty of each category (seed 004 5.2, Table 3)",
        sql="rob_flip.sql",
        default_by=DEFAULT_BY,
        params=dict(_PAIR_PARAMS),
        compute_fn=_flip,
    )
)
register(
    Metric(
        name="mcnemar",
        description="McNemar test of the accuracy change from base to perturbed variant (exact binomial "
        "below 25 discordant pairs, else chi-square with continuity correction; seed 004 3.4)",
        sql="rob_mcnemar.sql",
        default_by=DEFAULT_BY,
        params={**_PAIR_PARAMS, "alpha": 0.05, "exact_below": 25},
        compute_fn=_mcnemar,
    )
)
register(
    Metric(
        name="paired_bootstrap_uncertainty",
        description="paired bootstrap of the mean uncertainty change perturbed - base, percentile CI "
        "and two-sided p (seed 004 3.4)",
        sql="rob_paired_diffs.sql",
        default_by=DEFAULT_BY,
        params={**_PAIR_PARAMS, "alpha": 0.05, "n_boot": 2000, "seed": 0},
        compute_fn=_paired_bootstrap,
    )
)
register(
    Metric(
        name="bootstrap_ci",
        description="accuracy with a seeded percentile bootstrap CI resampling items",
        sql="rob_item_accuracy.sql",
        default_by=("model",),
        params={"alpha": 0.05, "n_boot": 2000, "seed": 0},
        compute_fn=_bootstrap_ci,
    )
)
