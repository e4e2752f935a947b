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

import contextlib
import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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
from equipoise.builders.edits import ImportedEdit, read_edits, sha256_hex
from equipoise.builders.publish import EXTERNAL_IMAGE, IMAGE_DIR, IMAGE_RE
from equipoise.builders.sources.base import Loaded
from equipoise.builders.sources.mini import MINI_NAME, MINI_PATH, SourceError, content_revision, mini_items
from equipoise.builders.suites import (
    ABSTAIN_POSITIONS,
    MCQ_SUITES,
    MEDABSTAIN_EVAL,
    MEDABSTAIN_POOLS,
    SuiteOptions,
    SuiteResult,
)
from equipoise.builders.transforms import TRANSFORM_VERSION
from equipoise.schemas.items import ABSTAIN_TEXT, MCQItem
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


BUILD_REPORT = "build_report.json"
AUTO = "auto"
CALIBRATION = "validation"  # the split name the calibration rows are published under
# MedAbstain's Appendix C pairing of pools and variants (the same as evaluators.fewshot's, which is
# downstream of the builders and so not imported here)
POOL_FOR_VARIANT = {"NA": "pool_NA", "A": "pool_A", "NAP": "pool_P-NA", "AP": "pool_P-RandAbst"}


class BuildError(SourceError):
    """A build that cannot give what was asked: an unknown split or config, or a requested config that
    would be empty.  The message names the config or option, the count, the reason and the fix."""


def load_source(spec: str) -> Loaded:
    """Resolve ``--source``: items, a {name, revision, ...} record for the manifest, and whatever else
    the source carries (imported edits, abstain positions, notes)."""
    if spec in ("bundled", MINI_NAME):
        return Loaded(mini_items(), {"name": MINI_NAME, "revision": content_revision(MINI_PATH)})
    from equipoise.builders.sources import registry

    return registry.load_full(spec)


def _edits_for(items: list[MCQItem], path: Path) -> dict[str, ImportedEdit]:
    """``--edits FILE`` keyed by base id: a row's ``item_id`` names an item by base id or, when that
    is unambiguous, by its source id."""
    by_base = {i.base_id: i.base_id for i in items}
    by_source: dict[str, list[str]] = {}
    for i in items:
        by_source.setdefault(i.source.source_id, []).append(i.base_id)
    out: dict[str, ImportedEdit] = {}
    for er, edit in read_edits(path):
        base = by_base.get(er.item_id)
        if base is None:
            found = by_source.get(er.item_id, [])
            if len(found) > 1:
                raise BuildError(
                    f"{path}: row {edit.row}: field 'item_id': source id {er.item_id!r} names "
                    f"{len(found)} items ({', '.join(found[:3])}); use the item id instead"
                )
            if not found:
                raise BuildError(
                    f"{path}: row {edit.row}: field 'item_id': no source item has id {er.item_id!r} "
                    f"(ids look like {next(iter(by_base), '?')!r})"
                )
            base = found[0]
        if base in out:
            raise BuildError(f"{path}: row {edit.row}: field 'item_id': {base!r} already has an edit")
        out[base] = edit
    return out


