"""The write-time sample pools of conformal_sampling (pool 'item'; since FACTS_FORMAT 7 columns of
``facts_scored`` on each pool's first sample row, ``registry.POOL_FACT_COLUMNS``): the units
a connection with fixed base relations reads from them equal, cell by cell, the units computed from
every sample by the views path (``conf_sampling_units.sql``, itself checked against the numpy
reference in test_metrics_conformal.py), and the metrics are identical from facts, from TEMP tables
and from views, on a store with every edge: pools without any vote, exact ties, parsed labels that
are no option, pools of different sizes, a pool whose first sample is not sample 0, options no
sample chose and a self-evaluation run (never a pool)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import compute, conformal, facts
from equipoise.evaluators.metrics.registry import REGISTRY, prepare, uses_facts
from equipoise.evaluators.store import connect
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.conftest import with_facts

NUM = "CAST(split_part(split_part(item_id, ':', 1), '-', 2) AS INTEGER)"
UNIT_COLS = "gid, sid, run_id, ukey, cov, m, m_option, hit, target_option_id, mv_correct, ss, st"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pools") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=90, models=("m1", "m2"), samples=6, unparsed_rate=0.15, seed=5))
    con = duckdb.connect(str(path))
    con.execute(
        f"""
        -- no vote at all: every sample unparsed
        UPDATE predictions SET parsed_label = NULL, outcome = 'unparsed' WHERE {NUM} % 13 = 0;
        -- exact ties: 3 samples on C, 3 on B (the vote goes to the smaller option_id)
        UPDATE predictions SET parsed_label = CASE WHEN sample_index < 3 THEN 'C' ELSE 'B' END,
               outcome = 'answered' WHERE {NUM} % 11 = 1;
        -- a parsed label that is no option of the item: counted in M, chooses nothing
        UPDATE predictions SET parsed_label = 'Z' WHERE {NUM} % 7 = 2 AND sample_index = 1;
        -- pools of other sizes, one without sample 0 (its strata come from its first sample)
        DELETE FROM predictions WHERE {NUM} % 5 = 3 AND sample_index >= 4;
        DELETE FROM predictions WHERE {NUM} % 9 = 4 AND sample_index = 0;
        """
    )
    # a self-evaluation run: verdicts, not answers, never a pool on either path
    run = con.execute("SELECT min(run_id) FROM runs").fetchone()[0]
    con.execute(
        f"""INSERT INTO runs SELECT * REPLACE ('{run}-se' AS run_id, 'self_eval:base' AS prompt_style)
            FROM runs WHERE run_id = '{run}';
            INSERT INTO predictions SELECT * REPLACE ('{run}-se' AS run_id, NULL AS score_labels,
                                                      NULL AS score_logprobs) FROM predictions
            WHERE run_id = '{run}';"""
    )
    con.close()
    return path


@pytest.fixture(scope="module")
def fact_store(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_facts(store, tmp_path_factory.mktemp("pools_facts") / "f.duckdb")


def _frame(con: duckdb.DuckDBPyConnection, sql: str) -> pd.DataFrame:
    df = con.execute(sql).df()
    df["ss"] = df["ss"].map(lambda v: None if v is None else tuple(np.asarray(v).tolist()))
    return df


def _units(con: duckdb.DuckDBPyConnection, by, strat, cov, fixed: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The units and the pool counts of one query, as the metric composes them."""
    params = {**conformal.COMMON_PARAMS, "pool": "item", "stratify": strat}
    values = conformal._common(by, params)
    units = conformal._units_sql("sampling", values, params, cov, fixed)
    got = _frame(con, f"WITH {units} SELECT {UNIT_COLS} FROM units ORDER BY run_id, ukey")
    counts = con.execute(
        f"WITH {units} SELECT gid, count(*) AS n, count_if(n_targets <> 1) AS bad FROM pools "
        "GROUP BY gid ORDER BY gid"
    ).df()
    return got, counts


@pytest.mark.parametrize(
    ("by", "strat", "cov"),
    [
        (("model", "config"), ("target_role",), None),
        (("specialty",), (), "question_type"),
        ((), ("has_gold", "difficulty"), "target_label"),
        (("run_id",), ("task",), "specialty"),
    ],
)
def test_pooled_units_equal_the_view_units_cell_by_cell(
    store: Path, fact_store: Path, by, strat, cov
) -> None:
    con = duckdb.connect(str(store), read_only=True)
    prepare(con)  # views: the units grouped from every sample
    want, want_counts = _units(con, by, strat, cov, fixed=False)
    con.close()
    con = duckdb.connect(str(fact_store), read_only=True)
    prepare(con, materialize=True)
    assert uses_facts(con)
    conformal._prepare_pools(con, "sampling", {"pool": "item"})
    got, got_counts = _units(con, by, strat, cov, fixed=True)
    con.close()
    # the edges are there
    assert (want.m_option == 0).any() and (want.m != want.m.max()).any()
    assert (~want.mv_correct & want.hit).any() and want.ss.map(lambda s: 1.0 in s).any()
    assert not want.run_id.str.endswith("-se").any()
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    pd.testing.assert_frame_equal(got_counts, want_counts, check_exact=True)


