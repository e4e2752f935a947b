"""The sweep on a local Ray instance (``ray.init(num_cpus=2)``): same rows as a single process, and a
worker killed mid-run loses and duplicates nothing. Skipped, with the reason, when Ray is absent."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'equipoise[ray]')")

from equipoise.builders.mcq_build import build_mcq_suite  # noqa: E402
from equipoise.evaluators.backends.base import Decoding  # noqa: E402
from equipoise.evaluators.executor import execute_planned  # noqa: E402
from equipoise.evaluators.parts import part_dirs  # noqa: E402
from equipoise.evaluators.planner import RunSpec, plan_status  # noqa: E402
from equipoise.evaluators.ray_exec import run_sweep_ray  # noqa: E402
from equipoise.evaluators.store import connect  # noqa: E402
from tests.fakeopenai import FakeOpenAI, completion  # noqa: E402

PRED_SQL = "SELECT * EXCLUDE (latency_ms) FROM predictions ORDER BY run_id, item_id, sample_index"
SCORE_SQL = "SELECT * FROM option_scores ORDER BY run_id, item_id, sample_index, label"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def nota(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray") / "nota"
    build_mcq_suite("nota", folder, seed=9)
    return folder


def _specs(
    folder: Path, backend: str, models: list[str], configs: tuple[str, ...] = ("original", "plus_nota"), **kw
) -> list[RunSpec]:
    return [
        RunSpec(
            dataset=str(folder),
            folder=str(folder),
            config=c,
            backend=backend,
            model=m,
            decoding=Decoding(),
            commit_every=5,
            **kw,
        )
        for c in configs
        for m in models
    ]


def _single(specs: list[RunSpec], store: Path) -> None:
    con = connect(store)
    execute_planned(plan_status(specs, con), con)
    con.close()


def _ray(specs: list[RunSpec], store: Path, parts: Path) -> int:
    con = connect(store)
    try:
        return run_sweep_ray(plan_status(specs, con), con, parts, workers=2, progress=False)
    finally:
        con.close()


def _rows(store: Path, sql: str) -> list[tuple]:
    con = connect(store, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_ray_run_equals_single_process(local_ray, nota, tmp_path):
    specs = _specs(nota, "reference", ["chance", "calibrated"])
    _single(specs, tmp_path / "single.duckdb")
    added = _ray(specs, tmp_path / "ray.duckdb", tmp_path / "parts")
    assert added == len(_rows(tmp_path / "single.duckdb", PRED_SQL)) > 0
    for sql in (PRED_SQL, SCORE_SQL, "SELECT * FROM runs ORDER BY run_id"):
        assert _rows(tmp_path / "ray.duckdb", sql) == _rows(tmp_path / "single.duckdb", sql)
    assert {p.name.split("-")[1] for p in part_dirs(tmp_path / "parts")} == {"s000of002", "s001of002"}
    assert _ray(specs, tmp_path / "ray.duckdb", tmp_path / "parts") == 0  # complete: nothing added


def _answer(body):
    time.sleep(0.03)
    user = body["messages"][-1]["content"]
    return 200, completion(f"Answer: {'B' if 'B.' in user else 'A'}")


def _shard_workers() -> list[int]:
    """Pids of Ray worker processes currently running a shard (Ray titles them ray::run_shard).

    Every such process on the machine, not only this test's: the tests that kill one are safe
    because one pytest-xdist worker runs this whole module (``--dist loadscope``, pyproject.toml),
    so no other Ray cluster of this suite runs beside it."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::run_shard"):
                pids.append(int(d.name))
    return pids


def test_killed_worker_is_retried_without_loss_or_duplicates(local_ray, nota, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    with FakeOpenAI(_answer) as server:
        specs = _specs(
            nota, "openai", ["fake-model"], ("plus_nota",), base_url=server.base_url, concurrency=1
        )
        _single(specs, tmp_path / "single.duckdb")
        asked_single = len(server.requests)
        parts = tmp_path / "parts"
        box: dict[str, object] = {}
        t = threading.Thread(target=lambda: box.update(added=_ray(specs, tmp_path / "ray.duckdb", parts)))
        t.start()
        killed = None
        deadline = time.time() + 60
        while killed is None and time.time() < deadline and t.is_alive():
            workers = _shard_workers()
            # both shards' meta parts and a first batch committed, the rest in flight
            if workers and len(part_dirs(parts)) >= 3:
                killed = workers[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.02)
        t.join(timeout=120)
        asked_ray = len(server.requests) - asked_single
    assert killed is not None, "no shard worker was seen running"
    assert not t.is_alive() and "added" in box, "the Ray sweep did not finish after the kill"
    single, got = _rows(tmp_path / "single.duckdb", PRED_SQL), _rows(tmp_path / "ray.duckdb", PRED_SQL)
    assert got == single  # nothing lost, nothing duplicated, same answers
    # the retried shard re-asked at most the batch in flight when it was killed
    assert asked_single <= asked_ray <= asked_single + 2 * 5


def test_ray_data_replicas_equal_single_process(local_ray, nota, tmp_path):
    """The Ray Data path (vLLM's: items streamed to one replica per GPU) checked on CPU with the
    reference backend, multi-sample included: same rows, and a rerun adds nothing."""
    from equipoise.evaluators.ray_exec import run_sweep_ray_data

    specs = [
        s.model_copy(update={"decoding": Decoding(n=3)}) if s.model == "calibrated" else s
        for s in _specs(nota, "reference", ["chance", "calibrated"])
    ]
    _single(specs, tmp_path / "single.duckdb")
    con = connect(tmp_path / "rd.duckdb")
    try:
        added = run_sweep_ray_data(
            plan_status(specs, con), con, tmp_path / "parts", replicas=2, progress=False
        )
        assert added == len(_rows(tmp_path / "single.duckdb", PRED_SQL))
        n_parts = len(part_dirs(tmp_path / "parts"))
        again = run_sweep_ray_data(
            plan_status(specs, con), con, tmp_path / "parts", replicas=2, progress=False
        )
        assert again == 0 and len(part_dirs(tmp_path / "parts")) == n_parts
    finally:
        con.close()
    for sql in (PRED_SQL, SCORE_SQL, "SELECT * FROM runs ORDER BY run_id"):
        assert _rows(tmp_path / "rd.duckdb", sql) == _rows(tmp_path / "single.duckdb", sql)
