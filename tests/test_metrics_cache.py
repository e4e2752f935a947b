"""`equipoise metrics` caches results per store content: a second call on an unchanged store computes
nothing and prints the same bytes; any write to the store gives fresh results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators.metrics import cache, registry
from equipoise.evaluators.store import connect
from equipoise.evaluators.synthetic import SyntheticSpec, make_store

runner = CliRunner()


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=40, models=("m1", "m2"), samples=2, unparsed_rate=0.1, seed=4))
    return path


def _metrics(store: Path, *args: str) -> str:
    r = runner.invoke(app, ["metrics", "--store", str(store), *args])
    assert r.exit_code == 0, r.output
    return r.output


def _refuse_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("computed although the store is unchanged")

    monkeypatch.setattr(registry, "compute", boom)
    monkeypatch.setattr(registry, "write_result", boom)
    monkeypatch.setattr(registry, "prepare", boom)


@pytest.mark.parametrize("fmt", ["json", "md", "csv"])
def test_unchanged_store_is_served_from_the_cache(store: Path, monkeypatch, fmt: str) -> None:
    args = ("--format", fmt)  # every metric, default grouping
    first = _metrics(store, *args)
    assert len(list(cache.cache_dir(store).glob("*.parquet"))) == len(registry.REGISTRY)
    with monkeypatch.context() as m:
        _refuse_compute(m)
        assert _metrics(store, *args) == first
    if fmt == "json":  # computing again agrees (to the last bits a parallel double sum may move)
        again = json.loads(_metrics(store, *args, "--no-cache"))
        want = json.loads(first)
        assert again.keys() == want.keys()
        for name in want:
            pd.testing.assert_frame_equal(pd.DataFrame(again[name]), pd.DataFrame(want[name]), rtol=1e-12)


def test_out_files_from_the_cache_are_the_computed_files(store: Path, tmp_path: Path, monkeypatch) -> None:
    _metrics(store, "--out", str(tmp_path / "a"))
    with monkeypatch.context() as m:
        _refuse_compute(m)
        _metrics(store, "--out", str(tmp_path / "b"))
    for f in sorted((tmp_path / "a").glob("*.parquet")):
        assert (tmp_path / "b" / f.name).read_bytes() == f.read_bytes()


def test_a_write_to_the_store_is_never_served_from_the_cache(store: Path) -> None:
    before = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates"))
    con = connect(store)
    con.execute("UPDATE predictions SET parsed_label = NULL, outcome = 'unparsed' WHERE sample_index = 1")
    con.close()
    after = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates"))
    fresh = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates", "--no-cache"))
    pd.testing.assert_frame_equal(
        pd.DataFrame(after["answer_rates"]), pd.DataFrame(fresh["answer_rates"]), rtol=1e-12
    )
    assert not pd.DataFrame(after["answer_rates"]).equals(pd.DataFrame(before["answer_rates"]))
    assert pd.DataFrame(after["answer_rates"]).shape == pd.DataFrame(before["answer_rates"]).shape


def test_an_unwritable_cache_folder_only_disables_the_cache(store: Path) -> None:
    cache.cache_dir(store).write_text("a file where the folder would be")
    out = _metrics(store, "--format", "json", "--metric", "answer_rates")
    assert json.loads(out)["answer_rates"]


def test_changed_metric_code_is_never_served_from_the_cache(store: Path, monkeypatch) -> None:
    """Same store, same package version, other metric code (an editable install between commits):
    the old result must not be served, so the digest of the metric sources is part of the key."""
    _metrics(store, "--format", "json", "--metric", "answer_rates")
    with monkeypatch.context() as m:
        _refuse_compute(m)
        _metrics(store, "--format", "json", "--metric", "answer_rates")  # same code: a hit
    monkeypatch.setattr(cache, "code_digest", lambda: "other metric code")
    calls: list[str] = []
    real = registry.compute

    def counting(con, name, *a, **k):
        calls.append(name)
        return real(con, name, *a, **k)

    monkeypatch.setattr(registry, "compute", counting)
    _metrics(store, "--format", "json", "--metric", "answer_rates")
    assert calls == ["answer_rates"]


def test_code_digest_changes_with_any_metric_sql_or_module(tmp_path: Path, monkeypatch) -> None:
    """The digest reads the metric package's files: a one-byte change to a SQL file or a module
    gives another digest (checked on a copy of the package, never on the installed files)."""
    import shutil

    pkg = tmp_path / "metrics"
    shutil.copytree(Path(cache.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "__file__", str(pkg / "cache.py"))
    digests = []
    for edit in (None, pkg / "sql" / "answer_rates.sql", pkg / "calibration.py"):
        if edit is not None:
            edit.write_bytes(edit.read_bytes() + b"\n")
        cache.code_digest.cache_clear()
        digests.append(cache.code_digest())
    cache.code_digest.cache_clear()
    assert len(set(digests)) == 3


# --- the fingerprint's scan, memoised beside the store (cache.source_sums) ---------------------


@pytest.fixture()
def fact_store(store: Path) -> Path:
    """``store`` with current fact tables: the pass then checks them by fingerprint."""
    from equipoise.evaluators.metrics import facts

    con = connect(store)
    facts.refresh(con)
    con.close()
    return store


def _count_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every scan of the source tables (facts.source_sums) from here on appends to the list."""
    from equipoise.evaluators.metrics import facts

    calls: list[int] = []
    real = facts.source_sums

    def counting(con):
        calls.append(1)
        return real(con)

    monkeypatch.setattr(facts, "source_sums", counting)
    return calls