def test_fact_rows_are_one_per_run_and_item_of_scored(store: Path, fact_store: Path) -> None:
    con = duckdb.connect(str(fact_store), read_only=True)
    try:
        n_pools = con.execute(
            "SELECT count(*) FROM (SELECT DISTINCT run_id, item_id FROM main.facts_scored)"
        ).fetchone()
        rows = con.execute(
            "SELECT count(*), count(DISTINCT (run_id, item_id)), sum(pool_m) FROM main.facts_scored "
            "WHERE pool_m IS NOT NULL"
        ).fetchone()
        n_samples = con.execute("SELECT count(*) FROM main.facts_scored").fetchone()
        # each pool sits on its first sample's row (the strata it reports are that row's)
        not_first = con.execute(
            """SELECT count(*) FROM main.facts_scored f
               JOIN (SELECT run_id, item_id, min(sample_index) AS s FROM main.facts_scored GROUP BY ALL) p
               USING (run_id, item_id)
               WHERE (f.pool_m IS NOT NULL) <> (f.sample_index = p.s)"""
        ).fetchone()
    finally:
        con.close()
    assert rows is not None and n_pools is not None and n_samples is not None and not_first is not None
    assert rows[0] == rows[1] == n_pools[0] and rows[2] == n_samples[0] and not_first[0] == 0


def _metrics(path: Path, mode: str) -> list[pd.DataFrame]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        if mode != "views":
            prepare(con, materialize=True)
        assert uses_facts(con) == (mode == "facts")
        out = []
        for name, by, params in (
            ("conformal_sampling", ["model", "config"], {"repeats": 7, "seed": 4}),
            ("conformal_sampling", ["specialty"], {"repeats": 5, "stratify": ()}),
            ("conformal_sampling", ["model"], {"repeats": 5, "stratify": ("difficulty", "has_gold")}),
            ("conformal_sampling", ["model", "config"], {"repeats": 5, "pool": "base"}),
            ("conformal_coverage_by", ["model", "config"], {"repeats": 6, "score": "sampling"}),
            (
                "conformal_coverage_by",
                ["model"],
                {"repeats": 6, "score": "sampling", "coverage_by": "target_label", "alpha": 0.2},
            ),
        ):
            out.append(compute(con, name, by, params))
        return out
    finally:
        con.close()


def test_sampling_metrics_are_identical_from_facts_temp_tables_and_views(
    store: Path, fact_store: Path
) -> None:
    views = _metrics(store, "views")
    temp = _metrics(store, "temp")
    from_facts = _metrics(fact_store, "facts")
    assert views[0].n_units.sum() > 0 and (views[0].mv_accuracy < views[0].hit_rate).all()
    for v, t, f in zip(views, temp, from_facts, strict=True):
        pd.testing.assert_frame_equal(t, v, check_exact=True)
        pd.testing.assert_frame_equal(f, v, check_exact=True)


