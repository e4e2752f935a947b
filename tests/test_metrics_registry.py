"""Every registered metric, on one store that has data for all of them, grouped by every stratum.

Metric SQL splices the grouping columns into its query, so an internal column that shares a name
with a stratum (``k``, ``condition``, ...) silently changes meaning when a user groups by it; DuckDB
renames the clash to ``k_1`` instead of failing. This test runs each metric under every grouping and
checks the shape of what comes back, and that the materialized base tables (what ``equipoise
metrics`` and ``report`` use) give the same numbers as the views.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.evaluators.metrics.registry import REGISTRY, STRATA, compute, metric_names, prepare
from equipoise.evaluators.reference_run import run_reference_policies
from equipoise.evaluators.store import connect
from tests.scores import edit_option_scores

# parameters that keep resampling metrics fast; each is given only to metrics that declare it
FAST = {"repeats": 2, "n_boot": 40}
POLICIES = ["calibrated", "chance", "always_abstain"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("reg")
    path = root / "s.duckdb"
    con = connect(path)
    clindet = root / "clindet"
    build_clindet(clindet, per_system=2, seed=3, progress=False)
    run_reference_policies(con, clindet, progress=False, policies=POLICIES)
    for suite, kwargs in (("clear", {"max_k": 1}), ("nota", {})):
        folder = root / suite
        build_mcq_suite(suite, folder, seed=3, **kwargs)
        run_reference_policies(con, folder, progress=False, policies=POLICIES)
    con.close()
    return path


def _params(name: str) -> dict:
    return {k: v for k, v in FAST.items() if k in REGISTRY[name].params}


@pytest.mark.parametrize("name", metric_names())
def test_every_grouping_keeps_its_shape(store, name):
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        base = compute(con, name, None, _params(name))
        assert isinstance(base, pd.DataFrame) and len(base.columns) == len(set(base.columns))
        for by in ([], *[[s] for s in STRATA]):
            try:
                df = compute(con, name, by, _params(name))
            except ValueError as exc:  # a metric may refuse a grouping it cannot honour, by name
                assert by and by[0] in str(exc), (name, by, exc)
                continue
            cols = list(df.columns)
            assert len(cols) == len(set(cols)), (name, by, cols)
            assert not [c for c in cols if c.endswith("_1")], (name, by, cols)  # DuckDB's clash rename
            # the tradeoff correlates accuracies across the groups `by` defines, reported in points_by
            keys = ["points_by"] if name == "determinability_tradeoff" else by
            for col in keys:
                assert col in cols, (name, by, cols)
    finally:
        con.close()


@pytest.mark.parametrize("name", metric_names())
def test_materialized_base_tables_give_the_same_numbers(store, name):
    views = duckdb.connect(str(store), read_only=True)
    tables = duckdb.connect(str(store), read_only=True)
    try:
        a = compute(views, name, None, _params(name))
        prepare(tables, materialize=True)
        b = compute(tables, name, None, _params(name))
    finally:
        views.close()
        tables.close()
    pd.testing.assert_frame_equal(
        a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False, rtol=1e-12
    )


UNC = (
    "unc_scores",
    "unc_normalized",
    "unc_normalization_bounds",
    "unc_auroc",
    "unc_summary",
    "unc_combiners",
)


@pytest.mark.parametrize("name", UNC)
@pytest.mark.parametrize("by", [[], ["run_id"], ["variant", "k"], ["model", "condition"]])
@pytest.mark.parametrize("pool", ["item", "base"])
def test_cached_uncertainty_scores_match_the_inline_query(store, name, by, pool):
    """On materialized connections the per-item scores are computed once into a TEMP table and every
    uncertainty metric reads its strata from it; each grouping and pool must give the inline numbers."""
    views = duckdb.connect(str(store), read_only=True)
    tables = duckdb.connect(str(store), read_only=True)
    try:
        params = {**_params(name), "pool": pool}
        a = compute(views, name, by, params)
        prepare(tables, materialize=True)
        compute(tables, "unc_scores", ["model"], {"pool": pool})  # fills the cache with another grouping
        b = compute(tables, name, by, params)
        n_cache = tables.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name LIKE '_unc_scores_cache_%'"
        ).fetchone()[0]
        n_view_cache = views.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name LIKE '_unc_scores_cache_%'"
        ).fetchone()[0]
    finally:
        views.close()
        tables.close()
    assert n_cache == 1 and n_view_cache == 0
    pd.testing.assert_frame_equal(
        a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False, rtol=1e-12
    )


def _probs(path, threads: int, materialize: bool) -> pd.DataFrame:
    c = duckdb.connect(str(path), read_only=True, config={"threads": threads})
    try:
        prepare(c, materialize=materialize)
        return c.execute(
            "SELECT run_id, item_id, sample_index, label, prob FROM option_probs ORDER BY ALL"
        ).df()
    finally:
        c.close()


def test_option_probabilities_do_not_depend_on_row_order_or_threads(tmp_path):
    """The softmax normaliser is summed over a value-sorted list, so each probability is the same
    double whatever order the scores were stored in and however many threads aggregate them (a
    plain or parallel sum follows the storage order and varies in its last bit, which moves
    conformal sets at exact ties)."""
    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    path = tmp_path / "p.duckdb"
    make_store(path, SyntheticSpec(n_items=300, samples=3, n_options=5, seed=11))
    ref = _probs(path, 1, False)
    assert len(ref) > 1000 and ref["prob"].between(0, 1).all()
    sums = ref.groupby(["run_id", "item_id", "sample_index"])["prob"].sum()
    assert np.allclose(sums, 1.0, atol=1e-12)
    con = duckdb.connect(str(path))  # same rows, stored in the reverse order
    # (schema v3: each sample's labels are sorted on its row, so the reversed order is that of
    # the prediction rows, and the lists are rebuilt from the reversed copy)
    con.execute("CREATE TEMP TABLE os_rev AS SELECT * FROM option_scores ORDER BY ALL DESC")
    con.execute(
        "CREATE TEMP TABLE p_rev AS "
        "SELECT * EXCLUDE (score_labels, score_logprobs) FROM predictions ORDER BY ALL DESC"
    )
    con.execute("DELETE FROM predictions")
    con.execute("INSERT INTO predictions BY NAME SELECT * FROM p_rev")
    edit_option_scores(con, "DELETE FROM option_scores", "INSERT INTO option_scores SELECT * FROM os_rev")
    con.close()
    for threads, materialize in ((1, False), (2, True), (4, True)):
        pd.testing.assert_frame_equal(ref, _probs(path, threads, materialize), check_exact=True)


@pytest.mark.parametrize("name", metric_names())
def test_written_result_equals_the_computed_frame(store, tmp_path, name):
    """write_result streams one-query metrics from DuckDB to Parquet (no pandas frame) and has
    DuckDB write the others' numpy columns (metrics.columns); either way the file holds exactly the
    frame compute returns."""
    from equipoise.evaluators.metrics.registry import result_sql, write_result

    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        want = compute(con, name, None, _params(name))
        path = tmp_path / f"{name}.parquet"
        n = write_result(con, name, path, None, _params(name))
        streamed = result_sql(con, name, None, _params(name)) is not None
    finally:
        con.close()
    got = pd.read_parquet(path)
    assert n == len(want) == len(got) and list(got.columns) == list(want.columns)
    for col in want.columns:  # NULL may come back as NaN, None or pd.NA depending on the dtype
        a, b = got[col].reset_index(drop=True), want[col].reset_index(drop=True)
        assert (a.isna() == b.isna()).all(), (name, col)
        a, b = a[b.notna()], b[b.notna()]
        if pd.api.types.is_numeric_dtype(b) and not pd.api.types.is_bool_dtype(b):
            assert np.allclose(a.astype(float), b.astype(float), rtol=1e-12, atol=0), (name, col)
        else:
            assert [str(v) for v in a] == [str(v) for v in b], (name, col)
    if name in ("unc_scores", "unc_normalized", "risk_coverage", "answer_rates"):
        assert streamed, f"{name}: a per-item table should stream, not pass through pandas"


@pytest.mark.parametrize("name", ["unc_scores", "unc_normalized", "risk_coverage"])
def test_per_item_dictionary_limit_changes_no_value_read_back(store, tmp_path, monkeypatch, name):
    """Long results (per item, per distinct confidence) are written with a small Parquet dictionary limit
    (``PER_ITEM_DICTIONARY_LIMIT``), which may change how a column is encoded but never what reads
    back. Written with it, with DuckDB's default (None) and with a limit of 1 (only a column of one
    value may keep a dictionary: fewer dictionaries show that the limit reaches the writer), the
    three files read back as equal Arrow tables, types and nullability included."""
    import dataclasses

    import pyarrow.parquet as pq

    from equipoise.evaluators.metrics.registry import PER_ITEM_DICTIONARY_LIMIT, write_result

    assert REGISTRY[name].parquet_dictionary_limit == PER_ITEM_DICTIONARY_LIMIT
    tables, dictionaries = {}, {}
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        for limit in (PER_ITEM_DICTIONARY_LIMIT, None, 1):
            metric = dataclasses.replace(REGISTRY[name], parquet_dictionary_limit=limit)
            monkeypatch.setitem(REGISTRY, name, metric)
            path = tmp_path / f"{name}_{limit}.parquet"
            assert write_result(con, name, path) > 20
            meta = pq.ParquetFile(path).metadata
            dictionaries[limit] = sum(
                meta.row_group(g).column(c).has_dictionary_page
                for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)
            )
            tables[limit] = pq.read_table(path)
    finally:
        con.close()
    assert dictionaries[None] > dictionaries[1]
    for limit in (None, 1):
        assert tables[limit].equals(tables[PER_ITEM_DICTIONARY_LIMIT]), limit


def test_prepare_records_what_it_made_so_the_checks_need_not_list_the_catalog(store, tmp_path, monkeypatch):
    """``_materialized`` and ``uses_facts`` read the variable ``prepare`` / ``read_facts`` set
    (registry.BASE_RELATIONS_VAR) and list the catalog only where it is unset: after each kind of
    prepare they answer as the TEMP tables say, without listing them; unprepared, and with the base
    relations made TEMP tables by hand, they still list them."""
    from equipoise.evaluators.metrics import facts, registry

    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    con = connect(path)
    assert facts.refresh(con)
    con.close()
    listed = []
    real = registry.temp_tables

    def counting(c: duckdb.DuckDBPyConnection) -> set[str]:
        listed.append(1)
        return real(c)

    monkeypatch.setattr(registry, "temp_tables", counting)
    for target, materialize, want in ((store, True, "tables"), (path, True, "facts"), (store, False, None)):
        con = duckdb.connect(str(target), read_only=True)
        try:
            prepare(con, materialize=materialize)
            temps = real(con)
            del listed[:]
            assert registry._prepared_as(con) == want
            assert registry._materialized(con) == (want is not None)
            assert registry.uses_facts(con) == (registry.FACTS_MARK in temps) == (want == "facts")
            assert bool(listed) == (want is None)  # listed only where the variable is unset
        finally:
            con.close()
    con = duckdb.connect(str(store), read_only=True)
    try:
        for r in registry.BASE_RELATIONS:
            con.execute(f"CREATE TEMP TABLE {r} AS SELECT 1 AS x")
        assert registry._prepared_as(con) is None and registry._materialized(con)
        assert not registry.uses_facts(con)
    finally:
        con.close()