def _check_split(option: str, split: str, splits: dict[str, int], fix: str) -> None:
    if split not in splits:
        have = ", ".join(f"{s} ({n} items)" for s, n in sorted(splits.items()))
        raise BuildError(f"{option} {split!r}: the source has no such split (splits: {have}); {fix}")


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
    configs: list[str] | None = None,
    edits: Path | None = None,
    abstain_text: str | None = None,
    abstain_position: str | None = None,
    pool_size: int | None = None,
    pool_perturbed_share: float = 0.5,
    calibration_split: str | None = AUTO,
) -> dict[str, Any]:
    """Build ``suite`` into ``out`` and return its manifest.

    ``calibration_split`` names a source split whose items become a ``validation`` split of every
    evaluation config, built by the same transforms (a calibration set for conformal metrics):
    ``"auto"`` takes the source's ``validation`` split when it has one that is neither the evaluated
    nor the pool split, ``None`` builds none.

    Nothing is silently empty: an unknown split, an unknown config name or a requested config with no
    rows raises :class:`BuildError` before anything is written, naming the fix.  The dataset is
    written into a hidden sibling folder and renamed into place only when complete, so a failed build
    leaves no half-written ``out`` (and an earlier build there stays as it was)."""
    if suite not in ALL_SUITES:
        raise KeyError(f"unknown suite '{suite}'; known: {', '.join(ALL_SUITES)}")
    notes: list[str] = []
    n_source = 0
    splits: dict[str, int] = {}
    cal_split: str | None = None
    calibration: Calibration | None = None
    if suite == "calc-mcq":
        systems = list(all_systems().values())
        built = calc_mcq_items(systems, per_system, seed)
        result = SuiteResult(
            built,
            {
                "complete": "every finding stated; the category is determined",
                "incomplete_determinable": "findings missing, yet every completion lands in one category",
                "incomplete_undeterminable": "findings missing and several categories reachable: "
                "the abstain option is the target",
            },
            eval_configs=list(built),
        )
        src = {
            "name": "equipoise_scoring_systems",
            "revision": ",".join(f"{s.id}:{definition_sha256(s.id)[:12]}" for s in systems),
        }
        builder_version = CALC_MCQ_VERSION
    else:
        loaded = load_source(source)
        items, src = loaded.items, loaded.record
        notes.extend(loaded.notes)
        n_source = len(items)
        splits = dict(Counter(i.source.split for i in items))
        _check_split("--eval-split", eval_split, splits, "name one of them with --eval-split")
        if suite == "medabstain" and configs:
            unknown = [c for c in configs if c not in (*MEDABSTAIN_EVAL, *MEDABSTAIN_POOLS)]
            if unknown:
                raise BuildError(
                    f"--configs: unknown config(s) {', '.join(unknown)} for medabstain; known: "
                    f"{', '.join((*MEDABSTAIN_EVAL, *MEDABSTAIN_POOLS))}"
                )
        wanted = list(configs) if configs else None
        if suite == "medabstain" and pool_split not in splits:
            asked_pools = [c for c in (configs or MEDABSTAIN_POOLS) if c in MEDABSTAIN_POOLS]
            if asked_pools and not configs and loaded.pools_optional:
                wanted = list(MEDABSTAIN_EVAL)
                notes.append(
                    f"no few-shot pools: the source has no {pool_split!r} split "
                    "(its pool files are absent), so pool_* configs were not built"
                )
            elif asked_pools:
                _check_split(
                    "--pool-split",
                    pool_split,
                    splits,
                    "name one with --pool-split, or build without pools: --configs NA,A,NAP,AP",
                )
        cal_split = _calibration_split(calibration_split, splits, eval_split, pool_split, suite)
        if suite == "medabstain" and context_removal not in ("span", "llm"):
            raise BuildError(f"--context-removal {context_removal!r}: use span or llm")
        edit_map = dict(loaded.edits)
        if edits is not None:
            edit_map.update(_edits_for(items, edits))
            src = {**src, "edits": f"{edits.name} (sha256:{sha256_hex(edits)[:12]})"}
        position = abstain_position or ("source" if loaded.abstain_positions else "random")
        if position not in ABSTAIN_POSITIONS:
            raise BuildError(f"--abstain-position {position!r}: use one of {', '.join(ABSTAIN_POSITIONS)}")
        if pool_size is not None and pool_size < 1:
            raise BuildError(f"--pool-size {pool_size}: must be at least 1")
        if not 0.0 <= pool_perturbed_share <= 1.0:
            raise BuildError(f"--pool-perturbed-share {pool_perturbed_share}: must be between 0 and 1")
        opts = SuiteOptions(
            seed=seed,
            context_removal=context_removal,
            remover=remover,
            max_k=max_k,
            n_shuffles=n_shuffles,
            eval_split=eval_split,
            pool_split=pool_split,
            configs=wanted,
            edits=edit_map,
            abstain_text=abstain_text if abstain_text is not None else loaded.abstain_text,
            abstain_position=position,
            abstain_positions=loaded.abstain_positions,
            pool_size=pool_size,
            pool_perturbed_share=pool_perturbed_share,
        )
        result = MCQ_SUITES[suite](items, opts)
        builder_version = TRANSFORM_VERSION
    result = _select(result, configs, suite)
    _refuse_empty(result)
    if cal_split is not None:
        calibration = build_calibration(suite, items, opts, result, cal_split)
        notes.extend(calibration.notes)
    result.configs, images = collect_images(result.configs, image_roots(src))
    names = list(result.configs)
    cal_rows: dict[str, list[MCQItem]] = {}
    if calibration is not None:
        # images of the calibration rows are collected like the test rows' (same content addresses)
        cal_rows, cal_images = collect_images(calibration.configs, image_roots(src))
        images = dict(sorted({**images, **cal_images}.items()))
    cfgs = [
        ConfigData(
            name,
            MCQItem,
            result.configs[name],
            result.descriptions.get(name, ""),
            default=i == 0,
            split_rows={CALIBRATION: cal_rows[name]} if cal_rows.get(name) else {},
        )
        for i, name in enumerate(names)
    ]
    if suite == "medabstain":  # each pool is also the 'train' split of the variant it serves
        path_of = {c.name: c.path for c in cfgs}
        for c in cfgs:
            pool = POOL_FOR_VARIANT.get(c.name)
            if pool in path_of:
                c.extra_splits = {"train": path_of[pool]}
    counts = {
        name: dict(sorted(Counter(it.target.role for it in rows).items()))
        for name, rows in result.configs.items()
    }
    report = _build_report(result, n_source, splits, eval_split, pool_split, suite, notes, calibration)
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
        **({"calibration_split": cal_split} if cal_split is not None else {}),
        "eval_configs": result.eval_configs,
        "pool_configs": result.pool_configs,
        "target_roles": counts,
        "failures": result.failures,
        "images": len(images),
        "build_report": BUILD_REPORT,
        "notes": notes,
    }
    if suite == "medabstain":
        manifest_extra["abstain"] = {
            "text": opts.abstain_text or ABSTAIN_TEXT["Abstain"],
            "position": opts.abstain_position,
            "pool_size": pool_size,
            "pool_perturbed_share": pool_perturbed_share,
        }
    spec = DatasetSpec(
        pretty_name=f"Equipoise {suite} suite",
        license="cc-by-4.0",
        configs=cfgs,
        manifest_extra=manifest_extra,
        card_body=_card(suite, src, seed, builder_version, cfgs, result.failures, len(images), report),
        tags=["medical", "abstention", "multiple-choice", "equipoise", suite],
    )
    with staged(out) as tmp:
        copy_images(tmp, images)
        write_dataset(tmp, spec)
        (tmp / BUILD_REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        manifest = add_manifest_files(tmp, [*sorted(images), BUILD_REPORT])
    return manifest


def _calibration_split(
    asked: str | None, splits: dict[str, int], eval_split: str, pool_split: str, suite: str
) -> str | None:
    """The source split to build the ``validation`` split from, or None.

    ``auto`` takes ``validation`` when the source has it and it is neither evaluated nor the pool
    split (so builds from sources without one keep their bytes); a named split must exist and be
    distinct from both, since calibrating on the evaluated items would leak."""
    used = {eval_split: "--eval-split"}
    if suite == "medabstain":
        used.setdefault(pool_split, "--pool-split")
    if asked is None or asked.lower() in ("", "none"):
        return None
    if asked == AUTO:
        return CALIBRATION if CALIBRATION in splits and CALIBRATION not in used else None
    _check_split("--calibration-split", asked, splits, "name one of them, or --calibration-split none")
    if asked in used:
        raise BuildError(
            f"--calibration-split {asked!r}: is also the {used[asked]} split; calibrating on those items "
            "would leak them, so name another split or --calibration-split none"
        )
    return asked


@dataclass
class Calibration:
    """The ``validation`` rows of each evaluation config and what became of each calibration item."""

    split: str
    items_in: int
    configs: dict[str, list[MCQItem]]  # only configs with rows
    counts: dict[str, dict[str, int]]
    dropped: list[dict[str, str]]
    not_built: dict[str, str]  # config -> why it has no validation split
    notes: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "source_split": self.split,
            "split": CALIBRATION,
            "source_items": self.items_in,
            "configs": self.counts,
            "dropped": self.dropped,
            "not_built": dict(sorted(self.not_built.items())),
        }


