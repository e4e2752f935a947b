"""``validate`` catches single-byte damage to every file of a published dataset, naming the file.

A small MCQ suite is built from the bundled source. For each file the manifest lists (the Parquet
configs and the card), 30 byte positions spread over the file, first and last byte included, are
damaged one at a time in two ways (one bit flipped; the byte replaced by another value), plus a file
one byte shorter and one byte longer; each time ``validate_folder`` must fail with a problem naming
that file, and after the file is restored the folder validates again.

``manifest.json`` cannot list its own hash; its sha256 sits beside it in ``manifest.sha256``, so a
change to any byte of either file makes the two disagree. Both are damaged at every byte position
(``verify_dataset``, the hashing check) and at spread positions through the full ``validate``, which
must never crash and must name the damaged file; damage to what the other checks rely on (the file
list and its digests, config paths and row counts) is also reported for what it is.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from equipoise.builders.dataset_writer import MANIFEST, MANIFEST_DIGEST, verify_dataset, write_manifest
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.builders.validate import validate_folder
from equipoise.cli import app

POSITIONS = 30


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("validate") / "nota"
    build_mcq_suite("nota", folder, seed=1)
    assert validate_folder(folder).ok
    return folder


def _listed(folder: Path) -> list[str]:
    """Every file of the version: what the manifest lists, the manifest and its digest."""
    return sorted(
        [*json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"], MANIFEST, MANIFEST_DIGEST]
    )


def spread(n: int, k: int = POSITIONS) -> list[int]:
    """k positions spread evenly over 0..n-1, first and last included."""
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def damages(data: bytes, pos: int) -> Iterator[tuple[str, bytes]]:
    """Both single-byte damages at ``pos``: one bit flipped, and the byte replaced."""
    flipped = bytearray(data)
    flipped[pos] ^= 1 << (pos % 8)
    yield f"flip bit {pos % 8} at {pos}", bytes(flipped)
    replaced = bytearray(data)
    new = (data[pos] + 1 + pos % 251) % 256
    replaced[pos] = new if new != data[pos] else (new + 1) % 256
    yield f"byte {data[pos]:#04x}->{replaced[pos]:#04x} at {pos}", bytes(replaced)


@contextmanager
def damaged(path: Path, data: bytes) -> Iterator[None]:
    original = path.read_bytes()
    path.write_bytes(data)
    try:
        yield
    finally:
        path.write_bytes(original)


def test_positions_are_spread_and_include_both_ends():
    got = spread(1000)
    assert got[0] == 0 and got[-1] == 999 and len(got) == POSITIONS
    assert spread(5) == [0, 1, 2, 3, 4]


def test_every_listed_file_catches_single_byte_damage(dataset: Path) -> None:
    listed = _listed(dataset)
    assert any(r.endswith(".parquet") for r in listed) and "README.md" in listed and MANIFEST in listed
    checked = 0
    for rel in listed:
        path = dataset / rel
        data = path.read_bytes()
        cases = [(what, bad) for pos in spread(len(data)) for what, bad in damages(data, pos)]
        cases += [("last byte removed", data[:-1]), ("one byte appended", data + b"\n")]
        for what, bad in cases:
            assert bad != data
            with damaged(path, bad):
                rep = validate_folder(dataset)
            assert not rep.ok, f"{rel}: {what} went unnoticed"
            assert any(str(path) in p for p in rep.problems), f"{rel}: {what}: {rep.problems}"
            checked += 1
        assert validate_folder(dataset).ok, f"{rel} not restored"
    assert checked == sum(2 * len(spread((dataset / r).stat().st_size)) + 2 for r in listed)


def test_cli_validate_names_the_damaged_file(dataset: Path) -> None:
    for rel in _listed(dataset):
        path = dataset / rel
        data = path.read_bytes()
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0x10
        with damaged(path, bytes(bad)):
            res = CliRunner().invoke(app, ["validate", str(dataset)])
        assert res.exit_code == 2, res.output
        assert rel.split("/")[-1] in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["validate", str(dataset)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("name", [MANIFEST, MANIFEST_DIGEST])
def test_every_byte_of_the_manifest_and_its_digest_is_guarded(dataset: Path, name: str) -> None:
    """Exhaustive: both single-byte damages at every position, one byte less and one byte more."""
    path = dataset / name
    data = path.read_bytes()
    n = 0
    for pos in range(len(data)):
        for what, bad in [*damages(data, pos), ("truncated", data[:pos])]:
            with damaged(path, bad):
                problems = verify_dataset(dataset)
            assert any(str(path) in p for p in problems), f"{name}: {what} unnoticed: {problems}"
            n += 1
    with damaged(path, data + b" "):
        assert verify_dataset(dataset)
    assert n == 3 * len(data) and not verify_dataset(dataset)


def test_manifest_damage_never_crashes_validate(dataset: Path) -> None:
    """Through the whole validate (not just the hashing): never a crash, always a problem naming the
    manifest. Which check reports it first does not matter; the edits below show that the checks of
    the file list and config fields still speak when the digest has been recomputed to match."""
    manifest = dataset / MANIFEST
    data = manifest.read_bytes()
    for pos in spread(len(data), 120):
        for what, bad in damages(data, pos):
            with damaged(manifest, bad):
                rep = validate_folder(dataset)  # must not raise, whatever the damage
            assert not rep.ok and any(str(manifest) in p for p in rep.problems), (what, rep.problems)
    assert validate_folder(dataset).ok


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.pop("files"), "field 'files'"),
        (lambda m: m.__setitem__("filez", m.pop("files")), "field 'files'"),
        (lambda m: m["files"].pop("README.md"), "README.md is not listed"),
        (lambda m: m["configs"]["original"].pop("path"), "configs.original.path"),
        (lambda m: m["configs"]["original"].__setitem__("rows", "100"), "configs.original.rows"),
        (lambda m: m["eval_configs"].append("nope"), "eval_configs"),
    ],
    ids=["no_files", "renamed_files", "card_unlisted", "no_path", "rows_text", "unknown_eval"],
)
def test_manifest_edits_that_would_disable_checks_are_reported(dataset, tmp_path, edit, needle) -> None:
    """A manifest whose file list is gone or inconsistent used to validate (nothing to hash) or crash
    (a missing key); each is now one problem naming manifest.json and the field."""
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    m = json.loads((ds / MANIFEST).read_text(encoding="utf-8"))
    edit(m)
    write_manifest(ds, m)  # a consistent digest: only the field checks can object
    rep = validate_folder(ds)
    assert not rep.ok and any(str(ds / MANIFEST) in p and needle in p for p in rep.problems), rep.problems


def test_manifest_with_bad_utf8_is_a_problem_not_a_crash(dataset, tmp_path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    data = bytearray((ds / MANIFEST).read_bytes())
    data[len(data) // 2] = 0xFF
    (ds / MANIFEST).write_bytes(bytes(data))
    rep = validate_folder(ds)
    assert not rep.ok and str(ds / MANIFEST) in rep.problems[0]
