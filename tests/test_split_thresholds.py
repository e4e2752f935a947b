"""The numpy thresholds of split conformal (``split_thresholds``) against their definitions: a plain
sort of each group's calibration scores per repeat, DuckDB's order of doubles, and, over a store's
facts, the SQL of ``conf_split.sql`` (``thr_own``) bit for bit, with the metrics that read them."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import conformal, split_thresholds
from equipoise.evaluators.metrics.registry import compute, metric_names, prepare
from tests.conftest import ROUNDED_AND_NAN_RUNS, option_mask, with_run_copies

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -2.5, 1e-300, -1e-300]


def test_order_key_sorts_as_duckdb_sorts_doubles() -> None:
    """Numbers in numeric order, every NaN above +inf: the order of DuckDB's ORDER BY."""
    rng = np.random.default_rng(3)
    values = np.concatenate([SPECIAL, rng.normal(0, 1e3, 200), np.round(rng.normal(0, 2, 200))])
    order = np.argsort(split_thresholds.order_key(values), kind="stable")
    con = duckdb.connect()
    want = [
        r[0]
        for r in con.execute(
            "SELECT x FROM unnest(?::DOUBLE[]) t(x) ORDER BY x", [values.tolist()]
        ).fetchall()
    ]
    got = values[order].tolist()
    assert [np.isnan(x) for x in got] == [np.isnan(x) for x in want]
    assert [x for x in got if not np.isnan(x)] == [x for x in want if not np.isnan(x)]