def build_calibration(
    suite: str, items: list[MCQItem], opts: SuiteOptions, result: SuiteResult, split: str
) -> Calibration:
    """Build the evaluation configs of ``result`` once more from the items of ``split``, by the same
    recipe and options (the same transforms, seed, edits, abstain text and position).

    A calibration item whose id or source question is also an evaluated or pool item is left out
    (with its reason), so the calibration set never leaks into what it calibrates.  A config that
    gets no rows (MedAbstain's NAP/AP when no calibration item has an edit or a key fact) gets no
    ``validation`` split: that is said in the notes, the card and the build report, and is no error,
    since the test split is what was asked to be complete."""
    from equipoise.builders.validate import source_question

    taken = {opts.eval_split, *([opts.pool_split] if suite == "medabstain" else [])}
    other = [i for i in items if i.source.split in taken]
    taken_ids = {i.base_id for i in other}
    taken_q = {source_question(i) for i in other}
    cal = [i for i in items if i.source.split == split]
    leaked = [i for i in cal if i.base_id in taken_ids or source_question(i) in taken_q]
    leaked_ids = {i.base_id for i in leaked}
    clean = [i for i in cal if i.base_id not in leaked_ids]
    names = list(result.eval_configs)
    cres = MCQ_SUITES[suite](clean, replace(opts, eval_split=split, configs=names, pool_size=None))
    counts: dict[str, dict[str, int]] = {}
    dropped = [
        {"config": name, "item": i.base_id, "reason": f"also a {'/'.join(sorted(taken))} item (leakage)"}
        for name in names
        for i in leaked
    ]
    configs: dict[str, list[MCQItem]] = {}
    not_built: dict[str, str] = {}
    for name in names:
        rows = cres.configs.get(name, [])
        drops = [d for d in cres.dropped if d["config"] == name]
        dropped += drops
        if rows:
            configs[name] = rows
        elif name in cres.empty_reasons:
            not_built[name] = cres.empty_reasons[name][0]
        else:
            not_built[name] = f"0 of {len(clean)} {split!r} items could be built for {name}"
        counts[name] = {
            "items_in": len(cal),
            "items_out": len({r.base_id for r in rows}),
            "rows": len(rows),
            "dropped": len(cal) - len({r.base_id for r in rows}),
        }
    notes = []
    built = [n for n in names if n in configs]
    if built:
        notes.append(
            f"calibration: the source's {split!r} split ({len(cal)} items) is the `{CALIBRATION}` split of "
            f"{', '.join(built)}"
        )
    groups: dict[str, list[str]] = {}
    for name, why in not_built.items():
        groups.setdefault(why, []).append(name)
    for why, cs in groups.items():
        notes.append(f"calibration: {', '.join(cs)} have no `{CALIBRATION}` split: {why}")
    if leaked:
        notes.append(
            f"calibration: {len(leaked)} {split!r} item(s) are also evaluated or pool items and were left out"
        )
    return Calibration(split, len(cal), configs, counts, dropped, not_built, notes)


