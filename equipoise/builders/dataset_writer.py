"""Write a versioned dataset folder: Parquet configs, a dataset card and a hash manifest.

The folder is exactly what the Hub stores for a Parquet dataset (README.md with a ``configs:`` block
plus data files), so ``datasets.load_dataset(DIR, CONFIG)`` reads it offline and publishing is an
upload of the same files.  Nothing time-dependent is written, so two builds with the same inputs and
seed are byte-identical (the manifest lists a sha256 per file to prove it).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel

from equipoise.schemas.features import to_table

MANIFEST = "manifest.json"
# The manifest cannot list its own hash, so its digest sits beside it in ``sha256sum`` format
# (``sha256sum -c manifest.sha256`` checks it too): a change to any byte of either file makes the
# two disagree, so every single-byte corruption of a published version is detectable from the
# folder alone, including a letter of a free-text field the other checks never read.
MANIFEST_DIGEST = "manifest.sha256"
_DIGEST_LINE = re.compile(r"([0-9a-f]{64})  manifest\.json\n")


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` (sorted keys, two-space indent) and its digest file."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / MANIFEST).write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    (out / MANIFEST_DIGEST).write_text(f"{digest}  {MANIFEST}\n", encoding="utf-8")


def manifest_digest_problems(folder: Path) -> list[str]:
    """Problems with ``manifest.sha256``: missing, malformed, or not the manifest's digest."""
    dpath = folder / MANIFEST_DIGEST
    if not dpath.is_file():
        return [f"{dpath}: missing (the sha256 of manifest.json; rebuild the version to write it)"]
    raw = dpath.read_bytes()
    m = _DIGEST_LINE.fullmatch(raw.decode("ascii", errors="replace"))
    if m is None:
        return [f"{dpath}: malformed (expected '<64 hex digits>  manifest.json' and a newline)"]
    if (folder / MANIFEST).is_file() and m.group(1) != sha256_file(folder / MANIFEST):
        # which of the two changed cannot be told apart, so the problem names both
        return [f"{folder / MANIFEST}: sha256 differs from the one in {dpath} (one of the two files changed)"]
    return []


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class ConfigData:
    """One ``datasets`` config: a name, a row model and its validated rows (one 'test' split)."""

    name: str
    model: type[BaseModel]
    rows: list[BaseModel]
    description: str = ""
    default: bool = False
    # further splits served from files of other configs: {split: path}.  MedAbstain's few-shot pools
    # are their own configs (pool_NA, ...) and also the 'train' split of the variant they serve, so
    # load_dataset(DIR, "AP", split="train") finds them where the datasets convention puts them,
    # without storing the rows twice.
    extra_splits: dict[str, str] = field(default_factory=dict)
    # further splits with rows of their own: {split: rows}.  A calibration ('validation') split is
    # built from other source items by the config's own transforms, so it is written as a file of
    # this config (data/NAME/SPLIT-00000-of-00001.parquet) and hashed like the test file.
    split_rows: dict[str, list[BaseModel]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.split_path("test")

    def split_path(self, split: str) -> str:
        return f"data/{self.name}/{split}-00000-of-00001.parquet"

    def all_split_paths(self) -> dict[str, str]:
        """Every split of the config and its file (own files and those served from other configs)."""
        own = {s: self.split_path(s) for s in self.split_rows}
        return {"test": self.path, **dict(sorted({**own, **self.extra_splits}.items()))}


@dataclass
class DatasetSpec:
    pretty_name: str
    license: str
    configs: list[ConfigData]
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    card_body: str = ""
    tags: list[str] = field(default_factory=list)


def _write_parquet(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # fixed writer options: no statistics drift, one row group, deterministic bytes
    pq.write_table(
        table,
        path,
        compression="zstd",
        row_group_size=max(1, table.num_rows),
        write_statistics=True,
        store_schema=True,
    )


def card_yaml(spec: DatasetSpec) -> str:
    meta: dict[str, Any] = {
        "pretty_name": spec.pretty_name,
        "license": spec.license,
        "language": ["en"],
        "task_categories": ["question-answering", "text-classification"],
        "tags": spec.tags,
        "configs": [
            {
                "config_name": c.name,
                "data_files": [{"split": s, "path": p} for s, p in c.all_split_paths().items()],
                **({"default": True} if c.default else {}),
            }
            for c in spec.configs
        ],
    }
    return yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)


def write_dataset(out: Path, spec: DatasetSpec) -> dict[str, Any]:
    """Write data files, README.md and manifest.json under ``out``; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    configs: dict[str, Any] = {}
    for c in spec.configs:
        table = to_table(c.model, c.rows)
        _write_parquet(table, out / c.path)
        files[c.path] = sha256_file(out / c.path)
        configs[c.name] = {"rows": table.num_rows, "path": c.path, "description": c.description}
        if c.split_rows:  # only then, so builds without such splits keep their bytes
            configs[c.name]["splits"] = {}
            for split, rows in sorted(c.split_rows.items()):
                rel = c.split_path(split)
                split_table = to_table(c.model, rows)
                _write_parquet(split_table, out / rel)
                files[rel] = sha256_file(out / rel)
                configs[c.name]["splits"][split] = {"rows": split_table.num_rows, "path": rel}
    readme = f"---\n{card_yaml(spec)}---\n\n{spec.card_body.strip()}\n"
    (out / "README.md").write_text(readme, encoding="utf-8")
    files["README.md"] = sha256_file(out / "README.md")
    manifest = {
        "format": "equipoise-dataset/1",
        "pretty_name": spec.pretty_name,
        "configs": configs,
        **spec.manifest_extra,
        "files": dict(sorted(files.items())),
    }
    write_manifest(out, manifest)
    return manifest


def verify_dataset(folder: Path) -> list[str]:
    """Problems found by re-hashing every file the manifest lists (empty list = intact)."""
    mpath = folder / MANIFEST
    if not mpath.exists():
        return [f"{mpath}: missing manifest"]
    problems = manifest_digest_problems(folder)
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return [*problems, f"{mpath}: not valid JSON ({exc})"]
    shape = _manifest_shape_problems(folder, manifest)
    if shape:  # without a usable file list there is nothing to check the files against
        return [*problems, *(f"{mpath}: {p}" for p in shape)]
    for rel, digest in manifest["files"].items():
        p = folder / rel
        if not p.exists():
            problems.append(f"{p}: missing")
        elif sha256_file(p) != digest:
            problems.append(f"{p}: sha256 mismatch (file changed or truncated)")
    return problems


def _manifest_shape_problems(folder: Path, manifest: Any) -> list[str]:
    """What makes a manifest unusable for checking: a damaged key or value here (say ``"files"``
    spelled differently) would otherwise turn every hash check into no check at all."""
    if not isinstance(manifest, dict):
        return ["top level must be a JSON object"]
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return ["field 'files' must map each file of the dataset to its sha256"]
    problems = [
        f"field 'files.{rel}': {digest!r} is not a sha256"
        for rel, digest in files.items()
        if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest))
    ]
    configs = manifest.get("configs")
    if not isinstance(configs, dict) or not configs:
        return [*problems, "field 'configs' must name at least one config"]
    for name, info in configs.items():
        path = info.get("path") if isinstance(info, dict) else None
        if not isinstance(path, str) or path not in files:
            problems.append(f"field 'configs.{name}.path': {path!r} is not a file listed in 'files'")
        rows = info.get("rows") if isinstance(info, dict) else None
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            problems.append(f"field 'configs.{name}.rows': {rows!r} is not a row count")
        splits = info.get("splits", {}) if isinstance(info, dict) else {}
        if not isinstance(splits, dict):
            problems.append(f"field 'configs.{name}.splits': {splits!r} is not a mapping of splits")
            continue
        for split, sinfo in splits.items():
            spath = sinfo.get("path") if isinstance(sinfo, dict) else None
            if not isinstance(spath, str) or spath not in files:
                problems.append(
                    f"field 'configs.{name}.splits.{split}.path': {spath!r} is not a file listed in 'files'"
                )
    for key in ("eval_configs", "pool_configs"):
        names = manifest.get(key)
        if names is not None and (not isinstance(names, list) or not set(names) <= set(configs)):
            problems.append(f"field '{key}': {names!r} names a config not in 'configs'")
    if (folder / "README.md").exists() and "README.md" not in files:
        problems.append("field 'files': the dataset card README.md is not listed")
    return problems
