"""The calibration ``validation`` split: built from the source's validation items by each evaluation
config's own transforms (MedAbstain's release: its ``val_100_*`` files), counted in the card and the
build report, hashed by the manifest, byte-identical on rebuild and free of leakage; and the staged
write of ``clindet`` builds."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from equipoise.builders import clindet_suite
from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.dataset_writer import sha256_file, write_manifest
from equipoise.builders.mcq_build import BUILD_REPORT, BuildError, build_mcq_suite
from equipoise.builders.validate import validate_folder
from equipoise.cli import app
from equipoise.schemas.items import MCQItem
from tests.conftest import load_local
from tests.medabstain_release import ABSTAIN, TEST, VAL, write_release

FIX = Path(__file__).resolve().parent / "fixtures" / "sources"
MEDQA4 = f"medqa4:{FIX / 'medqa4'}"
VAL_FILE = "data/{}/validation-00000-of-00001.parquet"


def _text(result) -> str:
    return " ".join(result.output.split())


def _split(folder: Path, config: str, split: str) -> list[MCQItem]:
    return [MCQItem.model_validate(r) for r in load_local(folder, config, split)]


def test_release_validation_file_is_the_validation_split_of_na_and_a(tmp_path):
    rel = write_release(tmp_path / "release")
    out = tmp_path / "ds"
    r = CliRunner().invoke(app, ["build", "medabstain", "--source", f"medabstain:{rel}", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert validate_folder(out).ok, validate_folder(out).problems
    val_rows = json.loads((rel / "val_100_medqa_1_noabst.json").read_text())
    val_abst = {x["id"]: x for x in json.loads((rel / "val_100_medqa_1_randabst.json").read_text())}
    na = _split(out, "NA", "validation")
    assert [i.question for i in na] == [x["question"] for x in val_rows] == [v[0] for v in VAL]
    assert all(i.source.split == "validation" and not i.abstain_expected for i in na)
    a = _split(out, "A", "validation")
    assert len(a) == len(VAL)
    for item in a:  # the release's abstain choice at the letter of its val randabst file
        abst = [o for o in item.options if o.role == "abstain"]
        assert len(abst) == 1 and abst[0].text == ABSTAIN
        release = val_abst[int(item.source.source_id)]["choices"]
        assert abst[0].label == next(k for k, v in release.items() if v == ABSTAIN)
        assert item.target_label == val_abst[int(item.source.source_id)]["answer"]
    # the test split is untouched: every test item, no validation item
    assert len(_split(out, "NA", "test")) == len(TEST)
    # the release has no perturbed validation rows: NAP / AP get no validation split, and say why
    for name in ("NAP", "AP"):
        with pytest.raises(ValueError, match="validation"):
            load_local(out, name, "validation")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration_split"] == "validation"
    for name in ("NA", "A"):
        path = VAL_FILE.format(name)
        assert manifest["configs"][name]["splits"] == {"validation": {"rows": 2, "path": path}}
        assert manifest["files"][path] == sha256_file(out / path)
    assert "splits" not in manifest["configs"]["NAP"] and "splits" not in manifest["configs"]["pool_NA"]
    report = json.loads((out / BUILD_REPORT).read_text())["calibration"]
    assert report["source_items"] == 2 and report["split"] == "validation"
    assert report["configs"]["NA"] == {"items_in": 2, "items_out": 2, "rows": 2, "dropped": 0}
    assert report["configs"]["NAP"] == {"items_in": 2, "items_out": 0, "rows": 0, "dropped": 2}
    assert set(report["not_built"]) == {"NAP", "AP"}
    assert {d["item"] for d in report["dropped"]} == {
        "medabstain-validation-100",
        "medabstain-validation-101",
    }
    card = " ".join((out / "README.md").read_text().split())
    assert "`validation` split (calibration set)" in card
    assert "| `NA` | 2 | 2 | 2 | 0 |" in card and "| `NAP` | 2 | 0 | 0 | 2 |" in card
    assert "`NAP`, `AP`: no `validation` split, since 0 of 2 items have a usable edit" in card
    assert "the release has no perturbed validation rows" in card
    assert "validation" in _text(r)


def test_validation_edits_give_nap_and_ap_a_validation_split(tmp_path):
    """NAP / AP validation rows come from the same kind of edit as their test rows (here --edits)."""
    rel = write_release(tmp_path / "release", pools=False)
    edits = tmp_path / "edits.jsonl"
    rows = []
    for n, (q, *_rest) in enumerate(VAL):
        first = q.split(". ")[0] + "."
        rows.append(
            {
                "item_id": f"medabstain-validation-{100 + n}",
                "perturbed_question": q.replace(first, "").strip(),
                "removed_text": first,
            }
        )
    edits.write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = tmp_path / "ds"
    build_mcq_suite("medabstain", out, source=f"medabstain:{rel}", edits=edits)
    assert validate_folder(out).ok
    nap = _split(out, "NAP", "validation")
    assert [i.question for i in nap] == [x["perturbed_question"] for x in rows]
    assert all(i.abstain_expected for i in nap)
    ap = _split(out, "AP", "validation")
    a = {i.base_id: i for i in _split(out, "A", "validation")}
    for item, base in zip(ap, nap, strict=True):  # AP = NAP + the abstain option at A's letter
        assert item.question == base.question
        assert [o.option_id for o in item.options] == [o.option_id for o in a[item.base_id].options]
    report = json.loads((out / BUILD_REPORT).read_text())["calibration"]
    assert report["not_built"] == {}


def test_release_rebuild_with_validation_is_byte_identical(tmp_path):
    rel = write_release(tmp_path / "release")
    m1 = build_mcq_suite("medabstain", tmp_path / "a", source=f"medabstain:{rel}", seed=5)
    m2 = build_mcq_suite("medabstain", tmp_path / "b", source=f"medabstain:{rel}", seed=5)
    assert VAL_FILE.format("A") in m1["files"] and m1 == m2
    for p in m1["files"]:
        assert (tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes()


def test_calibration_items_that_are_test_items_are_left_out(tmp_path):
    rel = write_release(tmp_path / "release", pools=False)
    val = json.loads((rel / "val_100_medqa_1_noabst.json").read_text())
    test_row = json.loads((rel / "medqa_1_test_noabst.json").read_text())[0]
    val.append({**test_row, "id": 150})  # a test question again, under another id
    (rel / "val_100_medqa_1_noabst.json").write_text(json.dumps(val))
    (rel / "val_100_medqa_1_randabst.json").unlink()
    out = tmp_path / "ds"
    build_mcq_suite("medabstain", out, source=f"medabstain:{rel}")
    assert validate_folder(out).ok
    assert [i.source.source_id for i in _split(out, "NA", "validation")] == ["100", "101"]
    report = json.loads((out / BUILD_REPORT).read_text())["calibration"]
    leaked = [d for d in report["dropped"] if d["item"] == "medabstain-validation-150"]
    assert {d["config"] for d in leaked} == {"NA", "A", "NAP", "AP"}
    assert all("leakage" in d["reason"] for d in leaked)


def test_validate_reports_a_validation_row_that_is_a_test_item(tmp_path):
    rel = write_release(tmp_path / "release", pools=False)
    out = tmp_path / "ds"
    build_mcq_suite("medabstain", out, source=f"medabstain:{rel}")
    # put the test rows into NA's validation file, with hashes and counts made to match
    manifest = json.loads((out / "manifest.json").read_text())
    path = VAL_FILE.format("NA")
    pq.write_table(pq.read_table(out / manifest["configs"]["NA"]["path"]), out / path)
    manifest["files"][path] = sha256_file(out / path)
    manifest["configs"]["NA"]["splits"]["validation"]["rows"] = len(TEST)
    write_manifest(out, manifest)
    rep = validate_folder(out)
    assert not rep.ok
    assert any("validation item" in p and "leaks into the test or pool configs" in p for p in rep.problems)


def test_calibration_split_option_for_any_source(tmp_path):
    """--calibration-split names any other split; none builds none; an unknown or evaluated split is a
    one-line error listing the splits."""
    out = tmp_path / "nota"
    r = CliRunner().invoke(
        app, ["build", "nota", "--source", MEDQA4, "--calibration-split", "train", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert validate_folder(out).ok
    manifest = json.loads((out / "manifest.json").read_text())
    for name in manifest["eval_configs"]:
        rows = _split(out, name, "validation")
        assert rows and {i.source.split for i in rows} == {"train"}
    minus = _split(out, "minus_correct_plus_nota", "validation")
    assert all(o.role != "gold" for i in minus for o in i.options)  # the same transform as test
    out2 = tmp_path / "none"
    rel = write_release(tmp_path / "release", pools=False)
    build_mcq_suite("medabstain", out2, source=f"medabstain:{rel}", calibration_split="none")
    manifest = json.loads((out2 / "manifest.json").read_text())
    assert "calibration_split" not in manifest and all(
        "splits" not in c for c in manifest["configs"].values()
    )
    assert "calibration" not in json.loads((out2 / BUILD_REPORT).read_text())
    for bad, needle in (("nope", "no such split"), ("test", "also the --eval-split")):
        out3 = tmp_path / f"bad-{bad}"
        r = CliRunner().invoke(
            app, ["build", "nota", "--source", MEDQA4, "--calibration-split", bad, "--out", str(out3)]
        )
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert f"--calibration-split '{bad}'" in _text(r) and needle in _text(r)
        assert not out3.exists()
    with_pools = write_release(tmp_path / "release2")
    with pytest.raises(BuildError, match="also the --pool-split"):
        build_mcq_suite(
            "medabstain", tmp_path / "x", source=f"medabstain:{with_pools}", calibration_split="train"
        )


def test_bundled_builds_have_no_validation_split(tmp_path):
    """The bundled source has no validation split: 'auto' leaves its builds as they were."""
    m = build_mcq_suite("medabstain", tmp_path / "m", seed=1)
    assert "calibration_split" not in m and all("splits" not in c for c in m["configs"].values())


def test_clindet_build_is_staged(tmp_path, monkeypatch):
    out = tmp_path / "clindet"
    build_clindet(out, per_system=2, seed=1, systems=["chads2"], progress=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def broken(folder: Path, spec):
        (folder / "README.md").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(clindet_suite, "write_dataset", broken)
    with pytest.raises(OSError):
        build_clindet(out, per_system=2, seed=2, systems=["chads2"], progress=False)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    fresh = tmp_path / "new" / "clindet"
    r = CliRunner().invoke(
        app, ["build", "clindet", "--per-system", "2", "--system", "chads2", "--out", str(fresh)]
    )
    assert r.exit_code == 2 and "No space left on device" in _text(r) and "Traceback" not in r.output
    assert not (tmp_path / "new").exists()  # no half-written folder, no staging folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clindet"]
    monkeypatch.undo()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    r = CliRunner().invoke(
        app, ["build", "clindet", "--per-system", "2", "--system", "chads2", "--out", str(other)]
    )
    assert r.exit_code == 2 and "not a dataset folder" in _text(r)
    assert [p.name for p in other.iterdir()] == ["mine.txt"]
    # a rebuild over an earlier clindet dataset replaces it
    build_clindet(out, per_system=2, seed=2, systems=["chads2"], progress=False)
    assert validate_folder(out).ok
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
