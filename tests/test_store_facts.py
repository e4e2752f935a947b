"""Write-time fact tables: every metric read from them equals the metric computed from the source
tables, and a store changed after the facts were written never serves a stale fact."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import facts
from equipoise.evaluators.metrics.registry import (
    REGISTRY,
    _load_all,
    compute,
    metric_names,
    prepare,
    uses_facts,
)
from equipoise.evaluators.store import connect
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.conftest import one_thread_and_forced_parallel, with_facts

BYS: tuple[tuple[str, ...] | None, ...] = (None, ("suite", "variant"), ("specialty", "k"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("facts") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=80, models=("m1", "m2"), samples=3, unparsed_rate=0.1, seed=7))
    con = connect(path)
    # abstentions and reasoning text, so the abstain and text-feature columns are not all zero
    con.execute(
        """
        UPDATE predictions SET outcome = 'abstained'
        FROM runs r, options o
        WHERE predictions.run_id = r.run_id AND o.dataset_id = r.dataset_id AND o.config = r.config
          AND o.item_id = predictions.item_id AND o.label = predictions.parsed_label
          AND o.role = 'abstain' AND predictions.outcome = 'answered';
        UPDATE predictions SET raw_output = 'Wait, maybe? ' || raw_output || ' Confidence: '
            || (hash(item_id || sample_index::VARCHAR) % 101)::VARCHAR || '%'
        WHERE hash(run_id || item_id) % 3 = 0;
        """
    )
    con.close()
    return path


def _metrics(path: Path, by: tuple[str, ...] | None) -> tuple[dict[str, pd.DataFrame], bool]:
    """Every metric of a read-only pass over ``path`` (``_metrics_on``)."""
    con = connect(path, read_only=True)
    try:
        return _metrics_on(con, by)
    finally:
        con.close()


def _metrics_on(
    con: duckdb.DuckDBPyConnection, by: tuple[str, ...] | None
) -> tuple[dict[str, pd.DataFrame], bool]:
    """Every metric of a read-only pass on ``con`` (grouped by ``by``, default: each metric's own),
    and whether it read the facts."""
    prepare(con, materialize=True)
    used = uses_facts(con)
    out: dict[str, pd.DataFrame] = {}
    for name in metric_names():
        try:
            out[name] = compute(con, name, by=None if by is None else list(by))
        except ValueError as exc:  # a metric that refuses this grouping must refuse it on both paths
            out[name] = pd.DataFrame({"refused": [str(exc)]})
    return out, used


def _assert_same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


@pytest.mark.parametrize("by", BYS, ids=lambda b: "default" if b is None else "-".join(b))
def test_metrics_from_facts_equal_metrics_from_source_tables(store: Path, tmp_path: Path, by) -> None:
    plain = tmp_path / "plain.duckdb"
    plain.write_bytes(store.read_bytes())
    want, used = _metrics(plain, by)
    assert not used  # no facts written: computed from the source tables
    con = connect(plain)
    assert facts.refresh(con) is True
    assert facts.refresh(con) is False  # unchanged store: nothing to do
    con.close()
    got, used = _metrics(plain, by)
    assert used
    assert sum(len(df) for df in got.values()) > 100
    _assert_same(got, want)


@pytest.mark.parametrize("split_key", ["item_id", "base_id"])
def test_uncertainty_splits_read_from_the_facts_equal_the_split_hashed_per_metric(
    store: Path, tmp_path: Path, split_key: str
) -> None:
    """facts_unc_scores_<pool> hold each item's md5 split bits for both split keys and its rank in
    the run; the metrics that read them (held-out bounds, normalisation, combiner training split
    and row order) must give what hashing the key and sorting item_id per metric gives."""
    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    names = ("unc_normalization_bounds", "unc_normalized", "unc_combiners")

    def run() -> tuple[bool, dict[str, pd.DataFrame]]:
        _load_all()
        con = connect(path, read_only=True)
        try:
            prepare(con, materialize=True)
            params = {"split_key": split_key}
            return uses_facts(con), {n: compute(con, n, by=["model"], params=params) for n in names}
        finally:
            con.close()

    used, want = run()
    assert not used
    con = connect(path)
    facts.refresh(con)
    con.close()
    used, got = run()
    assert used
    assert all(len(got[n]) for n in names)
    _assert_same(got, want)


def test_a_write_after_refresh_is_never_served_stale(store: Path, tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    con = connect(path)
    facts.refresh(con)
    fp = facts.current(con)
    assert fp is not None
    con.close()
    before, used = _metrics(path, None)
    assert used
    con = connect(path)
    # a plain SQL update that keeps every row count: one correct answer becomes a wrong one
    con.execute(
        """
        UPDATE predictions SET parsed_label = CASE i.target_label WHEN 'A' THEN 'B' ELSE 'A' END
        FROM runs r, items i
        WHERE predictions.run_id = r.run_id AND i.dataset_id = r.dataset_id AND i.config = r.config
          AND i.item_id = predictions.item_id AND predictions.parsed_label = i.target_label
          AND predictions.rowid = (
              SELECT min(p.rowid) FROM predictions p JOIN runs r2 USING (run_id)
              JOIN items i2 ON i2.dataset_id = r2.dataset_id AND i2.config = r2.config
                           AND i2.item_id = p.item_id
              WHERE p.parsed_label = i2.target_label AND p.sample_index = 0)
        """
    )
    assert facts.current(con) is None and facts.fingerprint(con) != fp
    con.close()
    stale, used = _metrics(path, None)
    assert not used
    fresh = tmp_path / "fresh.duckdb"
    fresh.write_bytes(path.read_bytes())
    con = connect(fresh)
    facts.refresh(con)
    con.close()
    refreshed, used = _metrics(fresh, None)
    assert used
    _assert_same(stale, refreshed)
    # and the change is visible: the old facts would have given the old accuracy
    assert not before["answer_rates"].equals(stale["answer_rates"])


def _fact_frames(path: Path) -> dict[str, pd.DataFrame]:
    """Every fact table, rows in a canonical order (row order in a table carries no meaning)."""
    con = connect(path, read_only=True)
    try:
        out = {}
        for t in facts.FACT_TABLES:
            df = con.execute(f"SELECT * FROM main.{t}").df()
            # list columns (the conformal score lists of facts_scored) as tuples: sortable, and
            # compared element by element, exactly
            for c in df.columns:
                if df[c].map(lambda v: isinstance(v, (list, np.ndarray))).any():
                    df[c] = df[c].map(lambda v: tuple(v) if isinstance(v, (list, np.ndarray)) else v)
            out[t] = df.sort_values(list(df.columns)).reset_index(drop=True)
        return out
    finally:
        con.close()


def _change_some_runs(con) -> tuple[str, str, str]:
    """A new run (a copy of one under a new id), one changed prediction in another run and one
    run deleted: the three ways a write touches runs. Shared tables are left alone."""
    runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    src, changed, gone = runs[0], runs[1], runs[-1]
    new = src + "-copy"
    con.execute(
        f"""
        INSERT INTO runs SELECT * REPLACE ('{new}' AS run_id) FROM runs WHERE run_id = '{src}';
        INSERT INTO predictions SELECT * REPLACE ('{new}' AS run_id) FROM predictions WHERE run_id = '{src}';
        UPDATE predictions SET parsed_label = CASE parsed_label WHEN 'A' THEN 'B' ELSE 'A' END
        WHERE run_id = '{changed}' AND item_id = (
            SELECT min(item_id) FROM predictions WHERE run_id = '{changed}' AND sample_index = 0)
          AND sample_index = 0;
        DELETE FROM predictions WHERE run_id = '{gone}';
        DELETE FROM runs WHERE run_id = '{gone}';
        """
    )
    return new, changed, gone


def test_refresh_after_a_few_runs_change_recomputes_only_those_and_equals_a_full_refresh(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inc, full = tmp_path / "inc.duckdb", tmp_path / "full.duckdb"
    inc.write_bytes(store.read_bytes())
    con = connect(inc)
    facts.refresh(con)
    new, changed, gone = _change_some_runs(con)
    assert facts.current(con) is None  # stale until refreshed
    con.close()
    full.write_bytes(inc.read_bytes())

    # the incremental path is taken: a full recompute would fail the test
    def no_full(_con) -> None:
        raise AssertionError("a run-level change must not recompute every fact")

    con = connect(inc)
    with monkeypatch.context() as mp:
        mp.setattr(facts, "_refresh_all", no_full)
        assert facts.refresh(con) is True
    assert facts.current(con) is not None
    assert facts.refresh(con) is False
    con.close()

    con = connect(full)
    assert facts.refresh(con, force=True) is True
    con.close()

    got, want = _fact_frames(inc), _fact_frames(full)
    # the per-sample conformal score lists are among the compared facts (and not all empty)
    assert got["facts_scored"]["aps_scores"].dropna().map(len).sum() > 0
    for t in facts.FACT_TABLES:
        pd.testing.assert_frame_equal(got[t], want[t], obj=t, check_exact=True)
        runs_in = set(got[t]["run_id"])
        assert new in runs_in and changed in runs_in and gone not in runs_in
    a, used_a = _metrics(inc, None)
    b, used_b = _metrics(full, None)
    assert used_a and used_b
    _assert_same(a, b)


def test_a_change_to_the_shared_tables_recomputes_every_fact(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    con = connect(path)
    facts.refresh(con)
    con.execute("UPDATE items SET specialty = 'cardiology' WHERE item_id = (SELECT min(item_id) FROM items)")
    calls: list[str] = []
    real_all = facts._refresh_all

    def spy_all(c) -> None:
        calls.append("all")
        real_all(c)

    def no_runs(_c) -> None:
        raise AssertionError("a change to items must not take the per-run path")

    with monkeypatch.context() as mp:
        mp.setattr(facts, "_refresh_all", spy_all)
        mp.setattr(facts, "_refresh_runs", no_runs)
        assert facts.refresh(con) is True
    assert calls == ["all"] and facts.current(con) is not None
    con.close()


def _refresh_in_batches(
    con, monkeypatch: pytest.MonkeyPatch, runs_per_batch: int
) -> tuple[list[str | None], int]:
    """Refresh the facts with batches of about ``runs_per_batch`` runs' predictions; returns what
    each batch computed (facts._compute's ``todo``) and the store's number of runs."""
    n_runs, n_pred = con.execute("SELECT count(DISTINCT run_id), count(*) FROM predictions").fetchall()[0]
    computed: list[str | None] = []
    real = facts._compute

    def spy(c, todo, create) -> None:
        computed.append(todo)
        real(c, todo, create)

    with monkeypatch.context() as mp:
        mp.setattr(facts, "BATCH_PREDICTIONS", runs_per_batch * n_pred // n_runs)
        mp.setattr(facts, "_compute", spy)
        assert facts.refresh(con) is True
    return computed, n_runs


def test_a_refresh_in_batches_of_runs_gives_the_facts_of_one_pass(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, batched = tmp_path / "one.duckdb", tmp_path / "batched.duckdb"
    one.write_bytes(store.read_bytes())
    batched.write_bytes(store.read_bytes())
    con = connect(one)
    facts.refresh(con)
    con.close()

    con = connect(batched)
    # about two runs' predictions per batch: several batches, each of whole runs
    computed, n_runs = _refresh_in_batches(con, monkeypatch, runs_per_batch=2)
    assert n_runs >= 3
    assert len(computed) >= 2 and None not in computed
    assert facts.current(con) is not None
    con.close()

    got, want = _fact_frames(batched), _fact_frames(one)
    for t in facts.FACT_TABLES:
        pd.testing.assert_frame_equal(got[t], want[t], obj=t, check_exact=True)
    a, used_a = _metrics(batched, None)
    b, used_b = _metrics(one, None)
    assert used_a and used_b
    _assert_same(a, b)


def test_batches_hold_whole_runs_in_model_then_run_order_and_a_large_run_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(
        "CREATE TABLE predictions AS SELECT * FROM (VALUES ('a'), ('a'), ('b'), ('c'), ('c'), ('c'), "
        "('c'), ('c'), ('d'), ('f')) t(run_id)"
    )
    con.execute(
        "CREATE TABLE runs AS SELECT * FROM (VALUES ('d', 'm1'), ('c', 'm1'), ('b', 'm1'), ('a', 'm1'), "
        "('e', 'm1'), ('f', NULL), ('g', 'm0')) t(run_id, model)"
    )
    monkeypatch.setattr(facts, "BATCH_PREDICTIONS", 3)
    # model m0 first (g, no predictions), then m1: g+a = 2, +b = 3 predictions; c (5) exceeds a
    # batch and stands alone; d (1) and e (none) share one; the NULL model last (as ORDER BY puts it)
    assert facts._batches(con, "SELECT run_id FROM main.runs") == [["g", "a", "b"], ["c"], ["d", "e", "f"]]


def test_memory_capped_lowers_the_limit_for_the_block_only(tmp_path: Path) -> None:
    from equipoise.evaluators.store import memory_bytes, memory_capped

    assert memory_bytes("18.8 GiB") == int(18.8 * 2**30) and memory_bytes("2GB") == 2 * 10**9
    assert memory_bytes("134217728B") == 2**27 and memory_bytes("0 bytes") == 0
    assert memory_bytes("3.7 GiB", midpoint=True) == int(3.75 * 2**30)
    with pytest.raises(ValueError):
        memory_bytes("lots")
    con = connect(tmp_path / "s.duckdb")
    q = "SELECT current_setting('memory_limit'), current_setting('preserve_insertion_order')"
    con.execute("SET memory_limit = '4GB'")
    before = con.execute(q).fetchall()[0]
    with memory_capped(con, 2**30, preserve_insertion_order=False):
        limit, order = con.execute(q).fetchall()[0]
        assert memory_bytes(limit) == 2**30 and order is False
    assert con.execute(q).fetchall()[0] == before
    with memory_capped(con, 2**30):  # and again: no drift from a limit restored as shown
        pass
    assert con.execute(q).fetchall()[0] == before
    with memory_capped(con, 8 * 2**30):  # a lower limit of the connection is kept
        assert con.execute(q).fetchall()[0] == before
    con.close()


def test_a_pass_over_current_facts_caps_duckdb_memory_under_the_store(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from equipoise.evaluators.metrics import registry
    from equipoise.evaluators.store import memory_bytes

    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    monkeypatch.setattr(registry, "PASS_MEMORY_FLOOR", 2**20)  # the test store is a few MB
    # ... so is the process it is measured against (pass_memory_cap's own test takes real sizes)
    monkeypatch.setattr(registry, "PASS_BASELINE_MIN", 0)
    monkeypatch.setattr(registry, "PASS_OUTSIDE_FIXED", 0)
    monkeypatch.setattr(registry, "own_memory", lambda con: path.stat().st_size // 10)
    q = "SELECT current_setting('memory_limit')"

    def limit_after_prepare(**kw) -> int:
        con = connect(path, read_only=True, **kw)
        try:
            prepare(con, materialize=True)
            return memory_bytes(con.execute(q).fetchall()[0][0])
        finally:
            con.close()

    default = memory_bytes(duckdb_default_limit())
    assert limit_after_prepare() == pytest.approx(default, rel=0.01)  # no facts: no cap
    con = connect(path)
    facts.refresh(con)
    con.close()
    size = path.stat().st_size
    # pass_memory_cap: 95% of the store, less the process and DuckDB's memory outside its limit
    # (the fixed part set to 0 above, as the test store is a few MB)
    want = (0.95 * size - size // 10) / (1 + registry.PASS_OUTSIDE_LIMIT)
    assert limit_after_prepare() == pytest.approx(want, rel=0.05)  # DuckDB shows 2 digits
    # the floor: a store of a few MB gets 256 MiB (DuckDB needs a few MiB whatever the data) ...
    monkeypatch.setattr(registry, "PASS_MEMORY_FLOOR", 256 * 2**20)
    assert limit_after_prepare() == pytest.approx(256 * 2**20, rel=0.01)
    # ... and a limit given by the caller (equipoise metrics --memory-limit) is kept, lower or higher
    assert limit_after_prepare(memory_limit="100MB") == pytest.approx(10**8, rel=0.01)
    assert limit_after_prepare(memory_limit="4GiB") == pytest.approx(4 * 2**30, rel=0.01)
    got, used = _metrics(path, None)  # every metric computes under the cap
    assert used and sum(len(df) for df in got.values()) > 100


def test_the_pass_memory_cap_is_the_room_under_95_percent_of_the_store() -> None:
    """pass_memory_cap as its docstring gives it: the limit, plus DuckDB's memory outside it (48 MiB
    and 3% of the limit), plus the process's own memory before the pass (at least the 88 MiB of a
    process that imported what a pass imports and opened a store) is 95% of the store file."""
    from equipoise.evaluators.metrics.registry import pass_memory_cap

    mib = 2**20
    for store_mib, rss_mib in ((519, 177), (519, 100), (435, 95), (435, 60), (770, 300), (5342, 201)):
        cap = pass_memory_cap(store_mib * mib, rss_mib * mib)
        outside = 48 * mib + 0.03 * cap
        assert cap + outside + max(rss_mib, 88) * mib == pytest.approx(0.95 * store_mib * mib, rel=1e-6)
    # a pass that imports neither pandas nor pyarrow (stop 32) over the 435 MiB 1M store: 95 MiB of
    # its own, so about 262 MiB for DuckDB, where the 175 MiB of a process with them gives 185 MiB
    assert pass_memory_cap(435 * mib, 95 * mib) == pytest.approx(262 * mib, rel=0.01)
    assert pass_memory_cap(435 * mib, 175 * mib) == pytest.approx(185 * mib, rel=0.01)
    # freshly built stores and a process without scipy / scikit-learn (stop 27): 1M gets about
    # 260 MiB, where stop 26's rule (90% target, 15% outside, 256 MiB least baseline) gave 182 MiB
    assert pass_memory_cap(519 * mib, 177 * mib) == pytest.approx(260 * mib, rel=0.01)
    assert pass_memory_cap(5342 * mib, 201 * mib) == pytest.approx(4685 * mib, rel=0.01)  # 10M
    assert pass_memory_cap(5 * mib, 124 * mib) == 128 * mib  # the floor
    assert pass_memory_cap(770 * mib, None) == 385 * mib  # RSS unknown: half the store


def duckdb_default_limit() -> str:
    import duckdb

    con = duckdb.connect()
    try:
        return con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    finally:
        con.close()


def _fact_digests(path: Path) -> dict[str, tuple[int, str]]:
    """Per fact table: row count and the md5 of its rows, each row cast to text, sorted. Bit for
    bit: DuckDB writes a double as the shortest text that reads back as the same double (a last-bit
    difference shows, and so does -0.0), in list columns too; sorting the texts makes the digest
    independent of the table's row order, which carries no meaning."""
    con = connect(path, read_only=True)
    try:
        out = {}
        for t in facts.FACT_TABLES:
            cols = ", ".join(f'"{r[0]}"' for r in con.execute(f"DESCRIBE main.{t}").fetchall())
            n, digest = con.execute(
                f"""SELECT count(*), md5(coalesce(string_agg(r, chr(10) ORDER BY r), ''))
                    FROM (SELECT CAST(ROW({cols}) AS VARCHAR) AS r FROM main.{t})"""
            ).fetchall()[0]
            out[t] = (n, digest)
        return out
    finally:
        con.close()