def _settle_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any store is settled (a test cannot wait out real timestamp granularity)."""
    monkeypatch.setattr(cache, "SETTLE_FINE_NS", 0)
    monkeypatch.setattr(cache, "SETTLE_COARSE_NS", 0)


def test_one_metrics_command_scans_the_store_once_and_a_later_one_not_at_all(
    fact_store: Path, tmp_path: Path, monkeypatch
) -> None:
    """The cache's content version and the pass's check of its facts share one scan; with the
    memo, a command that still computes (no cached result) scans nothing, and writes the same
    files as a command that scanned."""
    from equipoise.evaluators.metrics import facts

    store = fact_store
    con = connect(store, read_only=True)
    assert facts.current(con) is not None  # the pass reads the facts, so it checks them
    con.close()
    _settle_now(monkeypatch)
    scans = _count_scans(monkeypatch)
    _metrics(store, "--out", str(tmp_path / "a"))
    assert len(scans) == 1 and (cache.cache_dir(store) / "stat.json").exists()
    for f in cache.cache_dir(store).glob("*.parquet"):  # results gone, memo kept
        f.unlink()
    _metrics(store, "--out", str(tmp_path / "b"))
    assert len(scans) == 1
    for f in sorted((tmp_path / "a").glob("*.parquet")):
        assert (tmp_path / "b" / f.name).read_bytes() == f.read_bytes()
    _metrics(store, "--out", str(tmp_path / "c"), "--no-cache")  # no cache: no memo either
    assert len(scans) == 2


def _memoise(store: Path) -> dict[str, str]:
    """Open the store read-only as the CLI does (its stat first) and take the sums through the memo."""
    opened = cache.file_stat(store)
    con = connect(store, read_only=True)
    try:
        return cache.source_sums(con, store, opened)
    finally:
        con.close()


def _memo_now(store: Path) -> dict[str, str] | None:
    """What a reader that opens the store now would get from the memo."""
    opened = cache.file_stat(store)
    con = connect(store, read_only=True)
    try:
        return cache.memoised_sums(store, opened)
    finally:
        con.close()


def test_a_store_changed_just_before_the_scan_keeps_no_memo(store: Path, monkeypatch) -> None:
    """A change within the file system's timestamp granularity of the stat could share its times
    with a later write of the same size, so its sums are used but not memoised."""
    monkeypatch.setattr(cache, "SETTLE_FINE_NS", 60 * 10**9)
    monkeypatch.setattr(cache, "SETTLE_COARSE_NS", 60 * 10**9)
    os.utime(store)  # changed now
    _metrics(store, "--format", "json", "--metric", "answer_rates")
    assert not (cache.cache_dir(store) / "stat.json").exists()
    assert _memo_now(store) is None


def test_the_memo_is_tied_to_the_files_identity_and_times_and_duckdb(store: Path, monkeypatch) -> None:
    """A matching size and mtime are not enough: the change time moves with any write, even one
    whose mtime was put back (``touch -d``, ``cp -p``); another inode, another DuckDB (whose hash
    gives the sums) or a damaged memo is a miss, never an error."""
    from equipoise.evaluators.metrics import facts

    _settle_now(monkeypatch)
    want = _memoise(store)
    con = connect(store, read_only=True)
    assert want == facts.source_sums(con)
    con.close()
    assert _memo_now(store) == want
    st = store.stat()
    os.utime(store, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime, new ctime
    assert store.stat().st_mtime_ns == st.st_mtime_ns and store.stat().st_size == st.st_size
    if store.stat().st_ctime_ns != st.st_ctime_ns:  # a ctime clock too coarse to move: nothing to see
        assert _memo_now(store) is None
    _memoise(store)  # memoised again
    memo = cache.cache_dir(store) / "stat.json"
    saved = json.loads(memo.read_text())
    assert _memo_now(store) == want
    for field, value in (("duckdb", "0.0.1"), ("format", 1), ("stat", [0] * 10)):
        memo.write_text(json.dumps({**saved, field: value}))
        assert _memo_now(store) is None, field
    memo.write_text(json.dumps({**saved, "sums": {**want, "predictions": 3}}))
    assert _memo_now(store) is None
    for damaged in (
        "{not json",
        "{}",
        "[]",
        '{"sums": 3}',
        json.dumps({"stat": saved["stat"], "fingerprint": "x"}),
    ):
        memo.write_text(damaged)
        assert _memo_now(store) is None, damaged


def test_a_memo_of_older_code_is_a_miss_for_metrics_and_report(
    fact_store: Path, tmp_path: Path, monkeypatch
) -> None:
    """The memo layout before format 2 ({"stat", "fingerprint"}): both commands scan and go on, and
    metrics writes the new layout in its place."""
    from equipoise.evaluators import report

    store = fact_store
    _settle_now(monkeypatch)
    memo = cache.cache_dir(store) / "stat.json"
    memo.parent.mkdir()
    old = json.dumps({"stat": [store.stat().st_size, store.stat().st_mtime_ns, -1, -1], "fingerprint": "f"})
    memo.write_text(old)
    report.write_report(store, tmp_path / "r")
    assert memo.read_text() == old  # a report never writes one
    assert json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates"))["answer_rates"]
    assert "sums" in json.loads(memo.read_text())


def test_the_memo_is_never_used_for_a_file_renamed_over_the_path(
    store: Path, tmp_path: Path, monkeypatch
) -> None:
    """A store replaced under its path between the reader's stat and its open (rsync, cp + mv) is
    another inode: the memo is neither read nor written for what the connection opened."""
    _settle_now(monkeypatch)
    want = _memoise(store)
    opened = cache.file_stat(store)
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(store.read_bytes())
    os.replace(copy, store)  # same bytes, another inode
    con = connect(store, read_only=True)
    assert cache.memoised_sums(store, opened) is None  # the stat taken before the open no longer holds
    scans = _count_scans(monkeypatch)
    assert cache.source_sums(con, store, opened) == want and len(scans) == 1
    con.close()
    memo = json.loads((cache.cache_dir(store) / "stat.json").read_text())
    assert memo["stat"] == opened  # still the memo of the replaced file: nothing written for the new one
    assert _memo_now(store) is None


def test_settled_needs_quiet_longer_than_the_timestamp_granularity() -> None:
    """Times with a sub-second part: a fine file system, quiet for SETTLE_FINE_NS; whole seconds
    everywhere: a coarse one, quiet for SETTLE_COARSE_NS. The log's times count when it exists."""
    s = 10**9
    fine = [1, 2, 100, 5 * s + 1234, 5 * s + 1234, *([-1] * 5)]
    assert not cache._settled(fine, 5 * s + 1234 + cache.SETTLE_FINE_NS)
    assert cache._settled(fine, 5 * s + 1235 + cache.SETTLE_FINE_NS)
    coarse = [1, 2, 100, 5 * s, 4 * s, *([-1] * 5)]
    assert not cache._settled(coarse, 5 * s + cache.SETTLE_FINE_NS + 1)
    assert cache._settled(coarse, 5 * s + cache.SETTLE_COARSE_NS + 1)
    with_log = [*fine[:5], 1, 3, 10, 9 * s + 7, 9 * s + 7]
    assert not cache._settled(with_log, 5 * s + 1235 + cache.SETTLE_FINE_NS)
    assert cache._settled(with_log, 9 * s + 8 + cache.SETTLE_FINE_NS)
    assert not cache._settled([-1] * 10, 10**18)


