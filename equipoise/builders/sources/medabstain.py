"""MedAbstain's own release: the folder of JSON files it published (MedQA test items and its edits).

Layout (file names as released; ``DS`` is the source tag, ``medqa_1`` for the MedQA release)::

    DS_test_noabst.json / DS_test_randabst.json               plain test items (NA; A's abstain option)
    perturbed_DS_test_noabst.json / ..._randabst.json         the same items with key context removed
    val_N_DS_noabst.json / ..._randabst.json                  N validation items
    few_shot_pool_DS_train_*.json                             few-shot pool items (often absent)
    perturbed_blended_few_shot_pool_DS_train_*.json           the pool, part of it perturbed

Every file is a JSON list of ``{"id": int, "source": str, "question": str, "choices": {"A": str, ...},
"answer": "A"}``; ``randabst`` files add the release's abstain choice at a random letter, and the
perturbed files add ``original_question`` and ``meta: {key_information, gold_context, reason}`` with
``question`` holding the perturbed text.

How it maps (``--source medabstain:DIR_OR_FILE``):

- test items come from the plain ``noabst`` file (or, missing that, the ``randabst`` file without its
  abstain choice): NA, and A with the abstain option at the letter the release put it (its
  ``randabst`` file) in the release's words, unless ``--abstain-position`` / ``--abstain-text`` say
  otherwise;
- the perturbed ``noabst`` file becomes **imported edits** (file, sha256, row, and the release's
  ``gold_context``, ``key_information`` and ``reason`` kept in each row's provenance), so NAP carries
  the release's perturbed questions; AP is NAP plus the abstain option from the same edit.  The
  release's own AP text (its perturbed ``randabst`` file) differs from its NAP text for some items;
  this build does not use it, so NAP and AP differ in exactly one factor, and the count of such items
  is stated in the card;
- the validation file becomes the source's ``validation`` split, which a build publishes as the
  ``validation`` split of NA and A (a calibration set for conformal metrics; the abstain option at
  the letter of the release's ``val_*_randabst`` file).  The release has no perturbed validation rows,
  so NAP and AP get a ``validation`` split only for items that ``--edits`` or an LLM removal perturbs;
- the pool files become the ``train`` split, and the perturbed rows of the blended pool become edits
  of those items.  Copies of the release often lack the pool files: the build then goes on without
  pools and says so.

Query keys: ``config=DS`` picks the source tag when a folder holds files of several, ``splits=``
and ``bad_rows=skip`` as for every kind.

The files are read with :mod:`json`, not ``datasets``: the ``choices`` mappings have a different set of
letters per file (A-E, or A-F with the abstain choice), which ``datasets`` would merge into one struct
padded with nulls, hiding exactly the row shape the checks here are about.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from equipoise.builders.edits import ImportedEdit, normalise, sha256_hex
from equipoise.builders.sources.base import (
    Loaded,
    SourceKind,
    SourceSpec,
    register,
    sha256_files,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import LETTERS, MCQItem, Option, SourceRef

RELEASE_ABSTAIN_TEXT = "I am unable to answer this question for certain reasons."
PRODUCER = "MedAbstain release"
# (role, pattern) in the order names are tried: the longer prefixes first
FILE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("pool_perturbed", re.compile(r"^perturbed_blended_few_shot_pool_(?P<ds>.+)_train_(?P<v>[a-z]+)\.json$")),
    ("pool", re.compile(r"^few_shot_pool_(?P<ds>.+)_train_(?P<v>[a-z]+)\.json$")),
    ("perturbed", re.compile(r"^perturbed_(?P<ds>.+)_test_(?P<v>[a-z]+)\.json$")),
    ("val", re.compile(r"^val_\d+_(?P<ds>.+)_(?P<v>[a-z]+)\.json$")),
    ("plain", re.compile(r"^(?P<ds>.+)_test_(?P<v>[a-z]+)\.json$")),
)


class ReleaseMeta(BaseModel):
    """``meta`` of a perturbed row: what was judged key, the removed context and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key_information: str | list[str] | None = None
    gold_context: str | None = None
    reason: str | None = None