def test_facts_are_bit_identical_whatever_the_threads_and_batches(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same rows in, same fact bits out: one thread in one pass, or four threads with DuckDB's
    parallelism forced onto this small store and a batch per run. Why it needs forcing: DuckDB
    splits a scan into tasks per row group, so a store of a few thousand rows is read by one thread
    and a parallel sum whose order varies would look deterministic here; ``PRAGMA
    verify_parallelism`` makes every operator run in parallel on tiny morsels, so any aggregate
    that sums doubles in thread order (``sum``, ``avg`` over DOUBLE) gives different last bits."""
    one, many = tmp_path / "one.duckdb", tmp_path / "many.duckdb"
    one.write_bytes(store.read_bytes())
    many.write_bytes(store.read_bytes())
    con = connect(one)
    con.execute("SET threads = 1")
    assert facts.refresh(con) is True
    con.close()

    con = connect(many)
    con.execute("SET threads = 4")
    con.execute("PRAGMA verify_parallelism")
    computed, n_runs = _refresh_in_batches(con, monkeypatch, runs_per_batch=1)
    con.close()
    assert len(computed) == n_runs >= 3  # really in batches

    got, want = _fact_digests(many), _fact_digests(one)
    assert all(n > 0 for n, _ in want.values())
    differ = sorted(t for t in facts.FACT_TABLES if got[t] != want[t])
    assert differ == [], f"fact tables that depend on threads or batches: {differ}"


def test_metrics_over_facts_are_bit_identical_whatever_the_threads(store: Path, tmp_path: Path) -> None:
    """The metrics a pass over current facts reports do not depend on DuckDB's threads: one thread,
    or four with parallelism forced (``PRAGMA verify_parallelism``, as in the fact test above: this
    store is too small to be read in parallel otherwise). Sums of non-integer doubles in the metric
    SQL are exact integer sums in fixed point (cal_bins, cal_brier, cal_brier_multiclass,
    cal_selective) or add value-sorted lists (cal_ece, rob_flip), so a parallel sum's order cannot
    reach the last bit. Compared exactly."""
    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    con = connect(path)
    facts.refresh(con)
    con.close()
    (one, used_one), (four, used_four) = one_thread_and_forced_parallel(
        path, lambda con: _metrics_on(con, None)
    )
    assert used_one and used_four
    assert not [n for n, df in one.items() if "refused" in df.columns]  # every metric computed
    assert sum(len(df) for df in one.values()) > 100
    differ = []
    for name in one:
        try:
            pd.testing.assert_frame_equal(four[name], one[name], check_exact=True, obj=name)
        except AssertionError:
            differ.append(name)
    assert differ == [], f"metrics that depend on DuckDB's threads: {differ}"


def _unc_scores_read(path: Path) -> tuple[dict[str, tuple[bool, bool, pd.DataFrame]], dict[str, tuple]]:
    """unc_scores per pool as a read-only pass reads it from the facts, once with one DuckDB thread
    and once with parallelism forced (``one_thread_and_forced_parallel``): per pool, whether the
    fact's rows were found in published order, whether the query sorts, and the rows, fetched and
    as ``write_result`` writes them (COPY ... TO Parquet) must be the same."""
    from equipoise.evaluators.metrics import uncertainty
    from equipoise.evaluators.metrics.registry import result_sql, write_result

    def run(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[bool, bool, pd.DataFrame]]:
        _load_all()
        prepare(con, materialize=True)
        assert uses_facts(con)
        out = {}
        for pool in facts.POOLS:
            in_order = uncertainty._fact_in_order(con, f"main.facts_unc_scores_{pool}", ["model"])
            sql = result_sql(con, "unc_scores", None, {"pool": pool})
            assert sql is not None
            df = con.execute(sql).df()
            file = path.with_name(f"unc_scores_{pool}.parquet")
            assert write_result(con, "unc_scores", file, params={"pool": pool}) == len(df)
            pd.testing.assert_frame_equal(pd.read_parquet(file), df, obj=f"{pool} as written")
            out[pool] = (in_order, "ORDER BY" in sql, df)
        return out

    return one_thread_and_forced_parallel(path, run)


def test_unc_scores_fact_is_written_in_published_order_and_copied_without_a_sort(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """facts_unc_scores_<pool> is written sorted as unc_scores publishes it for its default
    grouping (model, run_id, item_id), batch after batch of runs in that order, so unc_scores reads
    it with a plain scan: no ORDER BY, and the rows still come in the published order, with one
    thread or with parallelism forced. When the fact's rows are out of order (here: rewritten
    shuffled, as an incremental refresh that appends a run could leave them) the check says so and
    the query sorts, with the same result."""
    plain, path = tmp_path / "plain.duckdb", tmp_path / "s.duckdb"
    plain.write_bytes(store.read_bytes())
    path.write_bytes(store.read_bytes())
    con = connect(path)
    # the store's run_id order is not its (model, run_id) order, else the batches prove nothing
    runs = con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()
    assert runs != con.execute("SELECT run_id FROM runs ORDER BY model, run_id").fetchall()
    con.execute("SET threads = 4")
    con.execute("PRAGMA verify_parallelism")
    computed, n_runs = _refresh_in_batches(con, monkeypatch, runs_per_batch=1)
    con.close()
    assert len(computed) == n_runs >= 3  # really in batches

    want, used = _metrics_on_unc_scores(plain)  # from the source tables, sorted by the query
    assert not used
    _assert_unc_scores_read(path, want, in_order=True)

    from equipoise.evaluators.metrics import uncertainty

    con = connect(path, read_only=True)  # without preserve_insertion_order a scan promises no order
    con.execute("SET preserve_insertion_order = false")
    assert not uncertainty._fact_in_order(con, "main.facts_unc_scores_item", ["model"])
    con.close()

    con = connect(path)  # the same rows, shuffled: still current facts, no longer in order
    for pool in facts.POOLS:
        t = f"main.facts_unc_scores_{pool}"
        con.execute(f"CREATE OR REPLACE TABLE {t} AS SELECT * FROM {t} ORDER BY hash(item_id), run_id")
    con.close()
    _assert_unc_scores_read(path, want, in_order=False)


def _assert_unc_scores_read(path: Path, want: dict[str, pd.DataFrame], in_order: bool) -> None:
    """unc_scores of every pool read from ``path``'s facts, with one thread and with parallelism
    forced: the rows of ``want``, found in order (and so not sorted) exactly when ``in_order``."""
    one, forced = _unc_scores_read(path)
    for pool in facts.POOLS:
        for found, sorts, df in (one[pool], forced[pool]):
            assert (found, sorts) == (in_order, not in_order), pool
            pd.testing.assert_frame_equal(df, want[pool], obj=pool)


def _metrics_on_unc_scores(path: Path) -> tuple[dict[str, pd.DataFrame], bool]:
    """unc_scores per pool on a read-only pass over ``path``, and whether it read facts."""
    con = connect(path, read_only=True)
    try:
        _load_all()
        prepare(con, materialize=True)
        return {p: compute(con, "unc_scores", params={"pool": p}) for p in facts.POOLS}, uses_facts(con)
    finally:
        con.close()


@pytest.fixture(scope="module")
def fact_store(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``store`` with its facts written, for the tests that only read them."""
    return with_facts(store, tmp_path_factory.mktemp("facts_written") / "f.duckdb")


