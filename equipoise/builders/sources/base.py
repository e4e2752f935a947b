"""Shared machinery of the source adapters: the spec, reading a location with ``datasets``, row
helpers, the collector that turns bad rows into exact errors, and the registry of source kinds.

A source kind is one module of this package that calls :func:`register` with a :class:`SourceKind`
(its name, its extra query keys and its loader); :mod:`equipoise.builders.sources.registry` imports
every such module, so adding a source is one module plus one line there.

Spec grammar (``--source``)::

    KIND:LOCATION[@REVISION][?key=value&key=value...]

``LOCATION`` is a local file, a local folder or a Hub dataset repo id; every location is read with
``datasets`` (``load_dataset_builder`` + ``download_and_prepare``, i.e. ``load_dataset``) and never with
``trust_remote_code``.  A local folder with a ``README.md`` ``configs:`` block is read exactly as the
Hub repo it mirrors; a folder without one is read as the original release (data files found by name,
the split taken from each file name).  ``@REVISION`` pins a Hub commit, tag or branch; without it the
resolved commit is recorded, and a local source is recorded as ``sha256:<12 hex>`` of its bytes.

Query keys (all kinds): ``splits=a,b`` (which splits to load; for a single file, the name of its
split), ``config=NAME`` (``datasets`` config), ``bad_rows=raise|skip``; each kind adds its own.

Every row that cannot become an item raises :class:`SourceError` naming the file (or repo, config and
split), the 1-based data row and the field.  ``bad_rows=skip`` turns that into skip-and-count: the
count and the first messages are returned in the source record, never dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from equipoise.builders.edits import ImportedEdit
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import LETTERS, ItemMetadata, MCQItem, Option, SourceRef

COMMON_KEYS = frozenset({"splits", "config", "bad_rows"})
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT_IN_URL = re.compile(r"@([0-9a-f]{40})/")
SPLIT_TOKENS = ("train", "dev", "val", "valid", "validation", "test")
MAX_SKIP_EXAMPLES = 5

Loader = Callable[["SourceSpec"], tuple[list[MCQItem], dict[str, str]]]


@dataclass
class Loaded:
    """What a source gives a build: items and the manifest record, plus what some sources carry
    beyond items: imported key-context edits (base id -> edit), the source's own abstain option
    (its text and, per base id, its index), whether missing pools are expected, and notes that the
    build prints and writes into the card."""

    items: list[MCQItem]
    record: dict[str, str]
    edits: dict[str, ImportedEdit] = field(default_factory=dict)
    abstain_text: str | None = None
    abstain_positions: dict[str, int] = field(default_factory=dict)
    pools_optional: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SourceKind:
    """One registered source kind: ``--source NAME:...`` is read by ``loader``; ``keys`` are the query
    keys it accepts beyond :data:`COMMON_KEYS`; ``required`` those it cannot do without."""

    name: str
    loader: Loader
    keys: frozenset[str] = frozenset()
    required: tuple[str, ...] = ()
    summary: str = ""
    full_loader: Callable[[SourceSpec], Loaded] | None = None  # sources that carry more than items


REGISTRY: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> SourceKind:
    """Add a source kind (a second registration under the same name is a programming error)."""
    if kind.name in REGISTRY:
        raise ValueError(f"source kind {kind.name!r} registered twice")
    REGISTRY[kind.name] = kind
    return kind


def kinds() -> tuple[str, ...]:
    """Registered kind names, in registration order (importing the registry registers them all)."""
    import equipoise.builders.sources.registry  # noqa: F401  (registers every bundled kind)

    return tuple(REGISTRY)


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------
class SourceSpec(BaseModel):
    """A parsed ``KIND:LOCATION[@REVISION][?key=value&...]`` source spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(min_length=1)
    location: str = Field(min_length=1)
    revision: str | None = None
    params: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys(self) -> SourceSpec:
        if self.kind not in kinds():
            raise ValueError(f"unknown kind {self.kind!r}; known: {', '.join(kinds())}")
        source_kind = REGISTRY[self.kind]
        allowed = COMMON_KEYS | source_kind.keys
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} for '{self.kind}'; allowed: {sorted(allowed)}")
        if self.params.get("bad_rows", "raise") not in ("raise", "skip"):
            raise ValueError("bad_rows must be 'raise' or 'skip'")
        for key in source_kind.required:
            if not self.params.get(key):
                raise ValueError(f"{self.kind} sources need ?{key}=PATH ({source_kind.summary})")
        return self

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        kind, sep, rest = text.partition(":")
        if not sep or not rest:
            raise SourceError(f"source spec {text!r}: expected KIND:LOCATION[@REVISION][?key=value&...]")
        if kind not in kinds():
            raise SourceError(f"source spec {text!r}: unknown kind {kind!r}; known: {', '.join(kinds())}")
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
            return cls(kind=kind, location=location, revision=revision, params=params)
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
class Part:
    """One split of one config, as rows plus where they came from (for error messages)."""

    split: str
    rows: Any  # datasets.Dataset
    where: str
    config: str | None = None