class ReleaseRow(BaseModel):
    """One row of any release file (fields the release adds beyond these are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: int | str
    source: str | None = None
    question: str = Field(min_length=1)
    choices: dict[str, str] = Field(min_length=2)
    answer: str = Field(min_length=1)
    original_question: str | None = None
    meta: ReleaseMeta | None = None


@dataclass
class _File:
    path: Path
    role: str
    variant: str  # 'noabst', or a variant with the abstain choice ('randabst', ...)
    rows: list[tuple[int, ReleaseRow]] = field(default_factory=list)  # (1-based row, row)


def classify(name: str) -> tuple[str, str, str] | None:
    """(role, DS, variant) of a release file name; None for any other file."""
    for role, pat in FILE_PATTERNS:
        m = pat.match(name)
        if m:
            return role, m.group("ds"), m.group("v")
    return None


def _read(path: Path, role: str, variant: str, bad: list[str], skip: bool) -> _File:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    if not isinstance(raw, list):
        raise SourceError(f"{path}: expected a JSON list of rows, got a JSON {type(raw).__name__}")
    f = _File(path, role, variant)
    for n, obj in enumerate(raw, start=1):
        try:
            f.rows.append((n, ReleaseRow.model_validate(obj)))
        except ValidationError as exc:
            e = exc.errors()[0]
            loc = ".".join(str(p) for p in e["loc"]) or "<row>"
            _bad(f"{path}: row {n}: field '{loc}': {e['msg']}", bad, skip)
    return f


def _bad(message: str, bad: list[str], skip: bool) -> None:
    if not skip:
        raise SourceError(message)
    bad.append(message)


def _options(f: _File, n: int, row: ReleaseRow) -> tuple[list[str], int, int | None]:
    """Option texts without the release's abstain choice, the gold's index among them, and the
    abstain choice's index among all choices (None when the row has none)."""
    letters = list(row.choices)
    if letters != list(LETTERS[: len(letters)]):
        raise SourceError(
            f"{f.path}: row {n}: field 'choices': letters {letters} are not A, B, C, ... in order"
        )
    texts = [t.strip() for t in row.choices.values()]
    if not all(texts):
        raise SourceError(f"{f.path}: row {n}: field 'choices': an empty choice")
    abstain = [k for k, t in enumerate(texts) if normalise(t) == normalise(RELEASE_ABSTAIN_TEXT)]
    if len(abstain) > 1:
        raise SourceError(
            f"{f.path}: row {n}: field 'choices': the abstain choice appears {len(abstain)} times"
        )
    answer = row.answer.strip().upper()
    if answer not in letters:
        raise SourceError(
            f"{f.path}: row {n}: field 'answer': {row.answer!r} is not among the choices {letters}"
        )
    gold = letters.index(answer)
    if abstain and gold == abstain[0]:
        raise SourceError(f"{f.path}: row {n}: field 'answer': names the abstain choice, not an answer")
    pos = abstain[0] if abstain else None
    kept = [t for k, t in enumerate(texts) if k != pos]
    return kept, gold - (1 if pos is not None and gold > pos else 0), pos


def _item(f: _File, n: int, row: ReleaseRow, ds: str, split: str, revision: str, question: str) -> MCQItem:
    texts, gold, _ = _options(f, n, row)
    base = f"medabstain-{split}-{row.id}"
    return MCQItem(
        item_id=base,
        base_id=base,
        source=SourceRef(dataset=f"medabstain_{ds}", split=split, source_id=str(row.id), revision=revision),
        question=question.strip(),
        options=[
            Option(label=LETTERS[k], text=t, role="gold" if k == gold else "distractor", option_id=f"src:{k}")
            for k, t in enumerate(texts)
        ],
        target_label=LETTERS[gold],
    )


def _find_files(spec: SourceSpec) -> tuple[list[tuple[Path, str, str, str]], Path | None]:
    loc = Path(spec.location).expanduser()
    if loc.is_file():
        got = classify(loc.name)
        if got is None:
            raise SourceError(
                f"{loc}: not a MedAbstain release file name (e.g. medqa_1_test_noabst.json, "
                "perturbed_medqa_1_test_noabst.json, val_100_medqa_1_noabst.json)"
            )
        return [(loc, *got)], None
    if not loc.is_dir():
        raise SourceError(f"{loc}: no such file or folder (medabstain sources are local release copies)")
    found = [
        (p, *c)
        for p in sorted(loc.rglob("*.json"))
        if not any(part.startswith(".") for part in p.relative_to(loc).parts) and (c := classify(p.name))
    ]
    if not found:
        raise SourceError(f"{loc}: no MedAbstain release files (e.g. medqa_1_test_noabst.json) in the folder")
    return found, loc