@pytest.mark.parametrize("by", (None, ("suite", "variant"), ("specialty", "k")))
def test_combiner_rows_ordered_in_numpy_equal_the_rows_sorted_by_duckdb(
    fact_store: Path, monkeypatch: pytest.MonkeyPatch, by: tuple[str, ...] | None
) -> None:
    """Over the write-time fact, unc_combiners' fitting rows come from DuckDB unsorted with one
    integer key and numpy orders them (uncertainty._features_with_gid): the same rows in the same
    order as the query's own ORDER BY gives (taken here by hiding the fact's item ranks from that
    choice), so the fits, predictions and test AUROCs are the same bits."""
    from equipoise.evaluators.metrics import uncertainty

    _load_all()
    con = connect(fact_store, read_only=True)
    try:
        prepare(con, materialize=True)
        assert uses_facts(con)
        cols = list(REGISTRY["unc_combiners"].default_by if by is None else by)
        params = dict(REGISTRY["unc_combiners"].params)
        got = pd.DataFrame(uncertainty._features_with_gid(con, cols, params, slim=True))
        got_metric = compute(con, "unc_combiners", cols)
        with monkeypatch.context() as m:
            m.setattr(uncertainty, "_fact_with_item_ord", lambda con, params: None)
            want = pd.DataFrame(uncertainty._features_with_gid(con, cols, params, slim=True))
            want_metric = compute(con, "unc_combiners", cols)
    finally:
        con.close()
    assert len(got) > 100 and got["_gid"].nunique() > 1 and "_key" not in got.columns
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    pd.testing.assert_frame_equal(got_metric, want_metric, check_exact=True)


