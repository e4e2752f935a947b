"""Adapters from public medical MCQA datasets to ``MCQItem``: one spec string names the source.

Spec grammar (``--source``)::

    KIND:LOCATION[@REVISION][?key=value&key=value...]

``KIND`` is one of ``medqa4``, ``medqa5``, ``medmcqa``, ``medexqa``, ``pubmedqa``, ``gmai_mmbench`` or
``generic``.  ``LOCATION`` is a local file, a local folder or a Hub dataset repo id; every location is
read with ``datasets`` (``load_dataset_builder`` + ``download_and_prepare``, i.e. ``load_dataset``) and
never with ``trust_remote_code``.  A local folder with a ``README.md`` ``configs:`` block is read exactly
as the Hub repo it mirrors; a folder without one is read as the original release (data files found by
name, the split taken from each file name).  ``@REVISION`` pins a Hub commit, tag or branch; without it
the resolved commit is recorded, and a local source is recorded as ``sha256:<12 hex>`` of its bytes.

Query keys (all kinds): ``splits=a,b`` (which splits to load; for a single file, the name of its
split), ``config=NAME`` (``datasets`` config), ``bad_rows=raise|skip``.  Per kind: ``cop_base=0|1``
(medmcqa), ``specialty=a,b`` (medexqa), ``context=1|0`` (pubmedqa), ``images=DIR`` and ``files=a,b``
(gmai_mmbench), ``mapping=PATH`` (generic, required).

Every row that cannot become an item raises :class:`SourceError` naming the file (or repo, config and
split), the 1-based data row and the field.  ``bad_rows=skip`` turns that into skip-and-count: the
count and the first messages are returned in the source record, never dropped silently.  The only rows
skipped by design are GMAI-MMBench rows with fewer than two non-empty options (counted and reported).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import (
    LETTERS,
    QUESTION_TYPES,
    ItemMetadata,
    MCQItem,
    Option,
    SourceRef,
)

Kind = Literal["medqa4", "medqa5", "medmcqa", "medexqa", "pubmedqa", "gmai_mmbench", "generic"]
KINDS: tuple[str, ...] = ("medqa4", "medqa5", "medmcqa", "medexqa", "pubmedqa", "gmai_mmbench", "generic")
COMMON_KEYS = frozenset({"splits", "config", "bad_rows"})
KIND_KEYS: dict[str, frozenset[str]] = {
    "medqa4": frozenset(),
    "medqa5": frozenset(),
    "medmcqa": frozenset({"cop_base"}),
    "medexqa": frozenset({"specialty"}),
    "pubmedqa": frozenset({"context"}),
    "gmai_mmbench": frozenset({"images", "files"}),
    "generic": frozenset({"mapping"}),
}
DATASET_NAMES = {
    "medqa4": "medqa_usmle_4",
    "medqa5": "medqa_usmle_5",
    "medmcqa": "medmcqa",
    "medexqa": "medexqa",
    "pubmedqa": "pubmedqa",
    "gmai_mmbench": "gmai_mmbench",
}
# MedExQA's five specialties (Hub config names) and the names its README table gives them.
MEDEXQA_SPECIALTIES = {
    "biomedical_engineer": "Biomedical Engineering",
    "clinical_laboratory_scientist": "Clinical Laboratory Science",
    "clinical_psychologist": "Clinical Psychology",
    "occupational_therapist": "Occupational Therapy",
    "speech_pathologist": "Speech Language Pathology",
}
MEDEXQA_COLUMNS = ["question", "A", "B", "C", "D", "exp0", "exp1", "answer"]  # the TSVs have no header
GMAI_DEFAULT_FILES = ("GMAI_mm_bench_VAL.tsv",)  # the TEST parts carry no 'answer' column
PUBMEDQA_DECISIONS = ("yes", "no", "maybe")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT_IN_URL = re.compile(r"@([0-9a-f]{40})/")
SPLIT_TOKENS = ("train", "dev", "val", "valid", "validation", "test")
MAX_SKIP_EXAMPLES = 5


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------
class SourceSpec(BaseModel):
    """A parsed ``KIND:LOCATION[@REVISION][?key=value&...]`` source spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    location: str = Field(min_length=1)
    revision: str | None = None
    params: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys(self) -> SourceSpec:
        allowed = COMMON_KEYS | KIND_KEYS[self.kind]
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} for '{self.kind}'; allowed: {sorted(allowed)}")
        if self.params.get("bad_rows", "raise") not in ("raise", "skip"):
            raise ValueError("bad_rows must be 'raise' or 'skip'")
        if self.kind == "generic" and not self.params.get("mapping"):
            raise ValueError("generic sources need ?mapping=PATH (a YAML or JSON column mapping)")
        return self

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        kind, sep, rest = text.partition(":")
        if not sep or not rest:
            raise SourceError(f"source spec {text!r}: expected KIND:LOCATION[@REVISION][?key=value&...]")
        if kind not in KINDS:
            raise SourceError(f"source spec {text!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
        rest, _, query = rest.partition("?")
        params: dict[str, str] = {}
        for pair in filter(None, query.split("&")):
            key, eq, value = pair.partition("=")
            if not eq or not key or key in params:
                raise SourceError(f"source spec {text!r}: bad or repeated query item {pair!r}")
            params[key] = value
        location, revision = rest, None
        if "@" in rest and not Path(rest).exists():
            head, _, tail = rest.partition("@")  # a Hub id has no '@'; a ref may have '/' (refs/pr/1)
            if not HUB_ID.match(head):
                head, _, tail = rest.rpartition("@")  # a local path: only a final '@NAME' is a revision
                tail = "" if "/" in tail else tail
            if head and tail:
                location, revision = head, tail
        try:
            return cls(kind=kind, location=location, revision=revision, params=params)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise SourceError(f"source spec {text!r}: {exc.errors()[0]['msg']}") from exc

    def list_param(self, key: str) -> list[str] | None:
        value = self.params.get(key)
        return [v.strip() for v in value.split(",") if v.strip()] if value else None

    @property
    def is_local(self) -> bool:
        return Path(self.location).exists()


# ---------------------------------------------------------------------------------------------
# Reading a location with `datasets`
# ---------------------------------------------------------------------------------------------
@dataclass
class _Part:
    """One split of one config, as rows plus where they came from (for error messages)."""

    split: str
    rows: Any  # datasets.Dataset
    where: str
    config: str | None = None


@dataclass
class _Opened:
    parts: list[_Part]
    revision: str
    commit: str | None = None
    notes: dict[str, str] = field(default_factory=dict)


class _RowError(Exception):
    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field, self.message = field_name, message


def _sha256_files(paths: list[Path], root: Path | None = None) -> str:
    h = hashlib.sha256()
    if len(paths) == 1 and root is None:
        with paths[0].open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:12]
    for p in sorted(paths):
        fh = hashlib.sha256()
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                fh.update(chunk)
        rel = p.relative_to(root).as_posix() if root else p.name
        h.update(f"{rel}\0{fh.hexdigest()}\n".encode())
    return "sha256:" + h.hexdigest()[:12]


