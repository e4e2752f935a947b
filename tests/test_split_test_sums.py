"""The numpy test sums of split conformal (``split_test_sums``) against their definitions: a direct count
per segment and repeat in plain Python with DuckDB's comparison of doubles, and, over a store's
facts, the SQL of ``conf_split.sql`` (``test_rep_own``) row for row, with the metrics that read them."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import conformal, split_test_sums, split_thresholds
from equipoise.evaluators.metrics.registry import compute, metric_names, prepare
from tests.conftest import ROUNDED_AND_NAN_RUNS, option_mask, with_run_copies

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -2.5, 0.25, 1e-300]


def duckdb_le(x: float, q: float) -> bool:
    """x <= q as DuckDB compares doubles, written out: NaN is above every number and equal to
    itself, -0.0 equals 0.0 (Python's float comparison already makes it so)."""
    if math.isnan(q):
        return True
    if math.isnan(x):
        return False
    return x <= q


def test_compare_key_orders_as_duckdb_compares() -> None:
    values = [*SPECIAL, -1e-300, 2.0, -0.0]
    con = duckdb.connect()
    want = con.execute(
        "SELECT list(a <= b ORDER BY i, j) "
        "FROM (SELECT i, a FROM unnest(?::DOUBLE[]) WITH ORDINALITY t(a, i)) "
        "CROSS JOIN (SELECT j, b FROM unnest(?::DOUBLE[]) WITH ORDINALITY t(b, j))",
        [values, values],
    ).fetchone()[0]
    keys = split_test_sums.compare_key(np.array(values))
    got = [bool(keys[i] <= keys[j]) for i in range(len(values)) for j in range(len(values))]
    assert got == want
    assert got == [duckdb_le(a, b) for a in values for b in values]


def test_flags_read_every_word_in_bit_order() -> None:
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 64, (2, 3_000), dtype=np.uint64)
    flags = split_thresholds.calibration_flags(words, 100)
    assert flags.shape == (3_000, 100)
    for r in (0, 7, 8, 63, 64, 99):
        np.testing.assert_array_equal(flags[:, r], (words[r // 64] >> np.uint64(r % 64)) & np.uint64(1))


def brute_force(seg, seg_group, words, has_target, target, opt_unit, opt_score, q, repeats):
    """The definition, segment by segment and repeat by repeat, one unit at a time."""
    n_seg = len(seg_group)
    out = {name: np.zeros((n_seg, repeats), dtype=np.int64) for name in split_test_sums.SUMS}
    options = [[] for _ in range(len(seg))]
    for u, x in zip(opt_unit.tolist(), opt_score.tolist(), strict=True):
        options[u].append(x)
    for u in range(len(seg)):
        s = int(seg[u])
        for r in range(repeats):
            if (int(words[r // 64, u]) >> (r % 64)) & 1:
                continue  # calibration in this repeat
            qr = float(q[seg_group[s], r])
            inside = sum(duckdb_le(x, qr) for x in options[u])
            out["n"][s, r] += 1
            out["sz"][s, r] += inside
            out["cv"][s, r] += bool(has_target[u]) and duckdb_le(float(target[u]), qr)
            out["em"][s, r] += inside == 0
    return out


def random_case(seed: int, n_units: int, n_groups: int, n_seg: int, repeats: int, spread: float):
    """Units with 0-5 option scores drawn from a few values (ties with the thresholds), the special
    doubles, and normal noise; thresholds per group and repeat from the same values, +inf (NULL
    q_hat), NaN, and a band ``spread`` wide (how far a group's q_hat move between repeats)."""
    rng = np.random.default_rng(seed)
    seg_group = np.sort(rng.integers(0, n_groups, n_seg))
    seg = rng.integers(0, n_seg, n_units)
    words = rng.integers(0, 1 << 64, ((repeats + 63) // 64, n_units), dtype=np.uint64)
    pool = np.array([*SPECIAL, 0.5, 0.6, 0.7, 0.8])

    def draw(n: int) -> np.ndarray:
        kind = rng.random(n)
        return np.where(kind < 0.2, rng.choice(pool, n), rng.normal(0.6, 0.3, n))

    n_opts = rng.integers(0, 6, n_units)
    opt_unit = np.repeat(np.arange(n_units), n_opts)
    opt_score = draw(len(opt_unit))
    has_target = rng.random(n_units) < 0.85
    target = np.where(has_target, draw(n_units), 0.0)
    base = rng.normal(0.6, 0.2, (n_groups, 1))
    q = base + rng.uniform(-spread, spread, (n_groups, repeats))
    special = rng.random((n_groups, repeats))
    q = np.where(special < 0.05, np.inf, q)
    q = np.where((special >= 0.05) & (special < 0.08), np.nan, q)
    q = np.where((special >= 0.08) & (special < 0.2), rng.choice(pool, (n_groups, repeats)), q)
    return seg, seg_group, words, has_target, target, opt_unit, opt_score, q, repeats


@pytest.mark.parametrize(
    ("seed", "n_units", "n_groups", "n_seg", "repeats", "spread"),
    [(1, 400, 3, 7, 70, 0.05), (2, 300, 1, 1, 130, 0.4), (3, 250, 4, 4, 9, 0.0), (4, 200, 2, 6, 64, 1.0)],
)
def test_test_sums_equal_a_direct_count(seed, n_units, n_groups, n_seg, repeats, spread, monkeypatch) -> None:
    case = random_case(seed, n_units, n_groups, n_seg, repeats, spread)
    want = brute_force(*case)
    for rows in (split_test_sums.CHUNK_ROWS, 37):  # one chunk, and many (segments cut across chunks)
        monkeypatch.setattr(split_test_sums, "CHUNK_ROWS", rows)
        got = split_test_sums.test_sums(*case)
        for name in split_test_sums.SUMS:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name}, {rows} rows a chunk")


def test_no_units_give_zero_sums() -> None:
    got = split_test_sums.test_sums(
        np.zeros(0, np.int64),
        np.array([0]),
        np.zeros((1, 0), np.uint64),
        np.zeros(0, bool),
        np.zeros(0),
        np.zeros(0, np.int64),
        np.zeros(0),
        np.zeros((1, 5)),
        5,
    )
    assert all(got[name].shape == (1, 5) and not got[name].any() for name in split_test_sums.SUMS)


# ----------------------------------------------------------------------------------------------------
# over a store's facts: the test sums table and the metrics, numpy vs SQL


@pytest.fixture(scope="module")
def facts_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Facts of a store where a second run of one (model, config) repeats the first run's items with
    rounded option scores (ties between options, and with q_hat), and a third has NaN option scores on
    about a quarter of its items (NaN target scores and thresholds)."""
    return with_run_copies(
        tmp_path_factory.mktemp("split_test_sums") / "s.duckdb", 17, 80, ROUNDED_AND_NAN_RUNS
    )


CASES = [
    (["model", "config"], {"repeats": 7, "seed": 3}),
    (["model"], {"repeats": 100, "seed": 0, "cal_fraction": 0.5, "alpha": 0.2}),
    (["config"], {"repeats": 20, "seed": 5, "stratify": ("target_role", "specialty"), "alpha": 0.01}),
    ([], {"repeats": 3, "seed": 1, "sample_index": 1}),
]


def _differing(con: duckdb.DuckDBPyConnection, a: str, b: str) -> tuple[int, int, int]:
    """Rows of two test sums tables (rows, rows in one only or differing in a sum, rows of ``a``)."""
    sums = " OR ".join(f"a.{c} IS DISTINCT FROM b.{c}" for c in split_test_sums.SUMS)
    return con.execute(
        f"""SELECT count(*), count(*) FILTER (a.rep IS NULL OR b.rep IS NULL OR {sums}),
                   count(a.rep)
            FROM {a} a FULL JOIN {b} b
              ON a.gid = b.gid AND a.cov IS NOT DISTINCT FROM b.cov AND a.rep = b.rep"""
    ).fetchone()


def _compare(path: Path, by: list[str], params: dict) -> list[tuple]:
    """Per score and coverage_by column (none, and two), numpy's table against the SQL's:
    (score, column, _differing, the two schemas, the special thresholds [NULL, NaN] they met)."""
    out = []
    with option_mask(path, by, params) as (con, values, mask):
        for score in ("lac", "aps"):
            thr = conformal._threshold_table(con, mask, score, values)
            special = con.execute(
                f"SELECT [count(*) FILTER (q_hat IS NULL), count(*) FILTER (isnan(q_hat))] FROM {thr}"
            ).fetchone()[0]
            for cov in (None, "specialty", "target_role"):
                conformal._numpy_test_rep_table(con, "_s_np", mask, score, values, cov)
                sql = conformal._test_rep_query(con, mask, score, values, cov)
                con.execute(f"CREATE TEMP TABLE _s_sql AS {sql}")
                schemas = [con.execute(f"DESCRIBE {t}").fetchall() for t in ("_s_np", "_s_sql")]
                out.append((score, cov, _differing(con, "_s_np", "_s_sql"), schemas, special))
                con.execute("DROP TABLE _s_np; DROP TABLE _s_sql")
    return out


@pytest.mark.parametrize(("by", "params"), CASES, ids=["default", "one-hundred", "strata", "ungrouped"])
def test_numpy_test_sums_table_equals_the_sql_one(facts_store, by, params) -> None:
    metric_names()
    for score, cov, (rows, differing, np_rows), (np_schema, sql_schema), _ in _compare(
        facts_store, by, params
    ):
        assert rows == np_rows > 0 and differing == 0, (score, cov)
        if cov is None:  # the SQL's cov is an untyped NULL there; numpy's a BIGINT NULL
            np_schema = [c for c in np_schema if c[0] != "cov"]
            sql_schema = [c for c in sql_schema if c[0] != "cov"]
        assert np_schema == sql_schema, (score, cov)


def test_nan_and_null_thresholds_are_reached(facts_store) -> None:
    """The store cases above meet both kinds of special threshold, so the equality covers them."""
    metric_names()
    specials = [c[4] for c in _compare(facts_store, *CASES[0])] + [
        c[4] for c in _compare(facts_store, *CASES[2])
    ]
    assert any(nan > 0 for _, nan in specials) and any(null > 0 for null, _ in specials)


# a run copy that scores only some labels: no scores at all on about a third of its items (NULL
# lists: units without option scores or target), and no score for label A on another third (the
# target unscored wherever A is the item's target)
_PART = "CASE hash(item_id) % 3 WHEN 0 THEN NULL WHEN 1 THEN list_filter({}) ELSE {} END AS {}"
PARTIAL_RUN = {
    "partial": ", ".join(
        [
            _PART.format("score_labels, lambda x: x <> 'A'", "score_labels", "score_labels"),
            _PART.format(
                "score_logprobs, lambda x, i: score_labels[i] <> 'A'", "score_logprobs", "score_logprobs"
            ),
        ]
    )
}


@pytest.fixture(scope="module")
def partial_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Facts of a store with the runs of ``facts_store`` plus a run that leaves labels unscored."""
    return with_run_copies(
        tmp_path_factory.mktemp("split_test_sums_partial") / "s.duckdb",
        23,
        80,
        {**ROUNDED_AND_NAN_RUNS, **PARTIAL_RUN},
    )


@pytest.mark.parametrize(("by", "params"), CASES, ids=["default", "one-hundred", "strata", "ungrouped"])
def test_numpy_test_sums_equal_the_sql_with_unscored_labels(partial_store, by, params) -> None:
    """Records that score no label or not their target's: the same rows from numpy as from the SQL."""
    metric_names()
    con = duckdb.connect(str(partial_store.with_name("s.duckdb")), read_only=True)
    try:
        none, untargeted = con.execute(
            """SELECT count(*) FILTER (p.score_labels IS NULL),
                      count(*) FILTER (NOT list_contains(p.score_labels, i.target_label))
               FROM predictions p JOIN runs r USING (run_id)
               JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
               WHERE p.run_id LIKE '%-partial'"""
        ).fetchone()
    finally:
        con.close()
    assert none > 0 and untargeted > 0
    for score, cov, (rows, differing, np_rows), _, _ in _compare(partial_store, by, params):
        assert rows == np_rows > 0 and differing == 0, (score, cov)


@pytest.mark.parametrize("run_rows", [1, 7, 50])
def test_numpy_test_sums_in_runs_are_the_same(facts_store, run_rows, monkeypatch) -> None:
    """Units handed over in runs of a few mask rows (a group's units spread over many runs, a run
    with no unit): the same rows as in one piece, and as the SQL's."""
    metric_names()
    by, params = CASES[0]
    with option_mask(facts_store, by, params) as (con, values, mask):
        n_rows = con.execute(f"SELECT count(*) FROM {mask}").fetchone()[0]
        assert n_rows > 3 * run_rows
        for score, cov in (("lac", "specialty"), ("aps", None)):
            conformal._numpy_test_rep_table(con, "_whole", mask, score, values, cov)
            monkeypatch.setattr(conformal, "NUMPY_TEST_SUMS_RUN_ROWS", run_rows)
            conformal._numpy_test_rep_table(con, "_parts", mask, score, values, cov)
            monkeypatch.undo()
            con.execute(
                f"CREATE TEMP TABLE _sql AS {conformal._test_rep_query(con, mask, score, values, cov)}"
            )
            for other in ("_whole", "_sql"):
                rows, differing, _ = _differing(con, "_parts", other)
                assert rows > 0 and differing == 0, (score, cov, other)
            con.execute("DROP TABLE _whole; DROP TABLE _parts; DROP TABLE _sql")


@pytest.mark.parametrize(("by", "params"), CASES[:3], ids=["default", "one-hundred", "strata"])
@pytest.mark.parametrize("first", ["conformal_coverage_by", "conformal_lac"])
def test_metrics_are_the_same_with_either_test_sums(facts_store, by, params, first, monkeypatch) -> None:
    """conformal_lac, conformal_aps and conformal_coverage_by (LAC and APS) read the test sums: the
    same frames whichever path made them, and whichever of coverage_by and conformal_lac runs first
    (conformal_lac reads coverage_by's table where it is held, its own group table otherwise)."""
    metric_names()
    names = [first, *(n for n in ("conformal_coverage_by", "conformal_lac") if n != first), "conformal_aps"]
    frames, tables = {}, {}
    for numpy_sums in (True, False):
        monkeypatch.setattr(conformal, "NUMPY_TEST_SUMS", numpy_sums)
        con = duckdb.connect(str(facts_store), read_only=True)
        try:
            prepare(con, materialize=True)
            frames[numpy_sums] = [compute(con, name, by, params) for name in names] + [
                compute(con, "conformal_coverage_by", by, {**params, "score": "aps", "coverage_by": "task"})
            ]
            tables[numpy_sums] = sorted(
                t[:11] for t in conformal.temp_tables(con) if t.startswith("_conf_trep")
            )
        finally:
            con.close()
    for got, want in zip(frames[True], frames[False], strict=True):
        assert len(got) > 0
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    # numpy: a group table for APS, and for LAC where it ran before coverage_by; the SQL: none
    lac_first = first == "conformal_lac"
    assert tables[True] == sorted(["_conf_trep_"] * 2 + ["_conf_trepg"] * (1 + lac_first))
    assert tables[False] == ["_conf_trep_"] * 2