def test_item_code_is_the_rank_of_item_id_among_the_items_and_readers_never_see_it(fact_store: Path) -> None:
    """facts_scored's item_code (conformal's integer unit key) is the 1-based rank of its item_id
    among the distinct item_id of ``items`` in string order, checked against Python's sort; the
    ``scored`` relation a pass reads leaves it (and the conformal score columns) out."""
    from equipoise.evaluators.metrics.registry import ITEM_CODE, SCORED_PROBS_COLUMNS

    con = connect(fact_store, read_only=True)
    items = {r[0] for r in con.execute("SELECT item_id FROM items").fetchall()}
    ids = sorted(items, key=lambda s: s.encode())  # DuckDB compares strings bytewise
    want = {item: i + 1 for i, item in enumerate(ids)}
    rows = con.execute(f"SELECT item_id, {ITEM_CODE} FROM facts_scored").fetchall()
    con.close()
    assert rows and all(code == want[item] for item, code in rows)
    ro = connect(fact_store, read_only=True)
    prepare(ro, materialize=True)
    assert uses_facts(ro)
    cols = {r[0] for r in ro.execute("DESCRIBE scored").fetchall()}
    ro.close()
    assert ITEM_CODE not in cols and not cols & set(SCORED_PROBS_COLUMNS)


