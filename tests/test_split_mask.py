"""The numpy split of conformal's option units (``split_mask``) against its definitions: the SplitMix64
stream in plain Python integers and in the SQL the other unit sets use, a full sort of (hash, unit key,
run) per stratum, and, over a store's facts, the SQL mask table (``conf_mask.sql``) bit for bit."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import conformal, split_mask
from equipoise.evaluators.metrics.registry import REGISTRY, compute, metric_names, prepare
from tests.conftest import option_mask, with_run_copies

M64 = (1 << 64) - 1


def splitmix_output(seed: int, r: int) -> int:
    """Output r + 1 of SplitMix64 seeded with ``seed``, in Python's unbounded integers."""
    z = (seed + (r + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


SEEDS = [0, 1, 2**63, M64, 0x0123456789ABCDEF, *(random.Random(7).getrandbits(64) for _ in range(20))]


def test_split_hashes_are_splitmix64_outputs() -> None:
    kb = np.array(SEEDS, dtype=np.uint64)
    for r in (0, 1, 19, 63, 64, 99):
        assert split_mask.split_hashes(kb, r).tolist() == [splitmix_output(s, r) for s in SEEDS]


@pytest.mark.parametrize("block", [1, 3, len(SEEDS), 64])
def test_split_hashes_in_blocks_are_the_same(block: int) -> None:
    """The in-place, block by block hashing of calibration_words gives SplitMix64's outputs, with
    blocks that divide the keys, leave a short last block, or hold them all."""
    kb = np.array(SEEDS, dtype=np.uint64)
    out = np.empty_like(kb)
    scratch = np.empty(block, dtype=np.uint64)  # 64: a scratch longer than the keys
    for r in (0, 5, 99):
        got = split_mask._split_hashes_into(kb, r, out, scratch)
        assert got is out and out.tolist() == [splitmix_output(s, r) for s in SEEDS]


def test_split_hashes_equal_the_sql_stream() -> None:
    """The SQL that every other unit set uses (``conformal._split_hashes_expr``) gives the same hashes."""
    con = duckdb.connect()
    repeats = 70
    expr = conformal._split_hashes_expr(repeats)
    kb = np.array(SEEDS, dtype=np.uint64)
    for i, seed in enumerate(SEEDS):
        got = con.execute(f"SELECT {expr} FROM (SELECT ?::UBIGINT AS kb)", [seed]).fetchone()[0]
        assert got == [int(split_mask.split_hashes(kb, r)[i]) for r in range(repeats)]


def brute_force_words(sizes, key_pos, key_rank, run_rank, kb, repeats, num, den) -> np.ndarray:
    """The definition, unit by unit: per stratum, sort (h_r, unit key, run) and mark the first n_cal."""
    n = int(sum(sizes))
    words = np.zeros(((repeats + 63) // 64, n), dtype=np.uint64)
    start = 0
    for size in sizes:
        units = range(start, start + size)
        start += size
        k = (2 * num * size + den) // (2 * den)
        for r in range(repeats):
            ranked = sorted(
                units, key=lambda u: (splitmix_output(int(kb[key_pos[u]]), r), key_rank[u], run_rank[u])
            )
            for u in ranked[:k]:
                words[r // 64, u] |= np.uint64(1 << (r % 64))
    return words


# calibration_words' two ways of comparing and counting (stratum by stratum against scalars, up to
# SLICE_STRATA live strata; every unit at once against per-unit bounds, forced here with 0), the
# second with hash blocks of a few values (blocks cut across strata and across the units' array)
PATHS = pytest.mark.parametrize(
    ("slice_strata", "hash_block"),
    [(split_mask.SLICE_STRATA, split_mask.HASH_BLOCK), (0, 5)],
    ids=["by-stratum", "all-units-small-blocks"],
)


@PATHS
@pytest.mark.parametrize(
    ("n_keys", "n_runs", "n_strata", "repeats", "cal"),
    [(40, 3, 4, 7, (3, 10)), (6, 5, 3, 70, (1, 3)), (25, 1, 9, 20, (9, 10)), (12, 4, 12, 5, (1, 100))],
    ids=["default-like", "heavy-ties-two-words", "one-run", "tiny-fraction"],
)
@pytest.mark.parametrize(
    "window", [None, (0.0, 0), (0.0, 1), (50.0, 1000)], ids=["as-set", "none", "one-unit", "everything"]
)
@pytest.mark.parametrize("tie_order", [False, True], ids=["shuffled", "tie-ordered"])
def test_calibration_words_equal_a_full_sort(
    n_keys, n_runs, n_strata, repeats, cal, window, tie_order, slice_strata, hash_block, monkeypatch
) -> None:
    """Units are (key, run) pairs, so every key's runs tie on the hash and the tie-break decides; strata
    of one or two units get n_cal 0 or 1 (with 1/100, none). The guessed windows as set, of no
    width (the guess misses nearly always: np.partition selects), one unit wide, and wide enough
    to hold every unit (the window's sort selects every stratum): the same words. The units of a
    stratum in no particular order, or in tie-break order, as conformal.py hands them over (the
    window's sort by hash alone then keeps tied units in order). Units fewer than twice the keys
    (one run) are hashed unit by unit, the others hashed by key and gathered: both are here."""
    monkeypatch.setattr(split_mask, "SLICE_STRATA", slice_strata)
    monkeypatch.setattr(split_mask, "HASH_BLOCK", hash_block)
    if window is not None:
        monkeypatch.setattr(split_mask, "WINDOW_SD", window[0])
        monkeypatch.setattr(split_mask, "WINDOW_PAD", window[1])
    rng = np.random.default_rng(n_keys * 100 + n_runs)
    pairs = [(k, r) for k in range(n_keys) for r in range(n_runs) if rng.random() < 0.8]
    rng.shuffle(pairs)  # within a stratum, in no particular order
    sizes = np.bincount(rng.integers(0, n_strata, len(pairs)), minlength=n_strata)
    if tie_order:
        ends = np.cumsum(sizes)
        pairs = [p for a, b in zip(ends - sizes, ends, strict=True) for p in sorted(pairs[a:b])]
    key = np.array([p[0] for p in pairs])
    run = np.array([p[1] for p in pairs])
    kb = rng.integers(0, 1 << 64, n_keys, dtype=np.uint64)  # by key
    perm = rng.permutation(n_keys)  # where each key's base sits in the array handed over
    kb_by_pos = np.empty_like(kb)
    kb_by_pos[perm] = kb
    args = (sizes, perm[key], key * 3 + 1, run, kb_by_pos, repeats, *cal)
    np.testing.assert_array_equal(split_mask.calibration_words(*args), brute_force_words(*args))


@pytest.mark.parametrize(
    ("sizes", "repeats", "cal"),
    [
        ([5, 1, 0, 7, 1, 30, 2], 9, (3, 10)),  # empty and n_cal-0 strata between live ones
        ([300, 0, 2, 280, 1, 150], 12, (3, 10)),  # strata much wider than their windows
        ([400, 3, 1, 250], 66, (1, 2)),  # two words, the second one's only byte partly used
    ],
    ids=["empty-and-dead-strata", "wide-strata", "two-words-wide"],
)
@pytest.mark.parametrize("tie_order", [False, True], ids=["shuffled", "tie-ordered"])
@PATHS
def test_calibration_words_equal_a_full_sort_on_fixed_strata(
    sizes, repeats, cal, tie_order, slice_strata, hash_block, monkeypatch
) -> None:
    """Fixed strata sizes, so that what the random shapes above may miss is there every time:
    strata with no unit or no calibration unit beside live ones (their flags must not reach the
    live strata's counts), and strata of hundreds of units, where the windows as set hold a few %
    of a stratum and most units are decided by the window's bounds alone."""
    monkeypatch.setattr(split_mask, "SLICE_STRATA", slice_strata)
    monkeypatch.setattr(split_mask, "HASH_BLOCK", hash_block)
    rng = np.random.default_rng(sum(sizes) + repeats)
    n_keys, n_runs = 200, 3
    strata = []
    for size in sizes:  # each stratum: distinct (key, run) pairs, runs of one key tie on the hash
        picks = rng.choice(n_keys * n_runs, size, replace=False)
        pairs = [(int(p) // n_runs, int(p) % n_runs) for p in picks]
        strata.append(sorted(pairs) if tie_order else pairs)
    pairs = [p for stratum in strata for p in stratum]
    key = np.array([p[0] for p in pairs], dtype=np.int64)
    run = np.array([p[1] for p in pairs], dtype=np.int64)
    kb = rng.integers(0, 1 << 64, n_keys, dtype=np.uint64)
    args = (np.array(sizes), key, key * 2 + 5, run, kb, repeats, *cal)
    got = split_mask.calibration_words(*args)
    np.testing.assert_array_equal(got, brute_force_words(*args))
    ends = np.cumsum(sizes)
    for a, b, size in zip(ends - np.array(sizes), ends, sizes, strict=True):  # n_cal units every repeat
        for r in range(repeats):
            on = (got[r // 64, a:b] >> np.uint64(r % 64)) & np.uint64(1)
            assert int(on.sum()) == split_mask.n_cal(size, *cal)


def test_no_units_give_no_words() -> None:
    none = np.array([], dtype=np.int64)
    got = split_mask.calibration_words(none, none, none, none, np.array([], np.uint64), 70, 3, 10)
    assert got.shape == (2, 0)


# ----------------------------------------------------------------------------------------------------
# over a store's facts: the mask table and the metrics, numpy vs SQL


@pytest.fixture(scope="module")
def tied_facts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Facts of a store where a second run of one (model, config) repeats the first run's items with
    other option scores, so their units tie on the split hash in every repeat, and a run whose
    items have no option scores (no units)."""
    copies = {
        "rerun": "list_transform(score_logprobs, lambda x: x * 0.5) AS score_logprobs",
        "unscored": "NULL AS score_labels, NULL AS score_logprobs",
    }
    return with_run_copies(tmp_path_factory.mktemp("split_mask") / "s.duckdb", 11, 70, copies)


CASES = [
    (["model", "config"], {"repeats": 7, "seed": 3}),
    (["model"], {"repeats": 70, "seed": 0, "cal_fraction": 0.5}),
    (["config"], {"repeats": 20, "seed": 5, "stratify": ("target_role", "specialty"), "cal_fraction": 0.1}),
    ([], {"repeats": 3, "seed": 1, "sample_index": 1}),
]


def _mask_run(path: Path, by: list[str], params: dict, monkeypatch, metrics: bool = False) -> tuple:
    """Build the option units' mask table on a fresh read-only connection: what the numpy path
    returned each time it was asked (True: it built the table; False: it left it to the SQL; no
    call: the SQL from the start), the table, and with ``metrics`` its schema and the three option
    metrics."""
    built: list[bool] = []
    real = conformal._coded_mask_table

    def spy(con, table, values):
        built.append(real(con, table, values))
        return built[-1]

    monkeypatch.setattr(conformal, "_coded_mask_table", spy)
    with option_mask(path, by, params) as (con, _, table):
        mask = con.execute(f"SELECT * FROM {table} ORDER BY sc_row").df()
        if not metrics:
            return built, mask
        schema = con.execute(f"DESCRIBE {table}").fetchall()
        frames = [compute(con, name, by, params) for name in ("conformal_lac", "conformal_aps")]
        frames.append(compute(con, "conformal_coverage_by", by, params))
    return built, mask, schema, frames


def _mask_and_metrics(path: Path, numpy_mask: bool, by: list[str], params: dict, monkeypatch) -> tuple:
    """The mask table, its schema and the three option metrics with the numpy split on or off;
    asserts that the numpy path built the table exactly when it was on."""
    monkeypatch.setattr(conformal, "NUMPY_MASK", numpy_mask)
    built, *rest = _mask_run(path, by, params, monkeypatch, metrics=True)
    assert built == ([True] if numpy_mask else [])
    return tuple(rest)


@pytest.mark.parametrize(("by", "params"), CASES, ids=["default", "two-words", "strata", "ungrouped"])
def test_numpy_mask_table_equals_the_sql_one(tied_facts, by, params, monkeypatch) -> None:
    metric_names()
    mask_np, schema_np, frames_np = _mask_and_metrics(tied_facts, True, by, params, monkeypatch)
    mask_sql, schema_sql, frames_sql = _mask_and_metrics(tied_facts, False, by, params, monkeypatch)
    assert schema_np == schema_sql
    assert mask_np["m0"].notna().sum() > 0 and mask_np["m0"].isna().sum() > 0  # units and non-units
    pd.testing.assert_frame_equal(mask_np, mask_sql, check_exact=True)
    for got, want in zip(frames_np, frames_sql, strict=True):
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_a_sample_without_units_gives_the_same_empty_table(tied_facts, monkeypatch) -> None:
    """A sample no prediction has (sample_index 7): no units, no rows, the same columns."""
    metric_names()
    by, params = ["model"], {"repeats": 70, "seed": 2, "sample_index": 7}
    got = _mask_and_metrics(tied_facts, True, by, params, monkeypatch)
    want = _mask_and_metrics(tied_facts, False, by, params, monkeypatch)
    assert len(got[0]) == 0 and got[1] == want[1]
    for a, b in zip(got[2], want[2], strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize("chunk", ["a third", "one stratum", "one unit"])
def test_the_numpy_mask_in_runs_of_strata_is_the_same(tied_facts, chunk, monkeypatch) -> None:
    """A store with more units than ``NUMPY_MASK_CHUNK_UNITS`` is split run of strata by run of
    strata (a stratum larger than the limit alone), each run with only its own items hashed: the
    table is the one-piece table, row for row and bit for bit, in 1 to 70 repeats."""
    metric_names()
    for by, params in (CASES[0], CASES[1], CASES[2]):
        built, whole = _mask_run(tied_facts, by, params, monkeypatch)
        units = int(whole["m0"].notna().sum())
        strata = whole[whole["m0"].notna()].groupby(["gid", "sid"]).size()
        assert built == [True] and len(strata) > 2
        limit = {"a third": units // 3, "one stratum": int(strata.min()), "one unit": 1}[chunk]
        monkeypatch.setattr(conformal, "NUMPY_MASK_CHUNK_UNITS", limit)
        runs = conformal._mask_chunks(strata.to_numpy())
        assert len(runs) > 2 and runs[0][0] == 0 and runs[-1][1] == len(strata) - 1
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(runs))  # every stratum once
        built, parts = _mask_run(tied_facts, by, params, monkeypatch)
        assert built == [True]
        pd.testing.assert_frame_equal(parts, whole, check_exact=True)
        monkeypatch.undo()


def test_a_failed_run_leaves_no_part_of_the_table(tied_facts, monkeypatch) -> None:
    """The split fails in its second run of strata: the error reaches the caller, and no part of
    the mask table stays behind for a later metric to take for the whole (the next ask builds it
    whole)."""
    metric_names()
    by, params = CASES[0]
    whole = _mask_run(tied_facts, by, params, monkeypatch)[1]
    monkeypatch.setattr(conformal, "NUMPY_MASK_CHUNK_UNITS", int(whole["m0"].notna().sum()) // 3)
    real, calls = conformal.split_mask.calibration_words, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("no room for the second run")
        return real(*args, **kwargs)

    monkeypatch.setattr(conformal.split_mask, "calibration_words", flaky)
    con = duckdb.connect(str(tied_facts), read_only=True)
    try:
        prepare(con, materialize=True)
        values = conformal._common(by, {**REGISTRY["conformal_lac"].params, **params})
        with pytest.raises(MemoryError, match="second run"):
            conformal._option_mask_table(con, values)
        assert conformal._mask_table_name(con, values) not in conformal.temp_tables(con)
        assert not any(t.endswith("_staged") for t in conformal.temp_tables(con))
        table = conformal._option_mask_table(con, values)
        again = con.execute(f"SELECT * FROM {table} ORDER BY sc_row").df()
    finally:
        con.close()
    pd.testing.assert_frame_equal(again, whole, check_exact=True)


def test_many_strata_fall_back_to_the_sql_mask(tied_facts, monkeypatch) -> None:
    """More (stratum, repeat) steps than ``NUMPY_MASK_MAX_STEPS``: the numpy path gives up before
    computing anything (the SQL handles many strata in one pass), and the SQL table is the same."""
    metric_names()
    by, params = CASES[2]
    built, mask_np = _mask_run(tied_facts, by, params, monkeypatch)
    assert built == [True]
    strata = len(mask_np[mask_np["m0"].notna()].groupby(["gid", "sid"]))
    monkeypatch.setattr(conformal, "NUMPY_MASK_MAX_STEPS", strata * params["repeats"] - 1)
    built, mask_sql = _mask_run(tied_facts, by, params, monkeypatch)
    assert built == [False]
    pd.testing.assert_frame_equal(mask_sql, mask_np, check_exact=True)
