"""Generic: any MCQA table described by a small YAML / JSON column mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    Part,
    RowError,
    SourceKind,
    SourceSpec,
    has_configs,
    letter_gold,
    make_item,
    open_location,
    opt_text,
    register,
    require_columns,
    sha256_files,
    text_field,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import LETTERS, QUESTION_TYPES, ItemMetadata, MCQItem


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
            text = opt_text(row.get(c))
            if text is None:
                raise RowError(c, "missing or empty option")
            opts.append((i, text))
        return opts, list(LETTERS[: len(opts)])
    assert m.options_column is not None
    raw = row.get(m.options_column)
    if isinstance(raw, list) and raw and isinstance(raw[0], dict):
        try:
            raw = {d["key"]: d["value"] for d in raw}
        except KeyError as exc:
            raise RowError(m.options_column, "list items must be {key, value} records") from exc
    if isinstance(raw, dict):
        items = [(k, v) for k, v in raw.items() if v is not None]
        keys = [k for k, _ in items]
        if keys != list(LETTERS[: len(keys)]):
            raise RowError(m.options_column, f"option keys {keys} are not A, B, C, ... in order")
        texts = [opt_text(v) for _, v in items]
    elif isinstance(raw, list):
        keys, texts = list(LETTERS[: len(raw)]), [opt_text(v) for v in raw]
    else:
        raise RowError(m.options_column, f"expected a list or mapping of options, got {type(raw).__name__}")
    for k, t in zip(keys, texts, strict=True):
        if t is None:
            raise RowError(f"{m.options_column}.{k}", "missing or empty option")
    return [(i, t) for i, t in enumerate(texts) if t is not None], keys


def generic_row(row: dict[str, Any], ctx: Ctx, m: GenericMapping) -> MCQItem:
    question = text_field(row, m.question)
    options, letters = _generic_options(row, m)
    value = row.get(m.answer)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowError(m.answer, "missing answer")
    if m.answer_format == "letter":
        gold = letter_gold(value, m.answer, letters)
    elif m.answer_format == "text":
        matches = [k for k, (_, t) in enumerate(options) if t == str(value).strip()]
        if len(matches) != 1:
            raise RowError(m.answer, f"answer text {value!r} matches {len(matches)} options (need exactly 1)")
        gold = matches[0]
    else:
        try:
            index = int(value)
        except (TypeError, ValueError) as exc:
            raise RowError(m.answer, f"expected an integer index, got {value!r}") from exc
        gold = index - (1 if m.answer_format == "index1" else 0)
        if not 0 <= gold < len(options):
            raise RowError(
                m.answer, f"index {index} is out of range for {len(options)} options ({m.answer_format})"
            )
    qtype = opt_text(row.get(m.question_type)) if m.question_type else None
    if qtype is not None and qtype not in QUESTION_TYPES:
        raise RowError(m.question_type or "", f"{qtype!r} is not one of {list(QUESTION_TYPES)}")
    source_id = text_field(row, m.id) if m.id else f"{ctx.split}-{ctx.n:06d}"
    item_id = f"{m.name}-{source_id}" if m.id else f"{m.name}-{ctx.split}-{ctx.n:06d}"
    meta = ItemMetadata(
        specialty=opt_text(row.get(m.specialty)) if m.specialty else None,
        imaging_modality=opt_text(row.get(m.imaging_modality)) if m.imaging_modality else None,
        difficulty=opt_text(row.get(m.difficulty)) if m.difficulty else None,
        question_type=qtype,  # type: ignore[arg-type]
    )
    image = opt_text(row.get(m.image)) if m.image else None
    return make_item(
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
    if is_csv or (loc.is_dir() and not has_configs(loc) and any(loc.glob("*.[ct]sv"))):
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
    opened = open_location(
        spec, config=spec.params.get("config") or m.config, data_glob=glob, builder_kwargs=kw
    )
    col = Collector(spec)
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
        require_columns(part, needed)
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
            sub = Part(
                split=split,
                rows=rows,
                where=part.where if not m.split_column else f"{part.where} ({m.split_column}={split})",
            )
            ctx = Ctx(dataset=m.name, prefix=m.name, split=split, revision=opened.revision)
            col.run(sub, ctx, lambda r, c: generic_row(r, c, m))
    mapping_rev = sha256_files([mpath])
    return col.items, col.record(
        m.name, opened.revision, spec, mapping=f"{mpath} ({mapping_rev})", **opened.notes
    )


register(
    SourceKind(
        "generic",
        _load_generic,
        frozenset({"mapping"}),
        required=("mapping",),
        summary="a YAML or JSON column mapping",
    )
)
