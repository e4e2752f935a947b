"""Build an MCQA suite into a versioned dataset folder (Parquet configs, card, manifest, images).

Images (VQA sources such as GMAI-MMBench) travel inside the dataset: every image an item references
is copied to ``images/<sha256>.<ext>`` in the output folder, the item's ``image`` column holds exactly
that path (relative to the dataset root), and ``manifest.json`` lists each image with its sha256 like
any other file, so the build stays byte-identical, ``validate`` notices a missing, extra or altered
image, and publishing uploads the images with the Parquet files.

Why a path string rather than a ``datasets.Image`` column: an Image column that works from the Hub
must embed the bytes in the Parquet (a path-only Image cell is opened relative to the reader's working
directory, not the repo), which stores every image once per config and variant (shuffle and
medabstain repeat each item many times), makes the row type differ from ``MCQItem.image: str`` (the
schema-derived Features, row re-validation and the evaluators' ``image`` request field), and ties
loading to Pillow.  A content-addressed file next to the Parquet is stored once, is hashed by the
manifest, and is opened with :func:`equipoise.builders.publish.image_path` (or ``hf_hub_download`` of
``row["image"]`` from the published repo).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from string import Template
from typing import Any

from equipoise import __version__
from equipoise.builders.calc_mcq import CALC_MCQ_VERSION, calc_mcq_items
from equipoise.builders.dataset_writer import (
    MANIFEST,
    ConfigData,
    DatasetSpec,
    sha256_file,
    write_dataset,
    write_manifest,
)
from equipoise.builders.publish import EXTERNAL_IMAGE, IMAGE_DIR, IMAGE_RE
from equipoise.builders.sources.mini import MINI_NAME, MINI_PATH, SourceError, content_revision, mini_items
from equipoise.builders.suites import MCQ_SUITES, SuiteOptions, SuiteResult
from equipoise.builders.transforms import TRANSFORM_VERSION
from equipoise.schemas.items import MCQItem
from equipoise.scoring_systems.loader import all_systems, definition_sha256

CARDS_DIR = Path(__file__).resolve().parent.parent / "cards"
ALL_SUITES = (*MCQ_SUITES, "calc-mcq")
SUMMARIES = {
    "medabstain": "MedAbstain design: NA / A / NAP / AP evaluation variants and four few-shot pools. "
    "AP is always NAP plus the abstain option, derived from the same recorded context removal.",
    "clear": "CLEAR design: k distractors with the gold answer or with the gold replaced by "
    "'None of the above' (NA), 'I don't know' (IDK) or 'I need assistance' (INA), plus NA+IDK and "
    "NA+INA answer spaces.",
    "nota": "NOTA stress tests: +nota (NOTA added as a distractor) and -correct+nota (gold replaced "
    "by NOTA), with the unperturbed baseline for flip analysis.",
    "shuffle": "Option shuffling: seeded permutations of every item's options; `option_id` keeps each "
    "option's identity so consistency and entropy are computed over identities, not letters.",
    "calc-mcq": "Scoring-system MCQs: 'which category applies?' from generated clinical cases; when "
    "the missing findings leave several categories reachable, the abstain option is the target, "
    "proved by exact enumeration.",
}


def load_source(spec: str) -> tuple[list[MCQItem], dict[str, str]]:
    """Resolve ``--source``; returns items and a {name, revision} record for the manifest."""
    if spec in ("bundled", MINI_NAME):
        return mini_items(), {"name": MINI_NAME, "revision": content_revision(MINI_PATH)}
    from equipoise.builders.sources import registry

    return registry.load(spec)


def build_mcq_suite(
    suite: str,
    out: Path,
    source: str = "bundled",
    seed: int = 0,
    context_removal: str = "span",
    remover: Any = None,
    max_k: int | None = None,
    n_shuffles: int = 4,
    per_system: int = 12,
    eval_split: str = "test",
    pool_split: str = "train",
) -> dict[str, Any]:
    if suite not in ALL_SUITES:
        raise KeyError(f"unknown suite '{suite}'; known: {', '.join(ALL_SUITES)}")
    if suite == "calc-mcq":
        systems = list(all_systems().values())
        configs = calc_mcq_items(systems, per_system, seed)
        result = SuiteResult(
            configs,
            {
                "complete": "every finding stated; the category is determined",
                "incomplete_determinable": "findings missing, yet every completion lands in one category",
                "incomplete_undeterminable": "findings missing and several categories reachable: "
                "the abstain option is the target",
            },
            eval_configs=list(configs),
        )
        src = {
            "name": "equipoise_scoring_systems",
            "revision": ",".join(f"{s.id}:{definition_sha256(s.id)[:12]}" for s in systems),
        }
        builder_version = CALC_MCQ_VERSION
    else:
        items, src = load_source(source)
        opts = SuiteOptions(
            seed=seed,
            context_removal=context_removal,
            remover=remover,
            max_k=max_k,
            n_shuffles=n_shuffles,
            eval_split=eval_split,
            pool_split=pool_split,
        )
        result = MCQ_SUITES[suite](items, opts)
        builder_version = TRANSFORM_VERSION
    result.configs, images = collect_images(result.configs, image_roots(src))
    names = list(result.configs)
    cfgs = [
        ConfigData(name, MCQItem, result.configs[name], result.descriptions.get(name, ""), default=i == 0)
        for i, name in enumerate(names)
    ]
    counts = {
        name: dict(sorted(Counter(it.target.role for it in rows).items()))
        for name, rows in result.configs.items()
    }
    manifest_extra = {
        "suite": suite,
        "builder": "equipoise.builders.suites",
        "builder_version": builder_version,
        "package_version": __version__,
        "seed": seed,
        "source": src,
        "context_removal": context_removal if suite == "medabstain" else None,
        "eval_split": eval_split if suite != "calc-mcq" else None,
        "pool_split": pool_split if suite == "medabstain" else None,
        "eval_configs": result.eval_configs,
        "pool_configs": result.pool_configs,
        "target_roles": counts,
        "failures": result.failures,
        "images": len(images),
    }
    spec = DatasetSpec(
        pretty_name=f"Equipoise {suite} suite",
        license="cc-by-4.0",
        configs=cfgs,
        manifest_extra=manifest_extra,
        card_body=_card(suite, src, seed, builder_version, cfgs, result.failures, len(images)),
        tags=["medical", "abstention", "multiple-choice", "equipoise", suite],
    )
    copy_images(out, images)
    manifest = write_dataset(out, spec)
    return add_manifest_files(out, sorted(images)) if images else manifest


def image_roots(src: dict[str, str]) -> list[Path]:
    """Folders a relative ``image`` is looked up in: the adapter's image cache (GMAI-MMBench records
    ``image_root``), then the folder of a local source (a generic table's image column)."""
    roots: list[Path] = []
    if src.get("image_root"):
        roots.append(Path(src["image_root"]))
    loc = Path(src["location"]).expanduser() if src.get("location") else None
    if loc is not None and loc.is_file():
        roots.append(loc.parent)
    elif loc is not None and loc.is_dir():
        roots.append(loc)
    return roots


def collect_images(
    configs: dict[str, list[MCQItem]], roots: list[Path]
) -> tuple[dict[str, list[MCQItem]], dict[str, Path]]:
    """Find every image the items reference and give it its content address ``images/<sha256>.<ext>``.

    Returns the configs with each ``image`` set to that address (unchanged for GMAI-MMBench items,
    whose cache already uses it) and {address: file to copy}.  A referenced file that cannot be found,
    is not an image, or sits under a content address its bytes do not match (a damaged cache) raises
    :class:`SourceError`: a dataset that references images it does not hold is never written.  URLs
    and ``data:`` URIs are left as they are (nothing to copy).
    """
    from equipoise.builders.sources.gmai_mmbench import image_extension

    address: dict[str, str] = {}
    files: dict[str, Path] = {}

    def locate(item: MCQItem, image: str) -> str:
        if image in address:
            return address[image]
        given = Path(image).expanduser()
        candidates = [given] if given.is_absolute() else [r / image for r in roots]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            where = ", ".join(str(r) for r in roots) or "no image folder (the source recorded none)"
            raise SourceError(f"item {item.item_id}: image {image!r} not found (looked in {where})")
        data = path.read_bytes()
        ext = image_extension(data)
        if ext is None:
            raise SourceError(f"item {item.item_id}: {path} is not a PNG, JPEG, GIF, BMP or WebP image")
        rel = f"{IMAGE_DIR}/{hashlib.sha256(data).hexdigest()}.{ext}"
        if IMAGE_RE.fullmatch(image) and image != rel:
            raise SourceError(
                f"item {item.item_id}: {path} does not hash to its name (damaged image cache); "
                "delete it and load the source again"
            )
        address[image] = rel
        files[rel] = path
        return rel

    out: dict[str, list[MCQItem]] = {}
    for name, rows in configs.items():
        new_rows = []
        for it in rows:
            if it.image is None or it.image.startswith(EXTERNAL_IMAGE):
                new_rows.append(it)
                continue
            rel = locate(it, it.image)
            new_rows.append(it if rel == it.image else it.model_copy(update={"image": rel}))
        out[name] = new_rows
    return out, dict(sorted(files.items()))


def copy_images(out: Path, images: dict[str, Path]) -> None:
    """Make ``out/images/`` hold exactly ``images`` (stale files from an earlier build are removed, so a
    rebuild into the same folder leaves no unlisted image behind)."""
    folder = out / IMAGE_DIR
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_file() and f"{IMAGE_DIR}/{p.name}" not in images:
                p.unlink()
    for rel, src in images.items():
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def add_manifest_files(out: Path, rels: list[str]) -> dict[str, Any]:
    """Add files written next to the dataset to ``manifest.json`` with their sha256 (same format as
    :func:`write_dataset`: sorted keys, two-space indent) and return the manifest.

    The digest is taken from the copied bytes; a file whose bytes do not match the content address in
    its name (changed while being copied) is refused."""
    mpath = out / MANIFEST
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    for rel in rels:
        digest = sha256_file(out / rel)
        m = IMAGE_RE.fullmatch(rel)
        if m and m.group(1) != digest:
            raise SourceError(f"{out / rel}: copied bytes do not match the content address {rel}")
        manifest["files"][rel] = digest
    manifest["files"] = dict(sorted(manifest["files"].items()))
    write_manifest(out, manifest)
    return manifest


def _card(
    suite: str,
    src: dict[str, str],
    seed: int,
    version: str,
    cfgs: list[ConfigData],
    failures: list[dict[str, str]],
    n_images: int = 0,
) -> str:
    table = "| config | rows | content |\n| --- | --- | --- |\n" + "\n".join(
        f"| `{c.name}` | {len(c.rows)} | {c.description} |" for c in cfgs
    )
    if failures:
        failure_text = (
            f"## Items not built\n\n{len(failures)} item(s) could not be transformed:\n\n"
            + "\n".join(f"- `{f['item']}` ({f['step']}): {f['reason']}" for f in failures[:50])
        )
    else:
        failure_text = "Every source item was transformed."
    image_text = (
        f"## Images\n\n{n_images} image file(s) are stored under `images/`, named by the sha256 of their\n"
        "bytes and listed in `manifest.json`. The `image` column holds the path of the item's image\n"
        "relative to the dataset root (the folder, or the repo at the same revision):\n\n"
        "```python\n"
        "from huggingface_hub import hf_hub_download\n\n"
        'path = hf_hub_download("ORG/NAME", ds[0]["image"], repo_type="dataset", revision="vX.Y.Z")\n'
        "# a local or fetched folder: equipoise.builders.publish.image_path(folder, ds[0]['image'])\n"
        "```\n\n"
        if n_images
        else ""
    )
    rev = src["revision"] if len(src["revision"]) < 80 else src["revision"][:77] + "..."
    return Template((CARDS_DIR / "mcqa.md").read_text(encoding="utf-8")).substitute(
        suite=suite,
        suite_summary=SUMMARIES[suite],
        source_name=src["name"],
        source_revision=rev,
        seed=seed,
        transform_version=version,
        package_version=__version__,
        first_config=cfgs[0].name,
        config_table=table,
        failure_text=failure_text,
        image_text=image_text,
        license="cc-by-4.0",
    )