def load_medabstain(spec: SourceSpec) -> Loaded:
    found, root = _find_files(spec)
    tags = sorted({ds for _, _, ds, _ in found})
    want = spec.params.get("config")
    if want:
        if want not in tags:
            raise SourceError(
                f"{spec.location}: no release files for config {want!r} (found: {', '.join(tags)})"
            )
        tags = [want]
    if len(tags) > 1:
        raise SourceError(
            f"{spec.location}: files of several sources ({', '.join(tags)}); pick one with ?config=NAME"
        )
    ds = tags[0]
    found = [f for f in found if f[2] == ds]
    by_role: dict[str, dict[str, Path]] = {}
    for path, role, _, variant in found:
        if variant in by_role.setdefault(role, {}):
            raise SourceError(f"{path}: a second {role} file for {variant!r} ({by_role[role][variant]})")
        by_role[role][variant] = path
    revision = spec.revision or sha256_files([f[0] for f in found], root)
    skip = spec.params.get("bad_rows", "raise") == "skip"
    bad: list[str] = []
    notes: list[str] = []

    def pick(role: str) -> _File | None:
        """The file of a role: the ``noabst`` one, else any variant (its abstain choice is dropped)."""
        files = by_role.get(role, {})
        if not files:
            return None
        variant = "noabst" if "noabst" in files else sorted(files)[0]
        return _read(files[variant], role, variant, bad, skip)

    def abst_file(role: str) -> _File | None:
        files = by_role.get(role, {})
        variant = next((v for v in sorted(files) if v != "noabst"), None)
        return None if variant is None else _read(files[variant], role, variant, bad, skip)

    items: list[MCQItem] = []
    seen: dict[str, str] = {}
    test: dict[str, MCQItem] = {}
    pert = pick("perturbed")
    plain = pick("plain")

    def add(f: _File, split: str, use_original: bool = False) -> dict[str, MCQItem]:
        out: dict[str, MCQItem] = {}
        for n, row in f.rows:
            question = row.original_question if use_original and row.original_question else row.question
            try:
                it = _item(f, n, row, ds, split, revision, question)
            except SourceError as exc:
                _bad(str(exc), bad, skip)
                continue
            except ValidationError as exc:
                _bad(f"{f.path}: row {n}: field 'choices': {exc.errors()[0]['msg']}", bad, skip)
                continue
            if it.base_id in seen:
                raise SourceError(
                    f"{f.path}: row {n}: field 'id': duplicate id {row.id!r} ({seen[it.base_id]})"
                )
            seen[it.base_id] = f"{f.path.name} row {n}"
            out[it.base_id] = it
            items.append(it)
        return out

    if plain is not None:
        test = add(plain, "test")
    elif pert is not None:  # only the perturbed file: NA from its original questions
        if any(not r.original_question for _, r in pert.rows):
            raise SourceError(
                f"{pert.path}: rows lack 'original_question', so the unperturbed items are unknown"
            )
        test = add(pert, "test", use_original=True)
        notes.append(
            f"the test items were taken from {pert.path.name} ('original_question'); no plain test file"
        )
    val = pick("val")
    validation = add(val, "validation") if val is not None else {}
    if val is not None:
        notes.append(
            f"the release has no perturbed validation rows: of the {len(validation)} validation items of "
            f"{val.path.name}, NAP and AP can hold only those that --edits FILE or --context-removal llm "
            "perturb"
        )
    pool = pick("pool")
    train = add(pool, "train") if pool is not None else {}
    if pool is None:
        notes.append(
            "the source has no few-shot pool files (few_shot_pool_*_train_*.json), so no pool_* configs "
            "are built from it"
        )
    if not test and val is None and pool is None:
        raise SourceError(f"{spec.location}: no test, validation or pool file of the release was found")

    # the release's abstain option: its letter per test (validation) item, from the plain (val)
    # randabst file
    positions: dict[str, int] = {}
    abst = abst_file("plain")
    for af, split, of_items, of_name in (
        (abst, "test", test, _plain_name(plain)),
        (abst_file("val") if val is not None else None, "validation", validation, _plain_name(val)),
    ):
        if af is None:
            continue
        for n, row in af.rows:
            base = f"medabstain-{split}-{row.id}"
            if base not in of_items:
                _bad(
                    f"{af.path}: row {n}: field 'id': {row.id!r} is not a {split} item of {of_name}",
                    bad,
                    skip,
                )
                continue
            texts, _, pos = _options(af, n, row)
            if pos is None:
                _bad(f"{af.path}: row {n}: field 'choices': no '{RELEASE_ABSTAIN_TEXT}' choice", bad, skip)
                continue
            if texts != [o.text for o in of_items[base].options]:
                _bad(
                    f"{af.path}: row {n}: field 'choices': differ from the {split} item's choices", bad, skip
                )
                continue
            positions[base] = pos

    # the release's edits: NAP from its perturbed noabst file, pools from its blended pool
    edits: dict[str, ImportedEdit] = {}
    if pert is not None:
        edits.update(_edits(pert, test, "test", bad, skip))
    bpool = pick("pool_perturbed")
    if bpool is not None:
        perturbed_rows = _File(
            bpool.path,
            bpool.role,
            bpool.variant,
            [
                (n, r)
                for n, r in bpool.rows
                if r.original_question and normalise(r.original_question) != normalise(r.question)
            ],
        )
        pool_edits = _edits(perturbed_rows, train, "train", bad, skip, strict=False)
        edits.update(pool_edits)
        if pool is not None and len(pool_edits) < len(perturbed_rows.rows):
            notes.append(
                f"{len(perturbed_rows.rows) - len(pool_edits)} perturbed row(s) of {bpool.path.name} "
                "name no item of the pool file and were not used"
            )
    ap = abst_file("perturbed")
    if ap is not None and pert is not None:
        nap_text = {str(r.id): normalise(r.question) for _, r in pert.rows}
        differ = sum(
            1 for _, r in ap.rows if str(r.id) in nap_text and normalise(r.question) != nap_text[str(r.id)]
        )
        notes.append(
            f"the release's own AP questions ({ap.path.name}) differ from its NAP questions in {differ} of "
            f"{len(ap.rows)} items; AP here is always the NAP question ({pert.path.name}) plus the abstain "
            "option, so NAP and AP differ in exactly one factor"
        )
    wanted = spec.list_param("splits")
    if wanted:
        unknown = sorted(set(wanted) - {i.source.split for i in items})
        if unknown:
            raise SourceError(
                f"{spec.location}: ?splits names {unknown}, which the release copy does not have"
            )
        items = [i for i in items if i.source.split in wanted]
    record = {
        "name": f"medabstain_{ds}",
        "revision": revision,
        "kind": "medabstain",
        "location": spec.location,
        "splits": ",".join(sorted({i.source.split for i in items})),
        "items": str(len(items)),
        "files": ",".join(sorted(p.relative_to(root).as_posix() if root else p.name for p, *_ in found)),
        "edits": str(len(edits)),
        "pools": "present" if pool is not None else "absent",
        "skipped": str(len(bad)),
    }
    if bad:
        record["skipped_bad_rows"] = str(len(bad))
        record["skipped_bad_rows_examples"] = " | ".join(bad[:5])
    return Loaded(
        items,
        record,
        edits=edits,
        abstain_text=RELEASE_ABSTAIN_TEXT if abst is not None else None,
        abstain_positions=positions,
        pools_optional=pool is None,
        notes=notes,
    )