def test_memoised_sums_of_other_fact_definitions_still_find_the_facts_stale(
    fact_store: Path, monkeypatch
) -> None:
    """The memo holds the source tables' sums, not the fingerprint: the fact definitions are hashed
    in each time, so code whose facts differ never takes a memo as proof that the stored facts are
    current."""
    from equipoise.evaluators.metrics import facts

    store = fact_store
    _settle_now(monkeypatch)
    sums = _memoise(store)
    con = connect(store, read_only=True)
    assert facts.current(con, sums) is not None
    monkeypatch.setattr(facts, "FACTS_FORMAT", facts.FACTS_FORMAT + 1000)
    assert cache.memoised_sums(store, cache.file_stat(store)) == sums
    assert facts.current(con, sums) is None
    con.close()


def test_report_skips_the_scan_with_a_memo_and_never_writes_one(
    fact_store: Path, tmp_path: Path, monkeypatch
) -> None:
    from equipoise.evaluators import report

    store = fact_store
    _settle_now(monkeypatch)
    scans = _count_scans(monkeypatch)
    report.write_report(store, tmp_path / "r1")
    assert len(scans) == 1 and not (cache.cache_dir(store) / "stat.json").exists()
    _memoise(store)
    report.write_report(store, tmp_path / "r2")
    assert len(scans) == 2  # the memo's scan only
    for f in sorted((tmp_path / "r1").glob("*.csv")):
        assert (tmp_path / "r2" / f.name).read_bytes() == f.read_bytes(), f.name


def test_a_writable_connection_neither_reads_nor_writes_the_memo(store: Path, monkeypatch) -> None:
    """Only a read-only connection's lock keeps other writers out between the stat and the scan;
    and a writable one may hold rows of its own that no memo counts (an open transaction)."""
    from equipoise.evaluators.metrics import facts

    _settle_now(monkeypatch)
    con = connect(store)
    opened = cache.file_stat(store)
    assert cache.source_sums(con, store, opened) == facts.source_sums(con)
    con.close()
    assert not (cache.cache_dir(store) / "stat.json").exists()
    before = _memoise(store)
    opened = cache.file_stat(store)
    con = connect(store)
    con.execute("BEGIN")
    con.execute("DELETE FROM predictions WHERE sample_index = 1")
    assert cache.source_sums(con, store, opened) != before  # its own rows, not the memo's
    con.execute("ROLLBACK")
    con.close()