def test_sample_probs_over_the_facts_equals_the_relation_computed_from_the_source_tables(
    store: Path, fact_store: Path
) -> None:
    """From facts format 8 no table holds ``sample_probs``: over current facts it is the rows of
    facts_scored that have option scores (``registry.read_facts``). Those rows and values must be
    the relation ``sql/sample_probs.sql`` computes from the source tables, row for row and bit for
    bit: no metric of a pass reads it any more, so nothing else would notice a difference."""
    query = "SELECT * FROM sample_probs ORDER BY run_id, item_id, sample_index"
    live = connect(store, read_only=True)
    prepare(live, materialize=True)
    assert not uses_facts(live)  # the module's store has no facts: computed from the tables
    want = live.execute(query).df()
    live.close()
    ro = connect(fact_store, read_only=True)
    prepare(ro, materialize=True)
    assert uses_facts(ro)
    got = ro.execute(query).df()
    ro.close()
    assert len(want) > 100 and want["aps_scores"].map(len).sum() > 0
    assert list(got.columns) == list(want.columns)
    for df in (got, want):  # list cells as tuples, compared element by element
        for c in ("lac_scores", "aps_scores"):
            df[c] = df[c].map(tuple)
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_a_refresh_drops_the_per_sample_fact_table_of_format_7(fact_store: Path, tmp_path: Path) -> None:
    """A store whose facts were written by format 7 holds ``facts_sample_probs``; its facts are
    not current for format 8 (the format is part of the fingerprint), the refresh that follows
    recomputes everything and drops that table (``facts.OBSOLETE_TABLES``), and the facts are
    then current without it."""
    path = tmp_path / "f7.duckdb"
    path.write_bytes(fact_store.read_bytes())
    con = connect(path)
    con.execute("CREATE TABLE main.facts_sample_probs AS SELECT 1 AS x")  # format 7's table
    con.execute("UPDATE main.store_meta SET value = 'format-7' WHERE key = ?", [facts.SHARED_KEY])
    con.execute("UPDATE main.store_meta SET value = 'format-7' WHERE key = ?", [facts.META_KEY])
    assert facts.current(con) is None
    assert facts.refresh(con) is True
    tables = facts._main_tables(con)
    assert "facts_sample_probs" not in tables and set(facts.FACT_TABLES) <= tables
    assert facts.current(con) is not None
    con.close()


def test_no_sample_probs_rowids_are_read_over_the_facts(fact_store: Path) -> None:
    """Over the facts, conformal reads option units from facts_scored (``_coded``); asking for
    ``sample_probs`` rowids there is an error, not a read of a table that format 8 no longer has."""
    from equipoise.evaluators.metrics.conformal import _coded, _row_relation

    ro = connect(fact_store, read_only=True)
    prepare(ro, materialize=True)
    try:
        assert _coded(ro) and _row_relation(ro, "scored") == "main.facts_scored"
        with pytest.raises(ValueError, match="no table of its own"):
            _row_relation(ro, "sample_probs")
    finally:
        ro.close()