def _plain_name(f: _File | None) -> str:
    return f.path.name if f else "the test file"


def _edits(
    f: _File, items: dict[str, MCQItem], split: str, bad: list[str], skip: bool, strict: bool = True
) -> dict[str, ImportedEdit]:
    """The perturbed rows of ``f`` as imported edits of ``items`` (keyed by base id)."""
    digest = sha256_hex(f.path)
    out: dict[str, ImportedEdit] = {}
    for n, row in f.rows:
        base = f"medabstain-{split}-{row.id}"
        if base not in items:
            if strict:
                _bad(
                    f"{f.path}: row {n}: field 'id': {row.id!r} is not an item of the plain {split} file",
                    bad,
                    skip,
                )
            continue
        meta = row.meta or ReleaseMeta()
        key_info = meta.key_information
        key_text = "; ".join(key_info) if isinstance(key_info, list) else (key_info or "")
        removed = (meta.gold_context or "").strip() or key_text.strip()
        if not removed:
            _bad(f"{f.path}: row {n}: field 'meta.gold_context': missing (what the edit removed)", bad, skip)
            continue
        extra = {
            "gold_context": meta.gold_context or "",
            "reason": meta.reason or "",
            "key_information": key_text,
        }
        out[base] = ImportedEdit(
            perturbed_question=row.question,
            removed_text=removed,
            file=f.path.name,
            sha256=digest,
            row=n,
            producer=PRODUCER,
            rationale=meta.reason,
            original_question=row.original_question,
            extra=extra,
        )
    return out


def _load_items(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    loaded = load_medabstain(spec)
    return loaded.items, loaded.record


register(
    SourceKind(
        "medabstain",
        _load_items,
        summary="the MedAbstain release folder",
        full_loader=load_medabstain,
    )
)