def _calibration_text(cal: dict[str, Any]) -> list[str]:
    """The card's statement of the calibration split (the same numbers as build_report.json)."""
    lines = [
        f"### `{CALIBRATION}` split (calibration set)",
        "",
        f"{cal['source_items']} items of the source's `{cal['source_split']}` split, transformed exactly as "
        f'the `test` split, for calibrating conformal metrics (`split="{CALIBRATION}"`); none is an '
        "evaluated or pool item.",
        "",
        "| config | items in | items out | rows | dropped |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, c in cal["configs"].items():
        lines.append(f"| `{name}` | {c['items_in']} | {c['items_out']} | {c['rows']} | {c['dropped']} |")
    groups: dict[str, list[str]] = {}
    for name in cal["configs"]:  # the suite's order
        if name in cal["not_built"]:
            groups.setdefault(cal["not_built"][name], []).append(f"`{name}`")
    for why, names in groups.items():
        lines += ["", f"{', '.join(names)}: no `{CALIBRATION}` split, since {why}."]
    return lines


def _select(result: SuiteResult, configs: list[str] | None, suite: str) -> SuiteResult:
    """Keep the configs asked for with ``--configs`` (in the suite's order); unknown names raise."""
    if not configs:
        return result
    unknown = [c for c in configs if c not in result.configs]
    if unknown:
        raise BuildError(
            f"--configs: unknown or unbuilt config(s) {', '.join(unknown)} for {suite}; "
            f"this build has: {', '.join(result.configs)}"
        )
    keep = [c for c in result.configs if c in configs]
    result.configs = {c: result.configs[c] for c in keep}
    result.eval_configs = [c for c in result.eval_configs if c in keep]
    result.pool_configs = [c for c in result.pool_configs if c in keep]
    result.dropped = [d for d in result.dropped if d["config"] in keep]
    result.items_in = {c: n for c, n in result.items_in.items() if c in keep}
    return result


def _refuse_empty(result: SuiteResult) -> None:
    """Raise naming every empty config (grouped by reason), the count and the fix; suggest the
    ``--configs`` subset that would build."""
    empty = [c for c, rows in result.configs.items() if not rows]
    if not empty:
        return
    full = [c for c, rows in result.configs.items() if rows]
    groups: dict[tuple[str, str], list[str]] = {}
    for c in empty:
        reason, fix = result.empty_reasons.get(
            c, (f"0 of {result.items_in.get(c, 0)} items could be built", "check the source and --eval-split")
        )
        groups.setdefault((reason, fix), []).append(c)
    subset = f", or --configs {','.join(full)}" if full else ""
    raise BuildError(
        "; ".join(f"{', '.join(cs)}: {reason}; {fix}{subset}" for (reason, fix), cs in groups.items())
    )


def _build_report(
    result: SuiteResult,
    n_source: int,
    splits: dict[str, int],
    eval_split: str,
    pool_split: str,
    suite: str,
    notes: list[str],
    calibration: Calibration | None = None,
) -> dict[str, Any]:
    """Items in and out per config and every dropped item with its reason (written next to the
    manifest and hashed by it, so the counts the card states can be checked); with a calibration
    split, the same for its ``validation`` rows under ``calibration``."""
    per_config = {}
    for name, rows in result.configs.items():
        n_in = result.items_in.get(name)
        per_config[name] = {
            "items_in": n_in,
            "items_out": len({r.base_id for r in rows}),
            "rows": len(rows),
            "dropped": sum(d["config"] == name for d in result.dropped),
        }
    cal_report: dict[str, Any] = {}
    if calibration is not None:
        cal_report = {"calibration": calibration.report()}
    return {
        **cal_report,
        "suite": suite,
        "source_items": n_source,
        "source_splits": dict(sorted(splits.items())),
        "eval_split": eval_split if suite != "calc-mcq" else None,
        "pool_split": pool_split if suite == "medabstain" else None,
        "configs": per_config,
        "dropped": result.dropped,
        "notes": notes,
    }


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """Yield a fresh hidden sibling folder to write into; on success it replaces ``out``, on any
    error it is removed (with any parent folder this call created), so ``out`` is either the old
    dataset or the complete new one.  A non-empty ``out`` that is not a dataset folder is refused."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BuildError(f"{out}: exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise BuildError(f"{out}: not empty and not a dataset folder (no {MANIFEST}); choose another --out")
    created = next((p for p in reversed([out.parent, *out.parent.parents]) if not p.exists()), None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            old = out.parent / f".{out.name}.replaced-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


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
    report: dict[str, Any] | None = None,
) -> str:
    table = "| config | rows | content |\n| --- | --- | --- |\n" + "\n".join(
        f"| `{c.name}` | {len(c.rows)} | {c.description} |" for c in cfgs
    )
    if failures:
        failure_text = (
            f"## Items not transformed\n\n{len(failures)} item(s) could not be transformed; they are left\n"
            "out of the configs that need the transform (counted above) and kept in the others:\n\n"
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
    counts_text = _counts_text(report) if report else ""
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
        counts_text=counts_text,
        pool_text=_pool_text(cfgs),
        image_text=image_text,
        license="cc-by-4.0",
    )


def _counts_text(report: dict[str, Any]) -> str:
    """The card's statement of the build's counts (the same numbers as build_report.json)."""
    lines = ["## Build counts", ""]
    if report["source_items"]:
        split_text = ", ".join(f"`{s}` {n}" for s, n in report["source_splits"].items())
        lines.append(f"{report['source_items']} source items read ({split_text}).")
        lines.append("")
    lines += ["| config | items in | items out | rows | dropped |", "| --- | --- | --- | --- | --- |"]
    for name, c in report["configs"].items():
        n_in = "-" if c["items_in"] is None else c["items_in"]
        lines.append(f"| `{name}` | {n_in} | {c['items_out']} | {c['rows']} | {c['dropped']} |")
    lines += ["", f"Each dropped item is listed with its reason in `{BUILD_REPORT}`."]
    if "calibration" in report:
        lines += ["", *_calibration_text(report["calibration"])]
    for note in report["notes"]:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n\n"


def _pool_text(cfgs: list[ConfigData]) -> str:
    served = [(c.name, c.extra_splits["train"]) for c in cfgs if "train" in c.extra_splits]
    if not served:
        return ""
    pairs = ", ".join(f"`{name}`: `{path.split('/')[1]}`" for name, path in served)
    return (
        "\nEach few-shot pool is also the `train` split of the variant it pairs with, read from the pool\n"
        f"config's own file ({pairs}):\n\n"
        "```python\n"
        f'pool = load_dataset("PATH_OR_REPO", "{served[-1][0]}", split="train")\n'
        "```\n"
    )