def test_calibration_counts_and_flags_read_every_word() -> None:
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << 64, (2, 40_000), dtype=np.uint64)
    flags = split_thresholds.calibration_flags(words, 70)
    for r in (0, 5, 63, 64, 69):
        want = (words[r // 64] >> np.uint64(r % 64)) & np.uint64(1)
        np.testing.assert_array_equal(flags[:, r], want)
    np.testing.assert_array_equal(split_thresholds.calibration_counts(words, 70), flags.sum(axis=0))


def brute_force(group, scored, score, words, n_cal, k_order, repeats):
    """The definition, group by group and repeat by repeat: the calibration units' target scores in
    DuckDB's descending order (NaN first), and the (n - k + 1)-th of them, n = their number."""
    q = np.zeros((len(n_cal), repeats))
    defined = np.zeros((len(n_cal), repeats), dtype=bool)
    for g in range(len(n_cal)):
        for r in range(repeats):
            cal = [u for u in range(len(group)) if group[u] == g and (int(words[r // 64, u]) >> (r % 64)) & 1]
            values = sorted(
                (float(score[u]) for u in cal if scored[u]), key=lambda x: (np.isnan(x), x), reverse=True
            )
            n = int(n_cal[g]) - sum(1 for u in cal if not scored[u])
            assert n == len(values)
            if k_order[g] <= n:
                q[g, r], defined[g, r] = values[n - int(k_order[g])], True
    return q, defined


def random_case(seed: int, n_groups: int, repeats: int, share: float, ties: bool, unscored: float):
    """Units in ``n_groups`` groups (some empty), each repeat marking exactly n_cal of a group's
    units as calibration (as the mask does), scores with ties or specials where asked, and some
    units without a target score; k from a few alphas, some above n."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 60, n_groups)
    sizes[rng.integers(0, n_groups)] = 0  # an empty group among the others
    group = np.repeat(np.arange(n_groups), sizes)
    rng.shuffle(group)
    n = len(group)
    score = np.round(rng.random(n) * 4) / 4 if ties else rng.random(n)
    if ties:  # and the special values, NaN and the infinities among them
        special = rng.random(n) < 0.1
        score[special] = rng.choice(SPECIAL, int(special.sum()))
    scored = rng.random(n) >= unscored
    words = np.zeros(((repeats + 63) // 64, n), dtype=np.uint64)
    n_cal = np.zeros(n_groups, dtype=np.int64)
    for g in range(n_groups):
        members = np.flatnonzero(group == g)
        n_cal[g] = round(share * len(members))
        for r in range(repeats):
            cal = rng.choice(members, n_cal[g], replace=False)
            words[r // 64, cal] |= np.uint64(1 << (r % 64))
    alphas = rng.choice([0.01, 0.1, 0.3, 0.9], n_groups)
    k_order = np.ceil((n_cal + 1) * (1 - alphas)).astype(np.int64)
    return group, scored, score, words, n_cal, k_order


@pytest.mark.parametrize(
    ("seed", "n_groups", "repeats", "share", "ties", "unscored"),
    [
        (1, 5, 7, 0.3, False, 0.0),
        (2, 4, 70, 0.5, True, 0.1),
        (3, 6, 20, 0.1, True, 0.5),
        (4, 3, 130, 0.9, False, 0.2),
    ],
    ids=["default-like", "two-words-ties", "small-share-unscored", "three-words"],
)
@pytest.mark.parametrize("band", [None, (0.0, 0), (50.0, 1000)], ids=["as-set", "none", "everything"])
def test_thresholds_equal_a_plain_sort(
    seed, n_groups, repeats, share, ties, unscored, band, monkeypatch
) -> None:
    """The band as set, without its margin (the expected size only: some repeats fall short and
    select from the whole group), and holding every unit: the same thresholds, NULL (not defined)
    exactly where k > n."""
    if band is not None:
        monkeypatch.setattr(split_thresholds, "BAND_SD", band[0])
        monkeypatch.setattr(split_thresholds, "BAND_PAD", band[1])
    real, fell_back = split_thresholds._select_all, []

    def spy(*a):
        fell_back.append(a[-2])
        return real(*a)

    monkeypatch.setattr(split_thresholds, "_select_all", spy)
    args = random_case(seed, n_groups, repeats, share, ties, unscored)
    q, defined = split_thresholds.thresholds(*args, repeats)
    if band == (50.0, 1000):  # every unit in the band: no repeat falls short
        assert not fell_back
    want_q, want_defined = brute_force(*args, repeats)
    np.testing.assert_array_equal(defined, want_defined)
    assert defined.any() and not defined.all()
    np.testing.assert_array_equal(q[defined], want_q[defined])  # NaN equals NaN here


def test_a_repeat_whose_band_falls_short_selects_from_the_whole_group(monkeypatch) -> None:
    """One group of 100 units scored 0 .. 99; in repeat 0 the 30 calibration units are the 30 lowest
    scores, so the band of the largest scores holds none of them and that repeat selects from all;
    in repeat 1 they are the 30 highest (the band holds them). Both give the plain sort's pick."""
    real, fell_back = split_thresholds._select_all, []

    def spy(*a):
        fell_back.append(a[-2])
        return real(*a)

    monkeypatch.setattr(split_thresholds, "_select_all", spy)
    n = 100
    score = np.arange(n, dtype=float)
    words = np.zeros((1, n), dtype=np.uint64)
    words[0, :30] |= np.uint64(1)  # repeat 0: the lowest scores calibrate
    words[0, 70:] |= np.uint64(2)  # repeat 1: the highest
    args = (np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool), score, words, np.array([30]), np.array([28]))
    q, defined = split_thresholds.thresholds(*args, 2)
    assert fell_back == [0] and defined.all()
    want_q, _ = brute_force(*args, 2)
    np.testing.assert_array_equal(q, want_q)
    assert q.tolist() == [[27.0, 97.0]]  # the 3rd largest of 0..29 and of 70..99


def test_no_units_give_no_thresholds() -> None:
    none = np.array([], dtype=np.int64)
    q, defined = split_thresholds.thresholds(
        none,
        none.astype(bool),
        none.astype(float),
        np.zeros((1, 0), np.uint64),
        np.array([0]),
        np.array([1]),
        5,
    )
    assert q.shape == (1, 5) and not defined.any()


# ----------------------------------------------------------------------------------------------------
# over a store's facts: the thresholds table and the metrics, numpy vs SQL


@pytest.fixture(scope="module")
def facts_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Facts of a store where a second run of one (model, config) repeats the first run's items with
    other option scores (tied split hashes, repeated scores across runs), and a third has NaN option
    scores on about a quarter of its items, so that some target scores are NaN, which DuckDB sorts
    above every number."""
    return with_run_copies(
        tmp_path_factory.mktemp("split_thresholds") / "s.duckdb", 13, 80, ROUNDED_AND_NAN_RUNS
    )


CASES = [
    (["model", "config"], {"repeats": 7, "seed": 3}),
    (["model"], {"repeats": 100, "seed": 0, "cal_fraction": 0.5, "alpha": 0.2}),
    (["config"], {"repeats": 20, "seed": 5, "stratify": ("target_role", "specialty"), "alpha": 0.01}),
    ([], {"repeats": 3, "seed": 1, "sample_index": 1}),
]


def _tables(path: Path, by: list[str], params: dict) -> dict[str, tuple]:
    """Per score, the thresholds table of each path (numpy and SQL) with its schema, and the checks
    made in SQL (``<score>_checks``: rows differing, [NULL, NaN] thresholds of each table)."""
    out = {}
    with option_mask(path, by, params) as (con, values, mask):
        for score in ("lac", "aps"):
            conformal._numpy_threshold_table(con, "_t_np", mask, score, values)
            con.execute(f"CREATE TEMP TABLE _t_sql AS {conformal._threshold_query(con, mask, score, values)}")
            for t in ("_t_np", "_t_sql"):
                out[f"{score}{t}"] = (
                    con.execute(f"SELECT * FROM {t} ORDER BY gid, rep").df(),
                    con.execute(f"DESCRIBE {t}").fetchall(),
                )
            # in SQL, where NULL and NaN are told apart (a frame shows both as NaN): rows that differ
            # in any column, and per table the NULL and the NaN thresholds
            out[f"{score}_checks"] = con.execute(
                """SELECT (SELECT count(*) FROM _t_np a FULL JOIN _t_sql b USING (gid, rep)
                           WHERE a.rep IS NULL OR b.rep IS NULL OR a.n_cal IS DISTINCT FROM b.n_cal
                              OR a.k_order IS DISTINCT FROM b.k_order OR a.q_hat IS DISTINCT FROM b.q_hat),
                          (SELECT [count(*) FILTER (q_hat IS NULL), count(*) FILTER (isnan(q_hat))]
                           FROM _t_np),
                          (SELECT [count(*) FILTER (q_hat IS NULL), count(*) FILTER (isnan(q_hat))]
                           FROM _t_sql)"""
            ).fetchone()
            con.execute("DROP TABLE _t_np; DROP TABLE _t_sql")
    return out


@pytest.mark.parametrize(("by", "params"), CASES, ids=["default", "one-hundred", "strata", "ungrouped"])
def test_numpy_thresholds_table_equals_the_sql_one(facts_store, by, params) -> None:
    metric_names()
    got = _tables(facts_store, by, params)
    for score in ("lac", "aps"):
        (np_rows, np_schema), (sql_rows, sql_schema) = got[f"{score}_t_np"], got[f"{score}_t_sql"]
        assert np_schema == sql_schema
        assert len(np_rows) == len(sql_rows) > 0
        differing, np_special, sql_special = got[f"{score}_checks"]
        assert differing == 0 and np_special == sql_special
        pd.testing.assert_frame_equal(np_rows, sql_rows, check_exact=True)


def test_numpy_thresholds_in_runs_of_groups_are_the_same(facts_store, monkeypatch) -> None:
    """Groups handed over a run at a time (runs of at most the largest group's units, as on a store
    larger than ``NUMPY_MASK_CHUNK_UNITS``): the same table as in one piece."""
    metric_names()
    by, params = CASES[0]
    whole = _tables(facts_store, by, params)
    with option_mask(facts_store, by, params) as (con, _, mask):
        sizes = con.execute(
            f"SELECT count(*) FROM {mask} WHERE m0 IS NOT NULL GROUP BY gid ORDER BY gid"
        ).fetchall()
    largest = max(n for (n,) in sizes)
    monkeypatch.setattr(conformal, "NUMPY_MASK_CHUNK_UNITS", largest)
    assert len(conformal._mask_chunks(np.array([n for (n,) in sizes]))) >= 2  # a group alone, then three
    parts = _tables(facts_store, by, params)
    for score in ("lac", "aps"):
        pd.testing.assert_frame_equal(parts[f"{score}_t_np"][0], whole[f"{score}_t_np"][0], check_exact=True)
        assert parts[f"{score}_checks"][0] == 0


@pytest.mark.parametrize(("by", "params"), CASES[:3], ids=["default", "one-hundred", "strata"])
def test_metrics_are_the_same_with_either_thresholds(facts_store, by, params, monkeypatch) -> None:
    """conformal_lac, conformal_aps and conformal_coverage_by read the thresholds table: the same
    frames whichever path made it."""
    metric_names()
    frames = {}
    for numpy_thresholds in (True, False):
        monkeypatch.setattr(conformal, "NUMPY_THRESHOLDS", numpy_thresholds)
        con = duckdb.connect(str(facts_store), read_only=True)
        try:
            prepare(con, materialize=True)
            names = ("conformal_coverage_by", "conformal_lac", "conformal_aps")
            frames[numpy_thresholds] = [compute(con, name, by, params) for name in names]
            thr = [t for t in conformal.temp_tables(con) if t.startswith("_conf_thr_")]
            assert len(thr) == 2  # LAC (shared by coverage_by and LAC) and APS
        finally:
            con.close()
    for got, want in zip(frames[True], frames[False], strict=True):
        assert len(got) > 0
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_nan_and_null_thresholds_are_reached(facts_store) -> None:
    """The store cases above hold both kinds of special threshold, so the equality checks them:
    NaN (LAC by model and config: the pick falls among the NaN target scores) and NULL (alpha
    0.01 by config: k > n)."""
    metric_names()
    assert _tables(facts_store, *CASES[0])["lac_checks"][1][1] > 0  # NaN thresholds
    assert _tables(facts_store, *CASES[2])["lac_checks"][1][0] > 0  # NULL thresholds


def test_a_group_larger_than_a_run_is_left_to_the_sql(facts_store, monkeypatch) -> None:
    """A group with more units than ``NUMPY_MASK_CHUNK_UNITS``: numpy creates nothing and says so,
    and ``_threshold_table`` makes the SQL's table."""
    metric_names()
    monkeypatch.setattr(conformal, "NUMPY_MASK_CHUNK_UNITS", 5)
    with option_mask(facts_store, ["model"], {"repeats": 7}) as (con, values, mask):
        assert not conformal._numpy_threshold_table(con, "_t_np", mask, "lac", values)
        assert "_t_np" not in conformal.temp_tables(con)
        table = conformal._threshold_table(con, mask, "lac", values)
        got = con.execute(f"SELECT * FROM {table} ORDER BY gid, rep").df()
        want = con.execute(f"{conformal._threshold_query(con, mask, 'lac', values)} ORDER BY gid, rep").df()
    assert len(got) > 0
    pd.testing.assert_frame_equal(got, want, check_exact=True)