@dataclass
class Opened:
    parts: list[Part]
    revision: str
    commit: str | None = None
    notes: dict[str, str] = field(default_factory=dict)


class RowError(Exception):
    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field, self.message = field_name, message


def sha256_files(paths: list[Path], root: Path | None = None) -> str:
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


def split_from_name(name: str) -> str | None:
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


def has_configs(folder: Path) -> bool:
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


def root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"


def open_location(
    spec: SourceSpec,
    *,
    config: str | None = None,
    data_glob: str = "*.jsonl",
    name_filter: Callable[[Path], bool] | None = None,
    hub_data_files: Any = None,
    builder_kwargs: dict[str, Any] | None = None,
    header_features: bool = False,
    default_splits: Callable[[list[str]], list[str]] | None = None,
) -> Opened:
    """Open one config of a location; return its selected splits as ``datasets.Dataset`` parts."""
    import datasets

    kw = dict(builder_kwargs or {})
    loc = Path(spec.location)
    wanted = spec.list_param("splits")
    local_files: list[Path] = []
    json_files: list[Path] = []
    if loc.is_file():
        split = wanted[0] if wanted and len(wanted) == 1 else split_from_name(loc.name)
        if split is None:
            raise SourceError(f"{loc}: cannot tell the split from the file name; add ?splits=NAME")
        builder, extra = _builder_for(loc)
        kw = {**extra, **kw}
        local_files = [loc]
        args: dict[str, Any] = {"path": builder, "data_files": {split: [str(loc)]}}
        where_of = {split: str(loc)}
        wanted = [split]
    elif loc.is_dir() and has_configs(loc):
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
            s = split_from_name(p.name)
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
        raise SourceError(f"{label}: datasets could not read it ({root_cause(exc)})") from exc
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
        revision = spec.revision or sha256_files(local_files, root)
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
        parts.append(Part(split=s, rows=builder_obj.as_dataset(split=s), where=where, config=config))
    return Opened(parts=parts, revision=revision, commit=commit, notes=notes)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def iter_rows(ds: Any, batch_size: int = 1024) -> Iterator[dict[str, Any]]:
    for batch in ds.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys), strict=True):
            yield dict(zip(keys, values, strict=True))


def require_columns(part: Part, columns: list[str]) -> None:
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
class Ctx:
    dataset: str
    prefix: str
    split: str
    revision: str
    n: int = 0  # 1-based data row within the split


def text_field(row: dict[str, Any], key: str, label: str | None = None) -> str:
    value = row.get(key)
    name = label or key
    if value is None:
        raise RowError(name, "missing (null)")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(name, f"expected text, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise RowError(name, "empty")
    return text


def opt_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def make_item(
    ctx: Ctx,
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


def letter_gold(letter_value: Any, field_name: str, letters: list[str]) -> int:
    letter = opt_text(letter_value)
    if letter is None:
        raise RowError(field_name, "missing answer")
    letter = letter.upper()
    if letter not in letters:
        raise RowError(field_name, f"answer {letter!r} is not among the options {letters}")
    return letters.index(letter)


class Collector:
    """Maps rows to items, turning every failure into a SourceError (or a counted skip)."""

    def __init__(self, spec: SourceSpec):
        self.skip = spec.params.get("bad_rows", "raise") == "skip"
        self.items: list[MCQItem] = []
        self.seen: dict[str, str] = {}
        self.bad: list[str] = []
        self.skipped_by_design: dict[str, int] = {}

    def run(self, part: Part, ctx: Ctx, fn: Callable[[dict[str, Any], Ctx], MCQItem | None]) -> None:
        for n, row in enumerate(iter_rows(part.rows), start=1):
            ctx.n = n
            where = f"{part.where}: row {n}"
            try:
                item = fn(row, ctx)
            except RowError as exc:
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
