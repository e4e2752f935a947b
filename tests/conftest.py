from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from equipoise.scoring_systems.loader import all_systems

# datasets/huggingface_hub read these at import: never touch the network in tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

SYSTEMS = all_systems()
SYSTEM_IDS = sorted(SYSTEMS)


@pytest.fixture(scope="session", autouse=True)
def _wide_cli_console():
    """The CLI's console (``equipoise.cli.console``, created at import) 400 columns wide for every
    test. It wraps at the terminal's width (at least 110 columns), and tests look for phrases in its
    output: one that follows a tmp path wrapped across two lines once the path grew longer under
    pytest-xdist (``.../popen-gw1/...``). Set on the console itself, not through ``COLUMNS``: that
    would also widen pytest's own output, and an exported ``COLUMNS`` would override it."""
    from equipoise import cli

    cli.console.width = 400


@pytest.fixture(scope="session")
def systems():
    return SYSTEMS


@pytest.fixture(scope="session")
def nota(tmp_path_factory) -> Path:
    """The bundled NOTA suite built once (seed 1) for the import tests (test_import,
    test_import_blocks). Modules that need another seed define their own ``nota``, which overrides
    this one."""
    from equipoise.builders.mcq_build import build_mcq_suite

    out = tmp_path_factory.mktemp("nota") / "nota"
    build_mcq_suite("nota", out, seed=1)
    return out


def one_thread_and_forced_parallel(store: Path, fn):
    """``fn(con)`` on a read-only connection to ``store`` twice: with one DuckDB thread, and with
    four and ``PRAGMA verify_parallelism`` (every operator parallel even on a small store, so a sum
    of doubles in thread order shows in the last bits). Returns the two results (one, forced)."""
    import duckdb

    got = []
    for threads, forced in ((1, False), (4, True)):
        con = duckdb.connect(str(store), read_only=True)
        try:
            con.execute(f"SET threads = {threads}")
            if forced:
                con.execute("PRAGMA verify_parallelism")
            got.append(fn(con))
        finally:
            con.close()
    return got[0], got[1]


def with_facts(store: Path, path: Path) -> Path:
    """A copy of ``store`` at ``path`` with its write-time facts written (``facts.refresh``), for
    module fixtures whose tests only read them."""
    from equipoise.evaluators.metrics import facts
    from equipoise.evaluators.store import connect

    path.write_bytes(store.read_bytes())
    con = connect(path)
    try:
        assert facts.refresh(con)
    finally:
        con.close()
    return path


# copies of a run for ``with_run_copies`` (the conformal split tests): one with its option log-probs
# rounded to one decimal (ties between options, and with thresholds), one with NaN log-probs on about
# a quarter of its items (NaN target scores, which DuckDB sorts above every number)
ROUNDED_AND_NAN_RUNS = {
    "rerun": "list_transform(score_logprobs, lambda x: round(x, 1)) AS score_logprobs",
    "nan": "list_transform(score_logprobs, lambda x: CASE WHEN hash(item_id) % 4 = 0 THEN 'nan'::DOUBLE "
    "ELSE x END) AS score_logprobs",
}


def with_run_copies(path: Path, seed: int, n_items: int, copies: dict[str, str]) -> Path:
    """Facts (``with_facts``, at ``f.duckdb`` beside ``path``) of a synthetic store built at ``path``
    (``make_store``: ``n_items`` items, 2 samples, ``seed``) plus, per entry of ``copies``, a copy of
    its first run named ``<run>-<suffix>`` whose predictions take the entry's REPLACE expressions
    (e.g. ``list_transform(score_logprobs, lambda x: x * 0.5) AS score_logprobs``): runs of one
    (model, config) that share their items, so their units tie on the conformal split's hash."""
    import duckdb

    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    make_store(path, SyntheticSpec(n_items=n_items, samples=2, seed=seed))
    con = duckdb.connect(str(path))
    try:
        run = con.execute("SELECT min(run_id) FROM runs").fetchone()[0]
        for suffix, replace in copies.items():
            copy = f"{run}-{suffix}"
            con.execute(
                f"""INSERT INTO runs SELECT * REPLACE ('{copy}' AS run_id) FROM runs WHERE run_id = '{run}';
                    INSERT INTO predictions SELECT * REPLACE ('{copy}' AS run_id, {replace})
                    FROM predictions WHERE run_id = '{run}';"""
            )
    finally:
        con.close()
    return with_facts(path, path.with_name("f.duckdb"))


@contextmanager
def option_mask(path: Path, by: Sequence[str], params: dict) -> Iterator[tuple]:
    """A read-only connection to the facts store ``path``, prepared for a metrics pass over its
    current facts, with the conformal option units' mask table for conformal_lac's parameters and
    ``params`` grouped by ``by``: yields ``(con, values, table)``; the connection is closed after."""
    import duckdb

    from equipoise.evaluators.metrics import conformal
    from equipoise.evaluators.metrics.registry import REGISTRY, prepare

    con = duckdb.connect(str(path), read_only=True)
    try:
        prepare(con, materialize=True)
        assert conformal._coded(con)
        values = conformal._common(by, {**REGISTRY["conformal_lac"].params, **params})
        yield con, values, conformal._option_mask_table(con, values)
    finally:
        con.close()


def random_value(inp, rng: random.Random):
    from tests.bruteforce import full_grid

    if inp.kind == "binary":
        return rng.random() < 0.5
    if inp.kind == "categorical":
        return rng.choice(inp.values())
    return rng.choice(full_grid(inp))


@pytest.fixture(scope="session")
def small_clindet(tmp_path_factory) -> Path:
    """A small but complete build of the suite (every system), shared by dataset/CLI tests."""
    from equipoise.builders.clindet_suite import build_clindet

    out = tmp_path_factory.mktemp("clindet") / "ds"
    build_clindet(out, per_system=40, seed=11, progress=False)
    return out


def load_local(folder: Path, config: str, split: str = "test"):
    """``datasets.load_dataset(folder, config)`` with a cache dir unique to this dataset version:
    datasets 5.2 keys a local folder's cache by its basename, so two builds into folders with the
    same name would otherwise share (and return) one cached copy."""
    import hashlib

    from datasets import load_dataset

    digest = hashlib.sha256((Path(folder) / "manifest.json").read_bytes()).hexdigest()[:16]
    cache = Path(folder).parent / f".hf-cache-{digest}"
    return load_dataset(str(folder), config, split=split, cache_dir=str(cache))