def test_a_store_with_format_6_pool_facts_is_not_read_and_refreshes(fact_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    path.write_bytes(fact_store.read_bytes())
    con = connect(path)
    assert facts.current(con) is not None
    # facts of FACTS_FORMAT 6: the pools in their own table, facts_scored without them, other
    # definitions (so other fingerprints)
    con.execute(
        f"""CREATE TABLE main.facts_sampling_pools AS
                SELECT * FROM main.facts_scored WHERE pool_m IS NOT NULL;
            ALTER TABLE main.facts_scored DROP COLUMN pool_ss;
            UPDATE main.store_meta SET value = 'format 6'
                WHERE key IN ('{facts.META_KEY}', '{facts.SHARED_KEY}')"""
    )
    assert facts.current(con) is None
    con.close()
    con = duckdb.connect(str(path), read_only=True)
    prepare(con, materialize=True)
    assert not uses_facts(con)  # computed for the connection, not read from incomplete facts
    con.close()
    con = connect(path)
    assert facts.refresh(con) is True and facts.current(con) is not None
    assert "facts_sampling_pools" not in facts._main_tables(con)  # dropped: the store does not grow
    con.close()
    assert [len(f) for f in _metrics(path, "facts")] == [len(f) for f in _metrics(fact_store, "facts")]


def test_the_pool_definition_is_part_of_the_fact_fingerprint(
    fact_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    con = duckdb.connect(str(fact_store), read_only=True)
    try:
        before = facts.fingerprint(con)
        assert facts.current(con) == before
        text = conformal.sampling_pools_sql()
        monkeypatch.setattr(conformal, "sampling_pools_sql", lambda: text + " ")
        assert facts.fingerprint(con) != before and facts.current(con) is None
    finally:
        con.close()


def test_every_pool_stratum_is_a_run_or_item_column(store: Path) -> None:
    """The pools take their group / stratum / coverage columns from one sample: right only because
    each is a column of `runs` or `items`, constant over a run x item. A per-sample column added to
    CONF_STRATA must fail here (the pooled units would then need today's per-sample grouping)."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con)
        cols = {r[0] for t in ("runs", "items") for r in con.execute(f"DESCRIBE main.{t}").fetchall()}
        assert set(conformal.CONF_STRATA) <= cols
        listed = ", ".join(conformal.CONF_STRATA)
        n = con.execute(
            f"SELECT (SELECT count(*) FROM (SELECT DISTINCT run_id, item_id, {listed} FROM scored)), "
            "(SELECT count(*) FROM (SELECT DISTINCT run_id, item_id FROM scored))"
        ).fetchone()
    finally:
        con.close()
    assert n is not None and n[0] == n[1] > 0


@pytest.fixture(scope="module")
def clean_fact_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose pools are exactly the option units of sample 0 (every prediction scored, one
    target per pool), with current facts."""
    path = tmp_path_factory.mktemp("pools_clean") / "c.duckdb"
    make_store(path, SyntheticSpec(n_items=60, models=("m1", "m2"), samples=3, seed=2))
    con = connect(path)
    assert facts.refresh(con)
    con.close()
    return path


_SHARED_CASES = (
    ("conformal_sampling", ["model", "config"], {"repeats": 7, "seed": 4}),
    ("conformal_sampling", ["model"], {"repeats": 70, "stratify": ("difficulty", "has_gold")}),
    ("conformal_coverage_by", ["model", "config"], {"repeats": 6, "score": "sampling", "seed": 3}),
)


def _shared_mask_runs(path: Path) -> list[tuple[bool, pd.DataFrame, pd.DataFrame]]:
    """Per case: whether the pools' query reading the option units' mask table found them equal to
    its units (``_MASK_OK``), the metric on a connection holding that table (computed by
    conformal_lac with the same parameters first), and on a fresh connection (inline mask)."""
    out = []
    for name, by, params in _SHARED_CASES:
        con = duckdb.connect(str(path), read_only=True)
        fresh = duckdb.connect(str(path), read_only=True)
        try:
            prepare(con, materialize=True)
            lac = {k: v for k, v in params.items() if k != "score"}
            compute(con, "conformal_lac", by, lac)
            full = {**REGISTRY[name].params, **params}
            if name == "conformal_sampling":
                cov, summary, extra = None, "conf_sampling_summary.sql", {}
            else:
                cov = conformal._coverage_by_args(by, full)[1]
                summary, extra = "conf_coverage_by.sql", {"cov_name": cov}
            conformal._prepare_pools(con, "sampling", full)
            sql = conformal._query("sampling", by, full, con, cov, summary, True, **extra)
            checked = con.execute(sql).df()
            assert conformal._MASK_OK in checked.columns  # the shared path was taken
            ok = bool(checked[conformal._MASK_OK].all())
            prepare(fresh, materialize=True)
            out.append((ok, compute(con, name, by, params), compute(fresh, name, by, params)))
        finally:
            con.close()
            fresh.close()
    return out


def test_pools_equal_to_the_option_units_read_the_shared_mask(clean_fact_store: Path) -> None:
    """Where the pools are the option units, conformal_sampling / coverage_by read the mask table
    that conformal_lac computed (the check holds) and give exactly the inline mask's numbers."""
    for ok, shared, inline in _shared_mask_runs(clean_fact_store):
        assert ok
        assert conformal._MASK_OK not in shared.columns and len(shared) > 0
        pd.testing.assert_frame_equal(shared, inline, check_exact=True)


def test_pools_unlike_the_option_units_fall_back_to_their_own_mask(fact_store: Path) -> None:
    """Where they differ (pools without sample 0, a self-evaluation run with no pool), the check
    fails and the metric is the inline mask's, exactly."""
    for ok, shared, inline in _shared_mask_runs(fact_store):
        assert not ok
        pd.testing.assert_frame_equal(shared, inline, check_exact=True)


def test_pools_over_the_facts_are_keyed_by_the_item_code(fact_store: Path) -> None:
    """Over the store's facts the pools carry the integer item code (they are facts_scored rows,
    FACTS_FORMAT 7), and their inline mask (here: the fallback, these pools are not the
    option units) reads the split keys of the codes that conformal_lac's mask computed: no second
    table of md5s keyed by the item_id string. The numbers are the views' (test above)."""
    con = duckdb.connect(str(fact_store), read_only=True)
    try:
        prepare(con, materialize=True)
        assert uses_facts(con)
        params = {"repeats": 7, "seed": 4}
        compute(con, "conformal_lac", ["model", "config"], params)
        compute(con, "conformal_sampling", ["model", "config"], params)
        tables = set(conformal.temp_tables(con))
    finally:
        con.close()
    assert conformal._split_keys_table({"seed": 4, "repeats": 7}, conformal.ITEM_CODE) in tables
    assert conformal._split_keys_table({"seed": 4, "repeats": 7}, "item_id") not in tables
