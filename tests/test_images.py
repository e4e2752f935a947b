"""Images of VQA suites travel inside the dataset: built, hashed, validated, published and fetched.

A suite built from the GMAI-MMBench fixture must hold every image its rows name under
``images/<sha256>.<ext>``; the expected names are computed here straight from the TSV's base64 cells
(not through the adapter), so a wrong hash, a missing copy or an extra file all fail.  Publishing goes
through the local target and through the real huggingface_hub client against tests/fakehub.py (in a
subprocess, as in tests/test_publish.py, because the HF_* environment is read at import).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from equipoise.builders.dataset_writer import MANIFEST, sha256_file, write_manifest
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.builders.publish import (
    HUB_OWN_FILES,
    IntegrityError,
    PublishError,
    fetch_published,
    image_path,
    load_config,
    publish_to_local,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.builders.validate import validate_folder
from tests.fakehub import FakeHub, client_env

REPO_ROOT = Path(__file__).resolve().parent.parent
FIX = REPO_ROOT / "tests" / "fixtures" / "sources"
GMAI_TSV = FIX / "gmai_mmbench" / "GMAI_mm_bench_VAL.tsv"
REPO = "equipoise-test/vqa-nota"
SECRET = "hf_test_IMAGES456"


def expected_images() -> dict[str, bytes]:
    """{images/<sha256>.png: bytes} for every VAL row with two or more options, decoded independently."""
    out = {}
    with GMAI_TSV.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if sum(bool(row[c].strip()) for c in "ABCDE") < 2:
                continue  # the adapter skips these rows by design
            data = base64.b64decode(row["image"])
            assert data.startswith(b"\x89PNG")
            out[f"images/{hashlib.sha256(data).hexdigest()}.png"] = data
    return out


def rows_of(folder: Path) -> dict[str, list[dict]]:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    return {n: pq.read_table(folder / c["path"]).to_pylist() for n, c in manifest["configs"].items()}


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("vqa")
    source = f"gmai_mmbench:{GMAI_TSV}?images={base / 'cache'}"
    out: dict[str, Any] = {"cache": base / "cache", "source": source}
    for key in ("a", "b"):
        out[key] = base / key
        build_mcq_suite("nota", out[key], source=source, eval_split="val")
    return out


# ---------------------------------------------------------------------------------------------- build
def test_build_holds_every_image_and_is_byte_identical(built):
    a, b = built["a"], built["b"]
    want = expected_images()
    assert len(want) == 4
    manifest = json.loads((a / MANIFEST).read_text(encoding="utf-8"))
    listed = {k: v for k, v in manifest["files"].items() if k.startswith("images/")}
    # exactly the images of the kept rows, listed with the sha256 of their bytes, nothing else
    assert listed == {rel: hashlib.sha256(data).hexdigest() for rel, data in want.items()}
    on_disk = {k: v for k, v in files_under(a).items() if k.startswith("images/")}
    assert on_disk == want
    assert manifest["images"] == 4
    # every row of every config names one of those files, and every image is used
    named = {r["image"] for rows in rows_of(a).values() for r in rows}
    assert named == set(want)
    assert files_under(a) == files_under(b)  # byte-identical builds, images included
    rep = validate_folder(a)
    assert rep.ok, rep.problems
    assert any("every image an item names" in c for c in rep.checks)
    card = (a / "README.md").read_text(encoding="utf-8")
    assert "## Images" in card and "4 image file(s)" in card


def test_shuffle_rows_share_the_images_and_text_builds_have_none(built, tmp_path):
    out = tmp_path / "shuffle"
    build_mcq_suite("shuffle", out, source=built["source"], eval_split="val", n_shuffles=2)
    rows = rows_of(out)
    assert len(rows["shuffled"]) == 2 * len(rows["original"])
    # a permutation keeps its item's image
    by_base = {r["base_id"]: r["image"] for r in rows["original"]}
    assert all(r["image"] == by_base[r["base_id"]] for r in rows["shuffled"])
    assert {k for k in files_under(out) if k.startswith("images/")} == set(expected_images())
    assert validate_folder(out).ok
    # rebuilding a text-only suite into the same folder leaves no stale image behind
    m = build_mcq_suite("shuffle", out, n_shuffles=2)
    assert m["images"] == 0 and not (out / "images").exists()
    assert not [k for k in m["files"] if k.startswith("images/")]
    assert "## Images" not in (out / "README.md").read_text(encoding="utf-8")
    assert validate_folder(out).ok


def test_damaged_cache_and_missing_images_stop_the_build(built, tmp_path):
    cache = tmp_path / "cache"
    source = f"gmai_mmbench:{GMAI_TSV}?images={cache}"
    build_mcq_suite("nota", tmp_path / "ok", source=source, eval_split="val")
    victim = sorted((cache / "images").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF  # same size: the adapter keeps the cached file, the builder must notice
    victim.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=rf"{victim.name}.*does not hash to its name"):
        build_mcq_suite("nota", tmp_path / "bad", source=source, eval_split="val")
    assert not (tmp_path / "bad" / MANIFEST).exists()


def test_generic_image_column_is_copied_and_renamed(tmp_path):
    png = next(iter(expected_images().values()))
    src = tmp_path / "src"
    (src / "pics").mkdir(parents=True)
    (src / "pics" / "scan 1.png").write_bytes(png)
    lines = (FIX / "generic" / "questions.csv").read_text(encoding="utf-8").splitlines()
    table = [f"{lines[0]},picture"] + [f"{ln},pics/scan 1.png" for ln in lines[1:]]
    (src / "questions.csv").write_text("\n".join(table) + "\n", encoding="utf-8")
    mapping = (FIX / "generic" / "mapping.yaml").read_text(encoding="utf-8") + "image: picture\n"
    (src / "mapping.yaml").write_text(mapping, encoding="utf-8")
    spec = f"generic:{src / 'questions.csv'}?mapping={src / 'mapping.yaml'}"
    out = tmp_path / "out"
    build_mcq_suite("nota", out, source=spec)
    rel = f"images/{hashlib.sha256(png).hexdigest()}.png"
    assert {r["image"] for rows in rows_of(out).values() for r in rows} == {rel}
    assert (out / rel).read_bytes() == png and validate_folder(out).ok
    # a row naming a file that is not there fails the build, naming the item and the path
    (src / "pics" / "scan 1.png").unlink()
    missing = r"item demo_mcqa-g-00\d:original: image 'pics/scan 1.png' not found"
    with pytest.raises(SourceError, match=missing):
        build_mcq_suite("nota", tmp_path / "out2", source=spec)


# ---------------------------------------------------------------------------------------------- validate
def test_validate_names_missing_tampered_extra_and_unlisted_images(built, tmp_path):
    a = built["a"]
    names = sorted(p.name for p in (a / "images").iterdir())

    gone = shutil.copytree(a, tmp_path / "gone")
    (gone / "images" / names[0]).unlink()
    rep = validate_folder(gone)
    assert rep.problems == [f"{gone / 'images' / names[0]}: missing"]
    with pytest.raises(IntegrityError, match="missing"):
        publish_to_local(gone, tmp_path / "root", REPO, "v1.0.0")

    tampered = shutil.copytree(a, tmp_path / "tampered")
    data = bytearray((tampered / "images" / names[1]).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tampered / "images" / names[1]).write_bytes(bytes(data))
    rep = validate_folder(tampered)
    assert rep.problems == [f"{tampered / 'images' / names[1]}: sha256 mismatch (file changed or truncated)"]

    extra = shutil.copytree(a, tmp_path / "extra")
    stray = extra / "images" / f"{'0' * 64}.png"
    stray.write_bytes(b"\x89PNG\r\n\x1a\nnot listed")
    rep = validate_folder(extra)
    assert rep.problems == [f"{stray}: image file not listed in manifest.json (extra file)"]

    # an image dropped from the manifest and the folder together: the hashes agree, the rows do not
    unlisted = shutil.copytree(a, tmp_path / "unlisted")
    manifest = json.loads((unlisted / MANIFEST).read_text(encoding="utf-8"))
    del manifest["files"][f"images/{names[2]}"]
    write_manifest(unlisted, manifest)
    (unlisted / "images" / names[2]).unlink()
    rep = validate_folder(unlisted)
    n_configs = len(manifest["configs"])
    assert len(rep.problems) == n_configs  # one row per config names that image
    assert all(f"image 'images/{names[2]}' is not a file listed in manifest.json" in p for p in rep.problems)

    # a listed image whose name is not its own hash (renamed together with its manifest entry)
    renamed = shutil.copytree(a, tmp_path / "renamed")
    manifest = json.loads((renamed / MANIFEST).read_text(encoding="utf-8"))
    wrong = f"images/{'f' * 64}.png"
    manifest["files"][wrong] = manifest["files"].pop(f"images/{names[3]}")
    write_manifest(renamed, manifest)
    (renamed / "images" / names[3]).rename(renamed / wrong)
    rep = validate_folder(renamed)
    assert f"{renamed / wrong}: image is not named images/<its sha256>.<ext>" in rep.problems


def test_image_path_checks_what_it_returns(built, tmp_path):
    a = built["a"]
    rel = rows_of(a)["original"][0]["image"]
    assert image_path(a, rel).read_bytes() == expected_images()[rel]
    for bad in ("../manifest.json", "/etc/passwd", "images/../README.md"):
        with pytest.raises(PublishError, match="not a path inside the dataset"):
            image_path(a, bad)
    with pytest.raises(IntegrityError, match="not listed"):
        image_path(a, "README.md.png")
    copy = shutil.copytree(a, tmp_path / "copy")
    (copy / rel).write_bytes(b"\x89PNG\r\n\x1a\nother")
    with pytest.raises(IntegrityError, match="does not match"):
        image_path(copy, rel)
    assert image_path(copy, rel, verify=False) == copy / rel
    (copy / rel).unlink()
    with pytest.raises(IntegrityError, match="missing"):
        image_path(copy, rel)


# ---------------------------------------------------------------------------------------------- publish
def test_local_publish_and_load_bring_the_images(built, tmp_path):
    a = built["a"]
    res = publish_to_local(a, tmp_path / "root", REPO, "v1.0.0")
    dest = Path(res.path)
    want = expected_images()
    assert set(want) <= set(res.files)
    assert files_under(dest) == files_under(a)
    folder = fetch_published(f"{tmp_path / 'root' / REPO}@v1.0.0")
    assert folder == dest
    ds = load_config(folder, "minus_correct_plus_nota", cache_dir=tmp_path / "hf")
    assert ds.to_list() == rows_of(a)["minus_correct_plus_nota"]
    for row in ds:
        assert image_path(folder, row["image"]).read_bytes() == want[row["image"]]
    assert validate_folder(folder).ok


def _hub_session(spec_file: str) -> None:
    """Child process pointed at the fake Hub: publish, then read back the way a researcher would."""
    import datasets
    from huggingface_hub import HfApi, hf_hub_download

    from equipoise.builders.publish import publish_to_hub

    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    folder = Path(spec["folder"])
    res = publish_to_hub(folder, REPO, "v1.0.0")
    report: dict = {"result": res.model_dump()}
    report["tree"] = sorted(HfApi().list_repo_files(REPO, repo_type="dataset", revision="v1.0.0"))
    ds = datasets.load_dataset(REPO, "plus_nota", split="test", revision="v1.0.0")
    report["rows"] = ds.to_list()
    report["downloaded"] = {
        r["image"]: sha256_file(
            Path(hf_hub_download(REPO, r["image"], repo_type="dataset", revision="v1.0.0"))
        )
        for r in ds
    }
    fetched = fetch_published(f"{REPO}@v1.0.0")
    report["fetched_files"] = {k: hashlib.sha256(v).hexdigest() for k, v in files_under(fetched).items()}
    rep = validate_folder(fetched)
    report["validate"] = rep.problems
    report["image_path"] = {r["image"]: sha256_file(image_path(fetched, r["image"])) for r in report["rows"]}
    Path(spec["report"]).write_text(json.dumps(report), encoding="utf-8")


def test_hub_publish_and_fetch_bring_the_images(built, tmp_path):
    a = built["a"]
    spec = {"folder": str(a), "report": str(tmp_path / "report.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    hub = FakeHub(tmp_path / "server", token=SECRET)
    with hub:
        env = client_env(hub, tmp_path / "hf_home", SECRET)
        code = f"from tests.test_images import _hub_session as s; s({str(tmp_path / 'spec.json')!r})"
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert hub.unhandled == []
    rep = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    want = {rel: hashlib.sha256(data).hexdigest() for rel, data in expected_images().items()}
    local = {k: hashlib.sha256(v).hexdigest() for k, v in files_under(a).items()}
    assert rep["result"]["created"] and set(want) <= set(rep["result"]["files"])
    assert set(want) <= set(rep["tree"])
    assert rep["rows"] == rows_of(a)["plus_nota"]
    assert rep["downloaded"] == {r["image"]: want[r["image"]] for r in rep["rows"]}
    fetched = {k: v for k, v in rep["fetched_files"].items() if k not in HUB_OWN_FILES}  # the Hub's own
    assert fetched == local and rep["validate"] == []
    assert rep["image_path"] == rep["downloaded"]


# ---------------------------------------------------------------------------------------------- run
def test_run_sends_the_dataset_image_whatever_the_working_directory(built, tmp_path, monkeypatch):
    """Rows hold paths relative to the dataset folder; the runner resolves them there, so a run
    started from another directory still sends every image (as a data URL) to the model."""
    from equipoise.evaluators.backends.base import Decoding
    from equipoise.evaluators.backends.openai_backend import OpenAIBackend
    from equipoise.evaluators.runner import run
    from equipoise.evaluators.store import connect
    from tests.fakeopenai import FakeOpenAI, completion

    monkeypatch.setenv("EQUIPOISE_TEST_IMG_KEY", "sk-test")
    monkeypatch.chdir(tmp_path)  # not the dataset folder
    con = connect(tmp_path / "s.duckdb")
    with FakeOpenAI(lambda body: (200, completion("Answer: A"))) as fake:
        backend = OpenAIBackend("fake-model", base_url=fake.base_url, api_key_env="EQUIPOISE_TEST_IMG_KEY")
        summary = run(con, built["a"], "original", backend, decoding=Decoding(logprobs=False), progress=False)
        sent = [
            part["image_url"]["url"]
            for r in fake.requests
            for m in r["json"]["messages"]
            if isinstance(m["content"], list)
            for part in m["content"]
            if part["type"] == "image_url"
        ]
    errors = con.execute("SELECT count(*) FROM predictions WHERE outcome = 'error'").fetchall()[0][0]
    con.close()
    assert summary.written > 0 and errors == 0
    assert len(sent) == summary.written and all(u.startswith("data:image/png;base64,") for u in sent)