def _split_from_name(name: str) -> str | None:
    stem = name.split(".", 1)[0].lower()
    found = [t for t in re.split(r"[^a-z0-9]+", stem) if t in SPLIT_TOKENS]
    return found[0] if len(found) == 1 else None


def _builder_for(path: Path) -> tuple[str, dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        return "json", {}
    if suffix == ".csv":
        return "csv", {}
    if suffix == ".tsv":
        return "csv", {"sep": "\t"}
    if suffix == ".parquet":
        return "parquet", {}
    raise SourceError(f"{path}: unsupported file type {suffix!r} (json, jsonl, csv, tsv, parquet)")


def _has_configs(folder: Path) -> bool:
    readme = folder / "README.md"
    if not readme.is_file():
        return False
    text = readme.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return False
    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError as exc:
        raise SourceError(f"{readme}: the YAML front matter does not parse ({exc})") from exc
    return isinstance(meta, dict) and bool(meta.get("configs"))


def _commit_of(data_files: Any) -> str | None:
    commits = set(COMMIT_IN_URL.findall(str(data_files)))
    return commits.pop() if len(commits) == 1 else None


def _first_line(url: str) -> str:
    import fsspec

    with fsspec.open(url, "rt", encoding="utf-8") as f:
        return f.readline().rstrip("\r\n")


def _scan_json(path: Path) -> None:
    """Find the first unparsable JSON line (or document) of a local file and raise naming it."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        return
    row = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row += 1
        try:
            json.loads(line)
        except json.JSONDecodeError as exc:
            raise SourceError(
                f"{path}: row {row} (line {lineno}): field '<json>': not valid JSON ({exc.msg})"
            ) from exc


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"


def _open(
    spec: SourceSpec,
    *,
    config: str | None = None,
    data_glob: str = "*.jsonl",
    name_filter: Callable[[Path], bool] | None = None,
    hub_data_files: Any = None,
    builder_kwargs: dict[str, Any] | None = None,
    header_features: bool = False,
    default_splits: Callable[[list[str]], list[str]] | None = None,
) -> _Opened:
    """Open one config of a location; return its selected splits as ``datasets.Dataset`` parts."""
    import datasets

    kw = dict(builder_kwargs or {})
    loc = Path(spec.location)
    wanted = spec.list_param("splits")
    local_files: list[Path] = []
    json_files: list[Path] = []
    if loc.is_file():
        split = wanted[0] if wanted and len(wanted) == 1 else _split_from_name(loc.name)
        if split is None:
            raise SourceError(f"{loc}: cannot tell the split from the file name; add ?splits=NAME")
        builder, extra = _builder_for(loc)
        kw = {**extra, **kw}
        local_files = [loc]
        args: dict[str, Any] = {"path": builder, "data_files": {split: [str(loc)]}}
        where_of = {split: str(loc)}
        wanted = [split]
    elif loc.is_dir() and _has_configs(loc):
        args = {"path": str(loc), "name": config}
        local_files = [p for p in sorted(loc.rglob("*")) if p.is_file() and not _hidden(p, loc)]
        where_of = {}
    elif loc.is_dir():
        files = [
            p for p in sorted(loc.glob(data_glob)) if p.is_file() and (not name_filter or name_filter(p))
        ]
        if not files:
            raise SourceError(f"{loc}: no data files matching {data_glob!r}")
        by_split: dict[str, list[str]] = {}
        where_of = {}
        for p in files:
            s = _split_from_name(p.name)
            if s is None:
                raise SourceError(f"{p}: cannot tell the split from the file name")
            by_split.setdefault(s, []).append(str(p))
            where_of[s] = ", ".join(by_split[s])
        builder, extra = _builder_for(files[0])
        kw = {**extra, **kw}
        local_files = files
        args = {"path": builder, "data_files": by_split}
    else:
        if not HUB_ID.match(spec.location):
            raise SourceError(f"{spec.location}: not a local file or folder, nor a Hub repo id (ORG/NAME)")
        args = {"path": spec.location, "name": config, "revision": spec.revision}
        if hub_data_files is not None:
            args["data_files"] = hub_data_files
        where_of = {}
    json_files = [p for p in local_files if p.suffix.lower() in (".json", ".jsonl")]
    label = spec.location + (f"@{spec.revision}" if spec.revision and not local_files else "")
    try:
        builder_obj = datasets.load_dataset_builder(**args, **kw)
        if header_features:  # every column read as text: no per-chunk type guessing
            headers = {
                str(f): _first_line(str(f)) for fs in builder_obj.config.data_files.values() for f in fs
            }
            if len(set(headers.values())) != 1:
                raise SourceError(f"{label}: the data files have different header lines: {sorted(headers)}")
            names = next(iter(headers.values())).split(kw.get("sep", ","))
            feats = datasets.Features({n: datasets.Value("string") for n in names})
            builder_obj = datasets.load_dataset_builder(**args, **kw, features=feats)
        builder_obj.download_and_prepare()
    except SourceError:
        raise
    except Exception as exc:
        for p in json_files:
            _scan_json(p)
        raise SourceError(f"{label}: datasets could not read it ({_root_cause(exc)})") from exc
    available = list(builder_obj.info.splits or {})
    if wanted is None:
        wanted = default_splits(available) if default_splits else available
    missing = [s for s in wanted if s not in available]
    if missing:
        raise SourceError(f"{label}: no split(s) {missing}; available: {available}")
    commit = None if local_files else _commit_of(builder_obj.config.data_files)
    notes: dict[str, str] = {}
    if local_files:
        root = None if loc.is_file() else loc
        revision = spec.revision or _sha256_files(local_files, root)
    else:
        if (
            spec.revision
            and commit
            and re.fullmatch(r"[0-9a-f]{40}", spec.revision)
            and commit != spec.revision
        ):
            raise SourceError(f"{label}: asked for commit {spec.revision} but datasets resolved {commit}")
        revision = spec.revision or commit or "unresolved"
        if commit and commit != revision:
            notes["commit"] = commit
        if commit is None:
            notes["revision_note"] = "commit not resolved (offline cache?): the revision is not verified"
    parts = []
    for s in wanted:
        where = where_of.get(s) or f"{label} [{'config ' + config + ', ' if config else ''}split {s}]"
        parts.append(_Part(split=s, rows=builder_obj.as_dataset(split=s), where=where, config=config))
    return _Opened(parts=parts, revision=revision, commit=commit, notes=notes)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def _rows(ds: Any, batch_size: int = 1024) -> Iterator[dict[str, Any]]:
    for batch in ds.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys), strict=True):
            yield dict(zip(keys, values, strict=True))


def _require_columns(part: _Part, columns: list[str]) -> None:
    present = list(part.rows.column_names)
    for c in columns:
        if c not in present:
            raise SourceError(
                f"{part.where}: row 1: field '{c}': column missing (columns present: {', '.join(present)})"
            )


# ---------------------------------------------------------------------------------------------
# Row helpers
# ---------------------------------------------------------------------------------------------
@dataclass
class _Ctx:
    dataset: str
    prefix: str
    split: str
    revision: str
    n: int = 0  # 1-based data row within the split


def _text(row: dict[str, Any], key: str, label: str | None = None) -> str:
    value = row.get(key)
    name = label or key
    if value is None:
        raise _RowError(name, "missing (null)")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowError(name, f"expected text, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise _RowError(name, "empty")
    return text


def _opt_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _make_item(
    ctx: _Ctx,
    *,
    item_id: str,
    source_id: str,
    question: str,
    options: list[tuple[int, str]],
    gold: int,
    metadata: ItemMetadata | None = None,
    image: str | None = None,
) -> MCQItem:
    """``options`` are (source index, text) in display order; ``gold`` is a position in that list."""
    opts = [
        Option(label=LETTERS[k], text=t, role="gold" if k == gold else "distractor", option_id=f"src:{i}")
        for k, (i, t) in enumerate(options)
    ]
    return MCQItem(
        item_id=item_id,
        base_id=item_id,
        source=SourceRef(dataset=ctx.dataset, split=ctx.split, source_id=source_id, revision=ctx.revision),
        question=question,
        image=image,
        options=opts,
        target_label=LETTERS[gold],
        metadata=metadata or ItemMetadata(),
    )


def _letter_gold(letter_value: Any, field_name: str, letters: list[str]) -> int:
    letter = _opt_text(letter_value)
    if letter is None:
        raise _RowError(field_name, "missing answer")
    letter = letter.upper()
    if letter not in letters:
        raise _RowError(field_name, f"answer {letter!r} is not among the options {letters}")
    return letters.index(letter)


class _Collector:
    """Maps rows to items, turning every failure into a SourceError (or a counted skip)."""

    def __init__(self, spec: SourceSpec):
        self.skip = spec.params.get("bad_rows", "raise") == "skip"
        self.items: list[MCQItem] = []
        self.seen: dict[str, str] = {}
        self.bad: list[str] = []
        self.skipped_by_design: dict[str, int] = {}

    def run(self, part: _Part, ctx: _Ctx, fn: Callable[[dict[str, Any], _Ctx], MCQItem | None]) -> None:
        for n, row in enumerate(_rows(part.rows), start=1):
            ctx.n = n
            where = f"{part.where}: row {n}"
            try:
                item = fn(row, ctx)
            except _RowError as exc:
                self._bad(f"{where}: field '{exc.field}': {exc.message}")
                continue
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"]) or "<item>"
                self._bad(f"{where}: field '{loc}': {err['msg']}")
                continue
            if item is None:
                continue
            if item.item_id in self.seen:
                raise SourceError(
                    f"{where}: field 'id': duplicate item id {item.item_id!r} ({self.seen[item.item_id]})"
                )
            self.seen[item.item_id] = where
            self.items.append(item)

    def _bad(self, message: str) -> None:
        if not self.skip:
            raise SourceError(message)
        self.bad.append(message)

    def skipped(self, reason: str) -> None:
        self.skipped_by_design[reason] = self.skipped_by_design.get(reason, 0) + 1

    def record(self, name: str, revision: str, spec: SourceSpec, **extra: str) -> dict[str, str]:
        splits = sorted({i.source.split for i in self.items})
        rec = {
            "name": name,
            "revision": revision,
            "kind": spec.kind,
            "location": spec.location,
            "splits": ",".join(splits),
            "items": str(len(self.items)),
            "skipped": str(len(self.bad) + sum(self.skipped_by_design.values())),
            **extra,
        }
        if self.bad:
            rec["skipped_bad_rows"] = str(len(self.bad))
            rec["skipped_bad_rows_examples"] = " | ".join(self.bad[:MAX_SKIP_EXAMPLES])
        for reason, count in sorted(self.skipped_by_design.items()):
            rec[f"skipped_{reason}"] = str(count)
        return rec


# ---------------------------------------------------------------------------------------------
# MedQA (USMLE): GBaker/MedQA-USMLE-4-options and the original 5-option JSONL release.
# Layout checked against the Hub tree of GBaker/MedQA-USMLE-4-options (phrases_no_exclude_{train,test}
# .jsonl), the features of its parquet copies (question, answer, options struct A-D, meta_info,
# answer_idx, metamap_phrases) and bigbio's med_qa.py (data_clean/questions/US/{train,dev,test}.jsonl
# with options A-E; US/4_options/phrases_no_exclude_*.jsonl).
# ---------------------------------------------------------------------------------------------
def medqa_row(row: dict[str, Any], ctx: _Ctx, n_options: int) -> MCQItem:
    """{question, answer, options {A..}, meta_info, answer_idx[, metamap_phrases]} -> item."""
    question = _text(row, "question")
    raw = row.get("options")
    if isinstance(raw, list):  # the bigbio 'source' schema: [{key, value}, ...]
        try:
            raw = {d["key"]: d["value"] for d in raw}
        except (TypeError, KeyError) as exc:
            raise _RowError("options", "a list of options must hold {key, value} records") from exc
    if not isinstance(raw, dict):
        raise _RowError("options", f"expected a mapping of letters to text, got {type(raw).__name__}")
    letters = list(LETTERS[:n_options])
    extra = sorted(k for k, v in raw.items() if k not in letters and v is not None)
    if extra:
        raise _RowError("options", f"unexpected option(s) {extra} for a {n_options}-option source")
    options = []
    for i, letter in enumerate(letters):
        text = _opt_text(raw.get(letter))
        if text is None:
            raise _RowError(f"options.{letter}", "missing or empty option")
        options.append((i, text))
    gold = _letter_gold(row.get("answer_idx"), "answer_idx", letters)
    answer = _opt_text(row.get("answer"))
    if answer is not None and answer != options[gold][1]:
        raise _RowError(
            "answer", f"answer text {answer!r} differs from option {letters[gold]} {options[gold][1]!r}"
        )
    n = f"{ctx.n:06d}"
    return _make_item(
        ctx,
        item_id=f"{ctx.prefix}-{ctx.split}-{n}",
        source_id=f"{ctx.split}-{n}",
        question=question,
        options=options,
        gold=gold,
    )


def _load_medqa(spec: SourceSpec, n_options: int) -> tuple[list[MCQItem], dict[str, str]]:
    opened = _open(spec, config=spec.params.get("config"), data_glob="*.jsonl")
    name = DATASET_NAMES[spec.kind]
    col = _Collector(spec)
    for part in opened.parts:
        _require_columns(part, ["question", "options", "answer_idx"])
        ctx = _Ctx(dataset=name, prefix=spec.kind, split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: medqa_row(r, c, n_options))
    return col.items, col.record(name, opened.revision, spec, **opened.notes)


# ---------------------------------------------------------------------------------------------
# MedMCQA: openlifescienceai/medmcqa (cop 0-3, test -1) and the original release (cop 1-4).
# Checked against the HF loading script that produced the Hub data (reads train.json / dev.json /
# test.json as JSON lines, cop = int(cop) - 1, -1 when the test row has none; ClassLabel a-d) and the
# card's field list; the card's "cop: 1,2,3,4" describes the raw files (medmcqa/medmcqa issue #9).
# ---------------------------------------------------------------------------------------------
MEDMCQA_OPTIONS = ("opa", "opb", "opc", "opd")


def medmcqa_row(row: dict[str, Any], ctx: _Ctx, cop_base: int) -> MCQItem:
    """{id, question, opa..opd, cop, choice_type, exp, subject_name, topic_name} -> item."""
    source_id = _text(row, "id")
    question = _text(row, "question")
    options = []
    for i, key in enumerate(MEDMCQA_OPTIONS):
        text = _opt_text(row.get(key))
        if text is None:
            raise _RowError(key, "missing or empty option")
        options.append((i, text))
    cop = row.get("cop")
    if cop is None or cop == -1:
        raise _RowError(
            "cop", "no answer key (MedMCQA's public test split is unlabelled; evaluate on validation)"
        )
    if isinstance(cop, str) and cop.strip().lstrip("-").isdigit():
        cop = int(cop)
    if isinstance(cop, bool) or not isinstance(cop, int):
        raise _RowError("cop", f"expected an integer, got {cop!r}")
    gold = cop - cop_base
    if not 0 <= gold < 4:
        raise _RowError("cop", f"{cop} is out of range {cop_base}..{cop_base + 3} (cop_base={cop_base})")
    return _make_item(
        ctx,
        item_id=f"medmcqa-{source_id}",
        source_id=source_id,
        question=question,
        options=options,
        gold=gold,
        metadata=ItemMetadata(specialty=_opt_text(row.get("subject_name"))),
    )


def _load_medmcqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    loc = Path(spec.location)
    raw_release = loc.exists() and (
        (loc.is_file() and loc.suffix.lower() in (".json", ".jsonl"))
        or (loc.is_dir() and not _has_configs(loc))
    )
    base_text = spec.params.get("cop_base", "1" if raw_release else "0")
    if base_text not in ("0", "1"):
        raise SourceError(f"source spec: cop_base must be 0 or 1, got {base_text!r}")
    cop_base = int(base_text)
    opened = _open(
        spec,
        config=spec.params.get("config"),
        data_glob="*.json",
        default_splits=lambda av: [s for s in av if s != "test"],
    )
    col = _Collector(spec)
    for part in opened.parts:
        _require_columns(part, ["id", "question", *MEDMCQA_OPTIONS, "cop"])
        ctx = _Ctx(dataset="medmcqa", prefix="medmcqa", split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: medmcqa_row(r, c, cop_base))
    return col.items, col.record("medmcqa", opened.revision, spec, cop_base=str(cop_base), **opened.notes)


# ---------------------------------------------------------------------------------------------
# MedExQA: bluesky333/MedExQA, one config per specialty, header-less TSV (dev / test).
# Checked against the Hub card (configs, file paths) and knowlab/MedExQA (README: "provided without
# headers", columns question, A-D, two explanations, answer; evaluate_MedExQA.py reads them with
# names=[question, A, B, C, D, exp0, exp1, answer]).
# ---------------------------------------------------------------------------------------------
def medexqa_row(row: dict[str, Any], ctx: _Ctx, specialty: str) -> MCQItem:
    """Columns (no header): question, A, B, C, D, exp0, exp1, answer letter -> item."""
    question = _text(row, "question")
    options = []
    for i, letter in enumerate("ABCD"):
        text = _opt_text(row.get(letter))
        if text is None:
            raise _RowError(letter, "missing or empty option")
        options.append((i, text))
    gold = _letter_gold(row.get("answer"), "answer", list("ABCD"))
    n = f"{ctx.n:04d}"
    return _make_item(
        ctx,
        item_id=f"medexqa-{specialty}-{ctx.split}-{n}",
        source_id=f"{specialty}/{ctx.split}-{n}",
        question=question,
        options=options,
        gold=gold,
        metadata=ItemMetadata(specialty=MEDEXQA_SPECIALTIES.get(specialty, specialty)),
    )


def _load_medexqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    import datasets

    feats = datasets.Features({c: datasets.Value("string") for c in MEDEXQA_COLUMNS})
    kw = {
        "sep": "\t",
        "names": MEDEXQA_COLUMNS,
        "features": feats,
        "keep_default_na": False,
        "na_values": [""],
    }
    loc = Path(spec.location)
    wanted = spec.list_param("specialty")
    if loc.is_file():
        stem = loc.name.rsplit(".", 1)[0]
        specialties = [stem.rsplit("_", 1)[0]]
    elif wanted:
        specialties = wanted
    elif loc.is_dir() and not _has_configs(loc):
        specialties = sorted({p.name.rsplit("_", 1)[0] for p in loc.rglob("*.tsv")})
    else:
        try:
            specialties = datasets.get_dataset_config_names(spec.location, revision=spec.revision)
        except Exception as exc:
            raise SourceError(f"{spec.location}: cannot list its configs ({_root_cause(exc)})") from exc
    release_folder = loc.is_dir() and not _has_configs(loc)
    open_spec = spec
    if release_folder and not spec.revision:  # one revision for every specialty's files together
        used = [p for p in loc.rglob("*.tsv") if p.name.rsplit("_", 1)[0] in specialties]
        if not used:
            raise SourceError(f"{loc}: no <specialty>_<split>.tsv files for {specialties}")
        open_spec = spec.model_copy(update={"revision": _sha256_files(used, loc)})
    col = _Collector(spec)
    revisions: list[str] = []
    notes: dict[str, str] = {}
    for sp in specialties:
        opened = _open(
            open_spec,
            config=None if (loc.is_file() or release_folder) else sp,
            data_glob="**/*.tsv",
            name_filter=lambda p, sp=sp: p.name.rsplit("_", 1)[0] == sp,
            builder_kwargs=kw,
        )
        revisions.append(opened.revision)
        notes.update(opened.notes)
        for part in opened.parts:
            ctx = _Ctx(dataset="medexqa", prefix="medexqa", split=part.split, revision=opened.revision)
            col.run(part, ctx, lambda r, c, sp=sp: medexqa_row(r, c, sp))
    revision = (
        revisions[0]
        if len(set(revisions)) == 1
        else ",".join(f"{s}:{r}" for s, r in zip(specialties, revisions, strict=True))
    )
    return col.items, col.record("medexqa", revision, spec, specialties=",".join(specialties), **notes)


# ---------------------------------------------------------------------------------------------
# PubMedQA: qiaojin/PubMedQA config pqa_labeled (yes / no / maybe; one 'train' split of 1000 rows).
# Checked against the dataset_info of its Parquet export (pubid int32, question, context sequence of
# {contexts, labels, meshes, reasoning_required_pred, reasoning_free_pred}, long_answer, final_decision).
# ---------------------------------------------------------------------------------------------
def pubmedqa_row(row: dict[str, Any], ctx: _Ctx, with_context: bool) -> MCQItem:
    """{pubid, question, context {contexts, labels, meshes}, long_answer, final_decision} -> item."""
    pubid = _text(row, "pubid")
    question = _text(row, "question")
    decision = _opt_text(row.get("final_decision"))
    if decision is None:
        raise _RowError("final_decision", "missing answer")
    if decision.lower() not in PUBMEDQA_DECISIONS:
        raise _RowError("final_decision", f"{decision!r} is not one of {list(PUBMEDQA_DECISIONS)}")
    text = question
    if with_context:
        context = row.get("context")
        if not isinstance(context, dict):
            raise _RowError("context", "missing (expected {contexts, labels, meshes})")
        contexts = context.get("contexts") or []
        labels = context.get("labels") or []
        if not contexts or not all(isinstance(c, str) and c.strip() for c in contexts):
            raise _RowError("context.contexts", "missing or empty context passages")
        if labels and len(labels) != len(contexts):
            raise _RowError("context.labels", f"{len(labels)} labels for {len(contexts)} contexts")
        lines = [
            f"{lab}: {c.strip()}" if lab else c.strip()
            for lab, c in zip(labels or [None] * len(contexts), contexts, strict=True)
        ]
        text = "\n".join(lines) + f"\n\nQuestion: {question}"
    return _make_item(
        ctx,
        item_id=f"{ctx.prefix}-{pubid}",
        source_id=pubid,
        question=text,
        options=list(enumerate(PUBMEDQA_DECISIONS)),
        gold=PUBMEDQA_DECISIONS.index(decision.lower()),
    )


def _load_pubmedqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    config = spec.params.get("config", "pqa_labeled")
    with_context = spec.params.get("context", "1") not in ("0", "false", "no")
    opened = _open(spec, config=config, data_glob="*.parquet")
    name = "pubmedqa" if config == "pqa_labeled" else f"pubmedqa_{config}"
    col = _Collector(spec)
    for part in opened.parts:
        _require_columns(
            part, ["pubid", "question", "final_decision", *(["context"] if with_context else [])]
        )
        ctx = _Ctx(dataset=name, prefix=name, split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: pubmedqa_row(r, c, with_context))
    return col.items, col.record(
        name, opened.revision, spec, config=config, context=str(int(with_context)), **opened.notes
    )


# ---------------------------------------------------------------------------------------------
# GMAI-MMBench: OpenGVLab/GMAI-MMBench (gated), GMAI_mm_bench_VAL.tsv with base64 images; the
# GMAI_mm_bench_TEST_part_*.tsv files have no 'answer' column.  Checked against the uni-medical README
# (answer only in VAL, base64 PNG images) and public readers of the file (columns index, question,
# A-E, answer, image, category, clinical VQA task, department, perceptual granularity, modality,
# original task).  Images are written content-addressed as <image_root>/images/<sha256>.<ext> and the
# item's ``image`` is that relative path; the record names the image_root.
# ---------------------------------------------------------------------------------------------
IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
)


def default_image_root() -> Path:
    base = os.environ.get("EQUIPOISE_CACHE") or str(Path.home() / ".cache" / "equipoise")
    return Path(base) / "gmai_mmbench"


def image_extension(data: bytes) -> str | None:
    """File extension for image bytes, told from their magic number (None: not a known image kind).

    Shared with the suite builder, which names copied images by content the same way."""
    ext = next((e for magic, e in IMAGE_MAGIC if data.startswith(magic)), None)
    if ext is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        ext = "webp"
    return ext


def save_image(b64: str, root: Path) -> str:
    """Decode a base64 image, store it as ``root/images/<sha256>.<ext>``; return the relative path."""
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _RowError("image", f"not valid base64 ({exc})") from exc
    ext = image_extension(data)
    if ext is None:
        raise _RowError("image", "decoded bytes are not a PNG, JPEG, GIF, BMP or WebP image")
    rel = f"images/{hashlib.sha256(data).hexdigest()}.{ext}"
    path = root / rel
    if not (path.is_file() and path.stat().st_size == len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return rel


def gmai_row(
    row: dict[str, Any],
    ctx: _Ctx,
    letters: list[str],
    image_root: Path,
    images: dict[str, str],
    pending: list[tuple[MCQItem, str, str]],
    col: _Collector,
) -> MCQItem | None:
    """{index, question, A..E (empty when absent), answer letter, image base64, category, clinical VQA
    task, department, perceptual granularity, modality, original task} -> item (None: skipped)."""
    index = _text(row, "index")
    question = _text(row, "question")
    present = [(i, letter, _opt_text(row.get(letter))) for i, letter in enumerate(letters)]
    options = [(i, t) for i, _, t in present if t is not None]
    if len(options) < 2:
        col.skipped("fewer_than_2_options")
        return None
    answer = _opt_text(row.get("answer"))
    if answer is None:
        raise _RowError("answer", "missing answer")
    answer = answer.upper()
    kept = [letter for _, letter, t in present if t is not None]
    if answer not in kept:
        raise _RowError("answer", f"answer {answer!r} is not among the non-empty options {kept}")
    raw_image = _opt_text(row.get("image"))
    if raw_image is None:
        raise _RowError("image", "missing image")
    ref = raw_image if len(raw_image) <= 64 and raw_image.isdigit() else None  # MMBench: image of another row
    image = None if ref else save_image(raw_image, image_root)
    if image:
        images[index] = image
    item = _make_item(
        ctx,
        item_id=f"gmai-{ctx.split}-{index}",
        source_id=index,
        question=question,
        options=options,
        gold=kept.index(answer),
        image=image or "pending",
        metadata=ItemMetadata(
            specialty=_opt_text(row.get("department")), imaging_modality=_opt_text(row.get("modality"))
        ),
    )
    if ref:
        pending.append((item, ref, f"row {ctx.n}"))
    return item


def _load_gmai(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    image_root = Path(spec.params["images"]) if spec.params.get("images") else default_image_root()
    files = spec.list_param("files") or list(GMAI_DEFAULT_FILES)
    hub_files: dict[str, list[str]] = {}
    for f in files:
        s = _split_from_name(f)
        if s is None:
            raise SourceError(f"source spec: cannot tell the split of {f!r} from its name")
        hub_files.setdefault(s, []).append(f)
    kw = {"sep": "\t", "keep_default_na": False, "na_values": [""]}
    opened = _open(
        spec,
        config=spec.params.get("config"),
        data_glob="*.tsv",
        name_filter=lambda p: p.name in files,
        hub_data_files=hub_files,
        builder_kwargs=kw,
        header_features=True,
    )
    col = _Collector(spec)
    for part in opened.parts:
        _require_columns(part, ["index", "question", "A", "B", "answer", "image"])
        letters = [c for c in LETTERS if c in part.rows.column_names]
        if letters != list(LETTERS[: len(letters)]):
            raise SourceError(
                f"{part.where}: row 1: field 'options': option columns {letters} are not A, B, ..."
            )
        images: dict[str, str] = {}
        pending: list[tuple[MCQItem, str, str]] = []
        ctx = _Ctx(dataset="gmai_mmbench", prefix="gmai", split=part.split, revision=opened.revision)
        col.run(
            part, ctx, lambda r, c, i=images, p=pending, lt=letters: gmai_row(r, c, lt, image_root, i, p, col)
        )
        position = {it.item_id: k for k, it in enumerate(col.items)}
        for item, ref, where in pending:
            if ref not in images:
                raise SourceError(
                    f"{part.where}: {where}: field 'image': refers to row index {ref}, which has no image"
                )
            col.items[position[item.item_id]] = item.model_copy(update={"image": images[ref]})
    return col.items, col.record(
        "gmai_mmbench", opened.revision, spec, image_root=str(image_root), **opened.notes
    )


# ---------------------------------------------------------------------------------------------
# Generic: any MCQA table described by a small YAML / JSON column mapping
# ---------------------------------------------------------------------------------------------
class CsvOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sep: str | None = None
    header: bool = True
    column_names: list[str] | None = None


class GenericMapping(BaseModel):
    """Which columns hold what.  Exactly one of ``options`` (a list of option columns) and
    ``options_column`` (one column holding a list, a {letter: text} mapping or [{key, value}])."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="SourceRef.dataset and the id prefix")
    config: str | None = None
    question: str
    options: list[str] | None = Field(default=None, min_length=2)
    options_column: str | None = None
    answer: str
    answer_format: Literal["letter", "index0", "index1", "text"]
    id: str | None = None
    split_column: str | None = None
    specialty: str | None = None
    imaging_modality: str | None = None
    difficulty: str | None = None
    question_type: str | None = None
    image: str | None = None
    csv: CsvOptions = CsvOptions()

    @model_validator(mode="after")
    def _one_options(self) -> GenericMapping:
        if (self.options is None) == (self.options_column is None):
            raise ValueError("give exactly one of 'options' (columns) and 'options_column'")
        return self


def _read_mapping(path: Path) -> GenericMapping:
    if not path.is_file():
        raise SourceError(f"{path}: mapping file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise SourceError(f"{path}: not valid YAML/JSON ({exc})") from exc
    try:
        return GenericMapping.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"]) or "<mapping>"
        raise SourceError(f"{path}: field '{loc}': {e['msg']}") from exc


def _generic_options(row: dict[str, Any], m: GenericMapping) -> tuple[list[tuple[int, str]], list[str]]:
    """Options as (source index, text) plus the source's letters (for 'letter' answers)."""
    if m.options is not None:
        opts = []
        for i, c in enumerate(m.options):
            text = _opt_text(row.get(c))
            if text is None:
                raise _RowError(c, "missing or empty option")
            opts.append((i, text))
        return opts, list(LETTERS[: len(opts)])
    assert m.options_column is not None
    raw = row.get(m.options_column)
    if isinstance(raw, list) and raw and isinstance(raw[0], dict):
        try:
            raw = {d["key"]: d["value"] for d in raw}
        except KeyError as exc:
            raise _RowError(m.options_column, "list items must be {key, value} records") from exc
    if isinstance(raw, dict):
        items = [(k, v) for k, v in raw.items() if v is not None]
        keys = [k for k, _ in items]
        if keys != list(LETTERS[: len(keys)]):
            raise _RowError(m.options_column, f"option keys {keys} are not A, B, C, ... in order")
        texts = [_opt_text(v) for _, v in items]
    elif isinstance(raw, list):
        keys, texts = list(LETTERS[: len(raw)]), [_opt_text(v) for v in raw]
    else:
        raise _RowError(m.options_column, f"expected a list or mapping of options, got {type(raw).__name__}")
    for k, t in zip(keys, texts, strict=True):
        if t is None:
            raise _RowError(f"{m.options_column}.{k}", "missing or empty option")
    return [(i, t) for i, t in enumerate(texts) if t is not None], keys


def generic_row(row: dict[str, Any], ctx: _Ctx, m: GenericMapping) -> MCQItem:
    question = _text(row, m.question)
    options, letters = _generic_options(row, m)
    value = row.get(m.answer)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _RowError(m.answer, "missing answer")
    if m.answer_format == "letter":
        gold = _letter_gold(value, m.answer, letters)
    elif m.answer_format == "text":
        matches = [k for k, (_, t) in enumerate(options) if t == str(value).strip()]
        if len(matches) != 1:
            raise _RowError(
                m.answer, f"answer text {value!r} matches {len(matches)} options (need exactly 1)"
            )
        gold = matches[0]
    else:
        try:
            index = int(value)
        except (TypeError, ValueError) as exc:
            raise _RowError(m.answer, f"expected an integer index, got {value!r}") from exc
        gold = index - (1 if m.answer_format == "index1" else 0)
        if not 0 <= gold < len(options):
            raise _RowError(
                m.answer, f"index {index} is out of range for {len(options)} options ({m.answer_format})"
            )
    qtype = _opt_text(row.get(m.question_type)) if m.question_type else None
    if qtype is not None and qtype not in QUESTION_TYPES:
        raise _RowError(m.question_type or "", f"{qtype!r} is not one of {list(QUESTION_TYPES)}")
    source_id = _text(row, m.id) if m.id else f"{ctx.split}-{ctx.n:06d}"
    item_id = f"{m.name}-{source_id}" if m.id else f"{m.name}-{ctx.split}-{ctx.n:06d}"
    meta = ItemMetadata(
        specialty=_opt_text(row.get(m.specialty)) if m.specialty else None,
        imaging_modality=_opt_text(row.get(m.imaging_modality)) if m.imaging_modality else None,
        difficulty=_opt_text(row.get(m.difficulty)) if m.difficulty else None,
        question_type=qtype,  # type: ignore[arg-type]
    )
    image = _opt_text(row.get(m.image)) if m.image else None
    return _make_item(
        ctx,
        item_id=item_id,
        source_id=source_id,
        question=question,
        options=options,
        gold=gold,
        metadata=meta,
        image=image,
    )


def _load_generic(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    mpath = Path(spec.params["mapping"])
    m = _read_mapping(mpath)
    kw: dict[str, Any] = {}
    loc = Path(spec.location)
    is_csv = loc.is_file() and loc.suffix.lower() in (".csv", ".tsv")
    if is_csv or (loc.is_dir() and not _has_configs(loc) and any(loc.glob("*.[ct]sv"))):
        if m.csv.sep:
            kw["sep"] = m.csv.sep
        if not m.csv.header:
            if not m.csv.column_names:
                raise SourceError(f"{mpath}: field 'csv.column_names': needed when csv.header is false")
            kw["names"] = m.csv.column_names
        kw.update(keep_default_na=False, na_values=[""])
    glob = next(
        (
            g
            for g in ("*.jsonl", "*.json", "*.parquet", "*.csv", "*.tsv")
            if loc.is_dir() and any(loc.glob(g))
        ),
        "*",
    )
    split_param = spec.list_param("splits")
    if m.split_column:  # splits come from a column: read every split (a lone file as "rows") and partition
        params = {k: v for k, v in spec.params.items() if k != "splits"}
        if loc.is_file():
            params["splits"] = "rows"
        spec = spec.model_copy(update={"params": params})
    opened = _open(spec, config=spec.params.get("config") or m.config, data_glob=glob, builder_kwargs=kw)
    col = _Collector(spec)
    needed = [m.question, m.answer, *(m.options or [m.options_column or ""])]
    needed += [
        c
        for c in (
            m.id,
            m.split_column,
            m.specialty,
            m.imaging_modality,
            m.difficulty,
            m.question_type,
            m.image,
        )
        if c
    ]
    for part in opened.parts:
        _require_columns(part, needed)
        if m.split_column:
            by_split: dict[str, list[int]] = {}
            for k, v in enumerate(part.rows[m.split_column]):
                if v is None or not str(v).strip():
                    raise SourceError(
                        f"{part.where}: row {k + 1}: field '{m.split_column}': empty split name"
                    )
                by_split.setdefault(str(v).strip(), []).append(k)
            subsets = [
                (s, part.rows.select(ix))
                for s, ix in sorted(by_split.items())
                if not split_param or s in split_param
            ]
        else:
            subsets = [(part.split, part.rows)]
        for split, rows in subsets:
            sub = _Part(
                split=split,
                rows=rows,
                where=part.where if not m.split_column else f"{part.where} ({m.split_column}={split})",
            )
            ctx = _Ctx(dataset=m.name, prefix=m.name, split=split, revision=opened.revision)
            col.run(sub, ctx, lambda r, c: generic_row(r, c, m))
    mapping_rev = _sha256_files([mpath])
    return col.items, col.record(
        m.name, opened.revision, spec, mapping=f"{mpath} ({mapping_rev})", **opened.notes
    )


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
LOADERS: dict[str, Callable[[SourceSpec], tuple[list[MCQItem], dict[str, str]]]] = {
    "medqa4": lambda s: _load_medqa(s, 4),
    "medqa5": lambda s: _load_medqa(s, 5),
    "medmcqa": _load_medmcqa,
    "medexqa": _load_medexqa,
    "pubmedqa": _load_pubmedqa,
    "gmai_mmbench": _load_gmai,
    "generic": _load_generic,
}


def load(spec: str) -> tuple[list[MCQItem], dict[str, str]]:
    """Resolve a source spec to items (in source order) and a record for the build manifest:
    ``name`` and ``revision`` always, plus kind, location, splits, item and skip counts."""
    parsed = SourceSpec.parse(spec)
    items, record = LOADERS[parsed.kind](parsed)
    if not items:
        raise SourceError(f"{spec}: no items were read")
    return items, record
