"""Versioned publishing: a local target, and the real huggingface_hub client against tests/fakehub.py.

The Hub-path code runs in a subprocess: huggingface_hub and datasets read HF_ENDPOINT, HF_HUB_OFFLINE and
HF_HUB_DISABLE_XET once, at import, and this test process has already imported them offline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.dataset_writer import (
    MANIFEST,
    MANIFEST_DIGEST,
    sha256_file,
    verify_dataset,
    write_manifest,
)
from equipoise.builders.publish import (
    IntegrityError,
    PublishError,
    VersionExistsError,
    fetch_published,
    load_config,
    publish_to_local,
)
from tests.fakehub import FakeHub, client_env, find_in_tree

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO = "equipoise-test/clindet"
SECRET = "hf_test_SECRET123"
CONFIG = "complete"


def parquet_rows(folder: Path, config: str = CONFIG) -> list[dict]:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    return pq.read_table(folder / manifest["configs"][config]["path"]).to_pylist()


def tamper(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    target = dest / "data" / CONFIG / "test-00000-of-00001.parquet"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return dest


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("publish_src")
    out = {}
    for key, seed in (("v1", 0), ("v2", 1)):
        out[key] = base / key
        build_clindet(out[key], per_system=2, seed=seed, progress=False, systems=["chads2"])
    # the two builds must differ where the test looks, or the revision checks prove nothing
    assert parquet_rows(out["v1"]) != parquet_rows(out["v2"])
    return out


# ---------------------------------------------------------------------------- local target
def test_local_publish_loads_offline(folders, tmp_path):
    import datasets

    root = tmp_path / "published"
    res = publish_to_local(folders["v1"], root, REPO, "v1.0.0")
    dest = root / "equipoise-test" / "clindet" / "v1.0.0"
    assert res.created and res.target == "local" and Path(res.path) == dest
    assert res.files == sorted(str(p.relative_to(dest).as_posix()) for p in dest.rglob("*") if p.is_file())
    for rel in res.files:
        assert (dest / rel).read_bytes() == (folders["v1"] / rel).read_bytes()
    assert verify_dataset(dest) == []

    manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
    ds = datasets.load_dataset(str(dest), CONFIG, split="test", cache_dir=str(tmp_path / "cache"))
    assert ds.num_rows == manifest["configs"][CONFIG]["rows"]
    assert ds.to_list() == parquet_rows(folders["v1"])

    # an identical re-publish is a no-op; different bytes under the same version are refused
    before = {rel: (dest / rel).stat().st_mtime_ns for rel in res.files}
    again = publish_to_local(folders["v1"], root, REPO, "v1.0.0")
    assert not again.created and again.manifest_sha256 == res.manifest_sha256
    assert {rel: (dest / rel).stat().st_mtime_ns for rel in res.files} == before
    with pytest.raises(VersionExistsError, match="immutable"):
        publish_to_local(folders["v2"], root, REPO, "v1.0.0")
    assert sha256_file(dest / MANIFEST) == res.manifest_sha256
    assert publish_to_local(folders["v2"], root, REPO, "v1.1.0").created

    # DIR and DIR@VERSION both resolve to the version directory
    assert fetch_published(str(dest)) == dest
    assert fetch_published(f"{root / 'equipoise-test' / 'clindet'}@v1.0.0") == dest
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".staging")]


def test_load_config_does_not_mix_same_named_versions(folders, tmp_path):
    # two repos each with a v1.0.0: same folder basename, different bytes, one datasets cache
    a = publish_to_local(folders["v1"], tmp_path / "root", "org/a", "v1.0.0")
    b = publish_to_local(folders["v2"], tmp_path / "root", "org/b", "v1.0.0")
    cache = tmp_path / "cache"
    assert load_config(Path(a.path), CONFIG, cache_dir=cache).to_list() == parquet_rows(folders["v1"])
    assert load_config(Path(b.path), CONFIG, cache_dir=cache).to_list() == parquet_rows(folders["v2"])
    bad = tamper(folders["v1"], tmp_path / "tampered")
    with pytest.raises(IntegrityError):
        load_config(bad, CONFIG, cache_dir=cache)


def test_local_publish_refuses_bad_input(folders, tmp_path):
    bad = tamper(folders["v1"], tmp_path / "tampered")
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        publish_to_local(bad, tmp_path / "root", REPO, "v1.0.0")
    assert not (tmp_path / "root" / "equipoise-test" / "clindet" / "v1.0.0").exists()
    for version in ("1.0.0", "v1.0", "v01.0.0", "v1.0.0-rc1"):
        with pytest.raises(PublishError, match="vMAJOR"):
            publish_to_local(folders["v1"], tmp_path / "root", REPO, version)
    for repo_id in ("noslash", "a/b/c", "../x", "org/..", "org/name.git"):
        with pytest.raises(PublishError, match="ORG/NAME"):
            publish_to_local(folders["v1"], tmp_path / "root", repo_id, "v1.0.0")
    with pytest.raises(IntegrityError):
        fetch_published(str(bad))
    with pytest.raises(PublishError, match="neither a local dataset directory"):
        fetch_published(str(tmp_path / "no" / "such" / "dir"))


# ---------------------------------------------------------------------------- hub target (subprocess)
def _hub_client_session(spec_file: str, phase: str) -> None:
    """Runs in a child process whose HF_* environment points at the fake Hub (online phase) or has
    HF_HUB_OFFLINE=1 with the server stopped (offline phase); writes a JSON report."""
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    f = {k: Path(v) for k, v in spec["folders"].items()}
    report = _online_session(f) if phase == "online" else _offline_session(f)
    Path(spec[f"report_{phase}"]).write_text(json.dumps(report, indent=1), encoding="utf-8")


def _online_session(f: dict[str, Path]) -> dict:
    import datasets
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    from equipoise.builders.publish import publish_to_hub

    api = HfApi()
    report: dict = {}

    def refs() -> dict:
        r = api.list_repo_refs(REPO, repo_type="dataset")
        return {"tags": {t.name: t.target_commit for t in r.tags}, "main": r.branches[0].target_commit}

    def tree(rev: str) -> list[str]:
        return sorted(api.list_repo_files(REPO, repo_type="dataset", revision=rev))

    report["v1.0.0"] = publish_to_hub(f["v1"], REPO, "v1.0.0").model_dump()
    report["v1.1.0"] = publish_to_hub(f["v2"], REPO, "v1.1.0", commit_message="seed 1").model_dump()
    report["again"] = publish_to_hub(f["v1"], REPO, "v1.0.0").model_dump()

    before = refs()
    try:
        publish_to_hub(f["v2"], REPO, "v1.0.0")
        report["conflict"] = "published"
    except VersionExistsError as exc:
        report["conflict"] = str(exc)
    report["conflict_refs_unchanged"] = refs() == before
    try:
        publish_to_hub(f["tampered"], "equipoise-test/tampered", "v1.0.0")
        report["tampered"] = "published"
    except IntegrityError as exc:
        report["tampered"] = str(exc)
    try:
        publish_to_hub(f["v1"], "equipoise-test/other", "v1.0.0", token="hf_wrong_token")
        report["bad_token"] = "published"
    except HfHubHTTPError as exc:
        report["bad_token"] = exc.response.status_code

    # a file dropped from the folder is deleted in the next version's commit, not carried over
    report["v1.2.0"] = publish_to_hub(f["extra"], REPO, "v1.2.0").model_dump()
    report["v1.3.0"] = publish_to_hub(f["v2"], REPO, "v1.3.0").model_dump()
    report["trees"] = {rev: tree(rev) for rev in ("v1.1.0", "v1.2.0", "v1.3.0", "main")}
    report["refs"] = refs()

    for version, key in (("v1.0.0", "v1"), ("v1.1.0", "v2")):
        ds = datasets.load_dataset(REPO, CONFIG, split="test", revision=version)
        report[f"rows_{version}"] = ds.num_rows
        report[f"rows_match_{version}"] = ds.to_list() == parquet_rows(f[key])
    for version, key in (("v1.0.0", "v1"), ("v1.1.0", "v2")):
        path = fetch_published(f"{REPO}@{version}")
        report[f"fetched_{version}"] = str(path)
        report[f"fetched_manifest_same_{version}"] = (path / MANIFEST).read_bytes() == (
            f[key] / MANIFEST
        ).read_bytes()
    # leave a partial snapshot of v1.2.0 in the cache (as load_dataset does: only the files it needs)
    hf_hub_download(REPO, "README.md", repo_type="dataset", revision="v1.2.0")

    # an explicit endpoint= must be used for every request, whatever HF_ENDPOINT said at import time
    endpoint, constants.ENDPOINT = constants.ENDPOINT, "http://127.0.0.1:9"
    explicit = publish_to_hub(f["v1"], "equipoise-test/explicit", "v1.0.0", endpoint=endpoint)
    report["explicit"] = explicit.model_dump()
    report["explicit_fetched"] = str(fetch_published("equipoise-test/explicit@v1.0.0", endpoint=endpoint))
    return report


def _offline_session(f: dict[str, Path]) -> dict:
    import datasets

    report: dict = {}
    path = fetch_published(f"{REPO}@v1.0.0")
    report["offline_v1"] = str(path)
    report["offline_v1_manifest_same"] = (path / MANIFEST).read_bytes() == (f["v1"] / MANIFEST).read_bytes()
    try:
        fetch_published(f"{REPO}@v1.2.0")
        report["offline_partial"] = "accepted"
    except IntegrityError as exc:
        report["offline_partial"] = str(exc)
    # recorded, not asserted: datasets' own offline behaviour (ECOSYSTEM-NOTES: it ignores revision=)
    ds = datasets.load_dataset(REPO, CONFIG, split="test", revision="v1.0.0")
    report["offline_load_dataset_v1_rows_match"] = ds.to_list() == parquet_rows(f["v1"])
    return report


@pytest.fixture(scope="module")
def hub_run(folders, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("hub")
    extra = base / "extra"  # v2 plus one small text file listed in the manifest
    shutil.copytree(folders["v2"], extra)
    (extra / "notes").mkdir()
    (extra / "notes" / "errata.txt").write_text("nothing yet\n", encoding="utf-8")
    manifest = json.loads((extra / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"]["notes/errata.txt"] = sha256_file(extra / "notes" / "errata.txt")
    write_manifest(extra, manifest)
    spec = {
        "folders": {
            "v1": str(folders["v1"]),
            "v2": str(folders["v2"]),
            "extra": str(extra),
            "tampered": str(tamper(folders["v1"], base / "tampered")),
        },
        "report_online": str(base / "report_online.json"),
        "report_offline": str(base / "report_offline.json"),
    }
    (base / "spec.json").write_text(json.dumps(spec), encoding="utf-8")

    def child(phase: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        spec_file = str(base / "spec.json")
        code = f"from tests.test_publish import _hub_client_session as s; s({spec_file!r}, {phase!r})"
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        tail = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, f"{phase} session failed\n{tail}"
        return proc

    hub = FakeHub(base / "server", token=SECRET)
    with hub:
        env = client_env(hub, base / "hf_home", SECRET)
        online = child("online", env)
    assert hub._server is None  # the server is shut down once the client is done
    offline = child("offline", {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    report = json.loads(Path(spec["report_online"]).read_text(encoding="utf-8"))
    report.update(json.loads(Path(spec["report_offline"]).read_text(encoding="utf-8")))
    return {
        "report": report,
        "hub": hub,
        "base": base,
        "output": online.stdout + online.stderr + offline.stdout + offline.stderr,
    }


def test_hub_publish_is_one_tagged_commit_per_version(hub_run, folders):
    rep, hub = hub_run["report"], hub_run["hub"]
    assert hub.unhandled == []
    v1, v11 = rep["v1.0.0"], rep["v1.1.0"]
    assert v1["created"] and v11["created"] and v1["commit_oid"] != v11["commit_oid"]
    assert v1["url"].endswith(f"/datasets/{REPO}/tree/v1.0.0")
    assert v1["files"] == sorted(
        json.loads((folders["v1"] / MANIFEST).read_text())["files"].keys() | {MANIFEST, MANIFEST_DIGEST}
    )
    # one commit per publish: exactly one commit endpoint call per created version
    commits = [r for r in hub.requests if r[:2] == ("POST", f"/api/datasets/{REPO}/commit/main")]
    assert len(commits) == 4 and all(status == 200 for *_, status in commits)
    tags = rep["refs"]["tags"]
    assert tags == {v: rep[v]["commit_oid"] for v in ("v1.0.0", "v1.1.0", "v1.2.0", "v1.3.0")}
    assert rep["refs"]["main"] == rep["v1.3.0"]["commit_oid"]
    # an identical re-publish changes nothing and reports the existing commit
    assert not rep["again"]["created"] and rep["again"]["commit_oid"] == v1["commit_oid"]
    # the file dropped after v1.2.0 is gone from v1.3.0 but still in v1.2.0
    trees = rep["trees"]
    assert "notes/errata.txt" in trees["v1.2.0"] and "notes/errata.txt" not in trees["v1.3.0"]
    assert trees["v1.3.0"] == trees["v1.1.0"] == trees["main"]


def test_hub_revisions_load_their_own_rows(hub_run, folders):
    rep = hub_run["report"]
    for version, key in (("v1.0.0", "v1"), ("v1.1.0", "v2")):
        manifest = json.loads((folders[key] / MANIFEST).read_text(encoding="utf-8"))
        assert rep[f"rows_{version}"] == manifest["configs"][CONFIG]["rows"]
        assert rep[f"rows_match_{version}"], f"load_dataset(revision={version}) returned other rows"
        assert rep[f"fetched_manifest_same_{version}"]
        assert Path(rep[f"fetched_{version}"]).name == rep[version]["commit_oid"]


def test_hub_refuses_conflicts_tampering_and_bad_tokens(hub_run):
    rep, hub = hub_run["report"], hub_run["hub"]
    assert "already published" in rep["conflict"] and rep["conflict_refs_unchanged"]
    assert "sha256 mismatch" in rep["tampered"]
    assert not (hub.repos_dir / "datasets" / "equipoise-test" / "tampered.json").exists()
    assert rep["bad_token"] == 401 and hub.auth_failures == 1


def test_explicit_endpoint_wins_over_import_time_env(hub_run):
    rep = hub_run["report"]
    assert rep["explicit"]["created"] and rep["explicit"]["url"].startswith(hub_run["hub"].endpoint)
    assert Path(rep["explicit_fetched"]).name == rep["explicit"]["commit_oid"]


def test_offline_fetch_uses_the_tag_and_refuses_partial_snapshots(hub_run):
    rep = hub_run["report"]
    assert Path(rep["offline_v1"]).name == rep["v1.0.0"]["commit_oid"] and rep["offline_v1_manifest_same"]
    assert "missing manifest" in rep["offline_partial"] and "online" in rep["offline_partial"]


def test_token_is_never_written(hub_run, tmp_path):
    needle = SECRET.encode()
    assert needle not in hub_run["output"].encode()
    (tmp_path / "control.txt").write_bytes(b"x" + needle + b"y")
    assert find_in_tree(tmp_path, needle) == [tmp_path / "control.txt"]
    # server state (objects = published card/manifest/data, repo JSON, request log), the client's
    # caches and snapshots, the published folders and the report
    assert find_in_tree(hub_run["base"], needle) == []
    assert any((hub_run["base"] / "server" / "objects").iterdir())
