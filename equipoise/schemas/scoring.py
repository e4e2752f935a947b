"""Typed definitions of clinical scoring systems.

A scoring system is *data*: inputs (the raw findings a clinician records), items (how findings turn
into points), optional groups that cap a subtotal, optional clamps on the total, and criteria (named
decisions on the total).  Keeping findings and items apart is what makes determinability exact: a
missing *finding* is what the vignette omits, while one finding may feed several items (sex changes
the haemoglobin band of Glasgow-Blatchford) and one item may read several findings (A-DROP's
"dehydration" is BUN >= 21 mg/dL *or* clinical dehydration).

Definitions live as YAML files under ``equipoise/scoring_systems/definitions``; the loader validates
them with these models and reports the file, the field path and the reason for any error.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from equipoise.schemas.units import Quantity, UnitError, canonical, convert, to_precision

IDENT = r"^[a-z][a-z0-9_]*$"
Ident = Annotated[str, Field(pattern=IDENT)]
Points = float
Label = Literal["Met", "Not met", "Unable to determine"]
DECISION_LABELS: tuple[str, str, str] = ("Met", "Not met", "Unable to determine")


class _Strict(BaseModel):
    """Base for definition records: unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Reference(_Strict):
    """A publication or guideline the definition was checked against.

    ``id`` is the key a cut-off's ``source`` names, so every published number points at the
    paper it was read from.
    """

    id: Ident | None = None
    citation: str = Field(min_length=10)
    year: int = Field(ge=1900, le=2100)
    role: Literal["original", "guideline", "validation", "variant", "review"] = "original"
    doi: str | None = None
    pmid: str | None = None
    url: str | None = None


# ---------------------------------------------------------------------------------------------
# Inputs: what a vignette states (or omits)
# ---------------------------------------------------------------------------------------------
Section = Literal["demographics", "history", "symptoms", "exam", "vitals", "labs", "imaging", "other"]


class _InputBase(_Strict):
    id: Ident
    label: str = Field(min_length=2, description="Human name of the finding, e.g. 'Heart rate'.")
    section: Section = "other"
    demographic: Literal["age", "sex"] | None = Field(
        default=None, description="Age and sex are rendered in the opening phrase of a vignette."
    )


class BinaryInput(_InputBase):
    """A yes/no finding; ``present``/``absent`` are alternative phrasings for vignettes."""

    kind: Literal["binary"] = "binary"
    normal: bool = Field(default=False, description="Value a clinician would assume if unmentioned.")
    present: list[str] = Field(min_length=1)
    absent: list[str] = Field(min_length=1)


class Category(_Strict):
    value: Ident
    label: str
    phrases: list[str] = Field(min_length=1)
    implies_sex: Literal["male", "female"] | None = Field(
        default=None,
        description="A value only one sex can have (ovarian cancer); the vignette then uses that sex.",
    )


class CategoricalInput(_InputBase):
    """A finding with a fixed set of values (e.g. cervical consistency: firm / medium / soft)."""

    kind: Literal["categorical"] = "categorical"
    categories: list[Category] = Field(min_length=2)
    normal: str

    @model_validator(mode="after")
    def _check(self) -> CategoricalInput:
        values = [c.value for c in self.categories]
        if len(set(values)) != len(values):
            raise ValueError(f"duplicate category values in input '{self.id}'")
        if self.normal not in values:
            raise ValueError(f"normal value '{self.normal}' is not one of {values}")
        return self

    def values(self) -> list[str]:
        return [c.value for c in self.categories]


class Rendering(_Strict):
    """How a vignette states the finding in another unit convention (``--units si|us``)."""

    unit: str
    decimals: int = Field(ge=0, le=4)
    phrases: list[str] = Field(min_length=1, description="Templates with '{value}'.")

    @field_validator("phrases")
    @classmethod
    def _placeholders(cls, v: list[str]) -> list[str]:
        for p in v:
            if "{value}" not in p:
                raise ValueError(f"phrase {p!r} has no '{{value}}' placeholder")
        return v


class NumericInput(_InputBase):
    """A measured quantity.

    ``unit`` is what a bare number means; ``min``/``max`` bound the physiologically possible
    values (anything outside is refused). The grid ``min + k * step`` only *generates* cases: the
    engine splits values by the exact published cut-offs, so any value in range, on or off the
    grid, gets its exact answer. ``quantity`` names what is measured, which decides the units a
    finding may also be given in (see `equipoise.schemas.units`).

    ``reported_decimals`` is the reporting precision of ``unit``: the decimals a laboratory
    reports the value with (BUN 1 in mg/dL, creatinine 2). A cut-off published in another unit is
    converted and rounded to it before comparison; a finding given in another unit is compared as
    given with cut-offs published in its unit and as its rounded converted value with the others
    (the rules in `equipoise.schemas.units`). Omitted, it is the decimals of ``step``.
    """

    kind: Literal["numeric"] = "numeric"
    unit: str
    quantity: Quantity | None = None
    min: float
    max: float
    step: float = Field(gt=0)
    reported_decimals: int | None = Field(
        default=None, ge=0, le=4, description="Reporting precision of `unit`; default: step's decimals."
    )
    normal: float
    phrases: list[str] = Field(
        min_length=1, description="Templates with '{value}' (and optionally '{unit}')."
    )
    si: Rendering | None = Field(default=None, description="SI statement when `unit` is not SI.")
    us: Rendering | None = Field(
        default=None, description="US statement when `unit` is not the US convention (e.g. °F)."
    )

    @model_validator(mode="after")
    def _check(self) -> NumericInput:
        if not self.min < self.max:
            raise ValueError(f"min {self.min} must be below max {self.max}")
        if not self.min <= self.normal <= self.max:
            raise ValueError(f"normal {self.normal} outside [{self.min}, {self.max}]")
        for p in self.phrases:
            if "{value}" not in p:
                raise ValueError(f"phrase {p!r} has no '{{value}}' placeholder")
        if self.reported_decimals is not None and self.reported_decimals < self.decimals:
            # a grid value finer than the reporting precision could not be a reported value
            raise ValueError(
                f"reported_decimals {self.reported_decimals} of input '{self.id}' is coarser than "
                f"its step {self.step:g}"
            )
        for name, r in (("si", self.si), ("us", self.us)):
            if r is not None:
                try:
                    convert(1.0, self.unit, r.unit, self.quantity)
                except UnitError as exc:
                    raise ValueError(f"{name} unit of input '{self.id}': {exc}") from None
        return self

    def rendering(self, units: str) -> Rendering | None:
        """The statement for a unit convention, None when the definition's own unit is used."""
        return self.si if units == "si" else self.us if units == "us" else None

    @property
    def precision(self) -> int:
        """Decimals a value in ``unit`` is reported with (converted values are rounded to it)."""
        return self.decimals if self.reported_decimals is None else self.reported_decimals

    @property
    def decimals(self) -> int:
        """Decimals of the case-generation grid (and of a value stated in a vignette)."""
        frac = Fraction(str(self.step))
        d = 0
        while frac.denominator != 1 and d < 6:
            frac *= 10
            d += 1
        return d


Input = Annotated[BinaryInput | CategoricalInput | NumericInput, Field(discriminator="kind")]


# ---------------------------------------------------------------------------------------------
# Conditions: predicates over findings, used by numeric bands and rule items
# ---------------------------------------------------------------------------------------------
class Atom(_Strict):
    """A predicate on one finding. Numeric bounds combine with AND (``ge: 10, lt: 12``)."""

    input: Ident
    eq: bool | str | None = None
    in_: list[str] | None = Field(default=None, alias="in")
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    unit: str | None = Field(default=None, description="Unit the bounds are published in.")
    source: Ident | None = Field(default=None, description="Reference id the bounds were read from.")
    _in_input_unit: tuple[float | None, ...] | None = PrivateAttr(default=None)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @cached_property
    def bounds_in_input_unit(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(ge, gt, le, lt) in the *input's* unit: the published bounds, converted if needed.

        Cached because the plain reference evaluation reads it for every band of every completion.
        """
        c = self._in_input_unit
        return (self.ge, self.gt, self.le, self.lt) if c is None else c  # type: ignore[return-value]

    def bounds(self) -> tuple[float | None, float | None, float | None, float | None]:
        return self.bounds_in_input_unit

    @model_validator(mode="after")
    def _one_kind(self) -> Atom:
        has_eq = self.eq is not None or self.in_ is not None
        has_num = any(v is not None for v in (self.ge, self.gt, self.le, self.lt))
        if has_eq == has_num:
            raise ValueError("an atom needs either eq/in or numeric bounds (ge/gt/le/lt), not both")
        return self


class AnyOf(_Strict):
    any: list[Condition] = Field(min_length=1)


class AllOf(_Strict):
    all: list[Condition] = Field(min_length=1)


class Not(_Strict):
    not_: Condition = Field(alias="not")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Condition = Atom | AnyOf | AllOf | Not
AnyOf.model_rebuild()
AllOf.model_rebuild()
Not.model_rebuild()


class Band(_Strict):
    """One cut-off band of a numeric item: bounds combine with AND; bands must not overlap.

    The bounds are stored exactly as the ``source`` reference publishes them, in ``unit`` (the
    input's unit when omitted); the engine compares in the input's unit via `bounds`.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    points: Points
    unit: str | None = Field(default=None, description="Unit the bounds are published in.")
    source: Ident | None = Field(default=None, description="Reference id the bounds were read from.")
    _in_input_unit: tuple[float | None, ...] | None = PrivateAttr(default=None)

    @cached_property
    def bounds_in_input_unit(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(ge, gt, le, lt) in the *input's* unit: the published bounds, converted if needed.

        Cached because the plain reference evaluation reads it for every band of every completion.
        """
        c = self._in_input_unit
        return (self.ge, self.gt, self.le, self.lt) if c is None else c  # type: ignore[return-value]

    def bounds(self) -> tuple[float | None, float | None, float | None, float | None]:
        return self.bounds_in_input_unit

    def has_bounds(self) -> bool:
        return any(v is not None for v in (self.ge, self.gt, self.le, self.lt))


class Case(_Strict):
    when: Condition
    points: Points


# ---------------------------------------------------------------------------------------------
# Items: how findings become points
# ---------------------------------------------------------------------------------------------
class _ItemBase(_Strict):
    id: Ident
    label: str = Field(min_length=2)
    aliases: list[str] = Field(
        default_factory=list,
        description="Other names used to recognise the item in a model's explanation.",
    )


class BinaryItem(_ItemBase):
    """Points when a binary finding is present (0 when absent)."""

    kind: Literal["binary"] = "binary"
    input: Ident
    points: Points


class CategoricalItem(_ItemBase):
    kind: Literal["categorical"] = "categorical"
    input: Ident
    points: dict[str, Points]


class NumericItem(_ItemBase):
    """Points from cut-off bands of one measurement; a value outside every band scores 0."""

    kind: Literal["numeric"] = "numeric"
    input: Ident
    bands: list[Band] = Field(min_length=1)


class RuleItem(_ItemBase):
    """Points from the first case whose condition holds (else ``default``).

    Used where an item reads several findings (sex-specific cut-offs, 'A or B' criteria).
    """

    kind: Literal["rule"] = "rule"
    cases: list[Case] = Field(min_length=1)
    default: Points = 0


Item = Annotated[BinaryItem | CategoricalItem | NumericItem | RuleItem, Field(discriminator="kind")]


class Group(_Strict):
    """Items whose subtotal is capped (e.g. 'at most 2 points from this section')."""

    id: Ident
    items: list[Ident] = Field(min_length=2)
    max_points: Points | None = None
    min_points: Points | None = None


# ---------------------------------------------------------------------------------------------
# Criteria: named decisions on the total
# ---------------------------------------------------------------------------------------------
class Criterion(_Strict):
    """A decision on the total, e.g. CHADS2 total >= 2 -> 'high stroke risk'.

    ``question`` is the phrase a decision prompt asks about: "meets the criteria for high stroke
    risk". Intervals use ``ge/gt/le/lt`` (combined with AND), so 'CURB-65 of exactly 2' is
    ``{ge: 2, le: 2}``.
    """

    id: Ident
    label: str
    question: str = Field(min_length=5)
    ge: Points | None = None
    gt: Points | None = None
    le: Points | None = None
    lt: Points | None = None
    primary: bool = Field(default=False, description="The system's headline decision.")
    source: Ident | None = Field(default=None, description="Reference id of the threshold.")

    @model_validator(mode="after")
    def _bounded(self) -> Criterion:
        if all(v is None for v in (self.ge, self.gt, self.le, self.lt)):
            raise ValueError(f"criterion '{self.id}' needs at least one bound (ge/gt/le/lt)")
        return self

    def holds(self, total: float) -> bool:
        return (
            (self.ge is None or total >= self.ge)
            and (self.gt is None or total > self.gt)
            and (self.le is None or total <= self.le)
            and (self.lt is None or total < self.lt)
        )

    def describe(self) -> str:
        parts = []
        for sym, v in (("≥", self.ge), (">", self.gt), ("≤", self.le), ("<", self.lt)):
            if v is not None:
                parts.append(f"{sym} {_fmt(v)}")
        if self.ge is not None and self.le is not None and self.ge == self.le:
            return f"total = {_fmt(self.ge)}"
        return "total " + " and ".join(parts)


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


class PublishedExample(_Strict):
    """A worked example written from the publication's point table, checked by the tests."""

    description: str
    findings: dict[str, bool | str | float | dict[str, float | str]]
    total: Points | None = Field(default=None, description="Expected total when complete.")
    total_min: Points | None = None
    total_max: Points | None = None
    expected: dict[str, Label] = Field(default_factory=dict)


class Vignette(_Strict):
    """How a case opens: who the patient is and why they are being seen."""

    subject: Literal["adult", "newborn", "pregnant", "child"] = "adult"
    presentations: list[str] = Field(
        min_length=1, description="Sentences on the presenting problem, e.g. 'was found to have ...'."
    )
    distractors: list[str] = Field(
        default_factory=list, description="System-specific findings that score nothing."
    )


class ScoringSystem(_Strict):
    """A full scoring system definition (one YAML file)."""

    id: Ident
    name: str
    version: str = "1"
    variant_of: Ident | None = None
    target_condition: str
    summary: str = Field(min_length=20)
    references: list[Reference] = Field(min_length=1)
    inputs: list[Input] = Field(min_length=1)
    items: list[Item] = Field(min_length=1)
    groups: list[Group] = Field(default_factory=list)
    total_min: Points | None = None
    total_max: Points | None = None
    criteria: list[Criterion] = Field(min_length=1)
    vignette: Vignette
    examples: list[PublishedExample] = Field(default_factory=list)
    notes: str | None = Field(default=None, description="Where sources disagree and what was chosen.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.search(r"[A-Za-z]", v):
            raise ValueError("name must contain letters")
        return v

    @model_validator(mode="after")
    def _references_resolve(self) -> ScoringSystem:
        input_ids = [i.id for i in self.inputs]
        item_ids = [i.id for i in self.items]
        for kind, ids in (("input", input_ids), ("item", item_ids)):
            dup = {x for x in ids if ids.count(x) > 1}
            if dup:
                raise ValueError(f"duplicate {kind} ids: {sorted(dup)}")
        inputs = {i.id: i for i in self.inputs}
        used: set[str] = set()
        for item in self.items:
            for atom_input, atom in _item_atoms(item):
                if atom_input not in inputs:
                    raise ValueError(f"item '{item.id}' reads unknown input '{atom_input}'")
                used.add(atom_input)
                _check_atom_type(item.id, inputs[atom_input], atom)
            if isinstance(item, BinaryItem) and inputs[item.input].kind != "binary":
                raise ValueError(f"binary item '{item.id}' reads non-binary input '{item.input}'")
            if isinstance(item, NumericItem) and inputs[item.input].kind != "numeric":
                raise ValueError(f"numeric item '{item.id}' reads non-numeric input '{item.input}'")
            if isinstance(item, CategoricalItem):
                inp = inputs[item.input]
                if not isinstance(inp, CategoricalInput):
                    raise ValueError(f"categorical item '{item.id}' reads '{item.input}'")
                if set(item.points) != set(inp.values()):
                    raise ValueError(
                        f"item '{item.id}' must give points for exactly {inp.values()}, "
                        f"got {sorted(item.points)}"
                    )
        unused = [i for i in input_ids if i not in used]
        if unused:
            raise ValueError(f"inputs not read by any item: {unused}")
        grouped: list[str] = []
        for g in self.groups:
            for it in g.items:
                if it not in item_ids:
                    raise ValueError(f"group '{g.id}' names unknown item '{it}'")
            grouped.extend(g.items)
        if len(grouped) != len(set(grouped)):
            raise ValueError("an item belongs to more than one group")
        crit_ids = [c.id for c in self.criteria]
        if len(crit_ids) != len(set(crit_ids)):
            raise ValueError("duplicate criterion ids")
        _resolve_sources_and_units(self, inputs)
        for ex in self.examples:
            for k in ex.findings:
                if k not in inputs:
                    raise ValueError(f"example {ex.description!r} names unknown input '{k}'")
            for k in ex.expected:
                if k not in crit_ids:
                    raise ValueError(f"example {ex.description!r} names unknown criterion '{k}'")
        return self

    def input(self, input_id: str) -> BinaryInput | CategoricalInput | NumericInput:
        for i in self.inputs:
            if i.id == input_id:
                return i
        raise KeyError(input_id)

    def criterion(self, criterion_id: str) -> Criterion:
        for c in self.criteria:
            if c.id == criterion_id:
                return c
        raise KeyError(criterion_id)

    @property
    def primary_criterion(self) -> Criterion:
        for c in self.criteria:
            if c.primary:
                return c
        return self.criteria[0]


def _item_atoms(item: BinaryItem | CategoricalItem | NumericItem | RuleItem) -> list[tuple[str, Atom | None]]:
    if isinstance(item, RuleItem):
        out: list[tuple[str, Atom | None]] = []
        for case in item.cases:
            out.extend((a.input, a) for a in iter_atoms(case.when))
        return out
    return [(item.input, None)]


def iter_atoms(cond: Condition) -> list[Atom]:
    """All atoms of a condition tree, depth first."""
    if isinstance(cond, Atom):
        return [cond]
    if isinstance(cond, AnyOf):
        return [a for c in cond.any for a in iter_atoms(c)]
    if isinstance(cond, AllOf):
        return [a for c in cond.all for a in iter_atoms(c)]
    return iter_atoms(cond.not_)


def _check_atom_type(
    item_id: str, inp: BinaryInput | CategoricalInput | NumericInput, atom: Atom | None
) -> None:
    if atom is None:
        return
    numeric = any(v is not None for v in (atom.ge, atom.gt, atom.le, atom.lt))
    if isinstance(inp, NumericInput) and not numeric:
        raise ValueError(f"item '{item_id}': numeric input '{inp.id}' needs ge/gt/le/lt bounds")
    if isinstance(inp, BinaryInput) and (numeric or not isinstance(atom.eq, bool)):
        raise ValueError(f"item '{item_id}': binary input '{inp.id}' needs eq: true|false")
    if isinstance(inp, CategoricalInput):
        vals = [atom.eq] if atom.eq is not None else list(atom.in_ or [])
        if numeric or any(not isinstance(v, str) or v not in inp.values() for v in vals):
            raise ValueError(
                f"item '{item_id}': categorical input '{inp.id}' needs eq/in among {inp.values()}"
            )


def numeric_bound_holders(
    system: ScoringSystem,
) -> list[tuple[str, Band | Atom | Criterion]]:
    """Every published numeric cut-off of a system with where it sits (for the source audit)."""
    out: list[tuple[str, Band | Atom | Criterion]] = []
    for item in system.items:
        if isinstance(item, NumericItem):
            out.extend((f"items.{item.id}.bands.{k}", b) for k, b in enumerate(item.bands) if b.has_bounds())
        elif isinstance(item, RuleItem):
            for k, case in enumerate(item.cases):
                for a in iter_atoms(case.when):
                    if a.eq is None and a.in_ is None:
                        out.append((f"items.{item.id}.cases.{k}.{a.input}", a))
    out.extend((f"criteria.{c.id}", c) for c in system.criteria)
    return out


def published_cutoffs(system: ScoringSystem) -> list[tuple[str, str, str, str, str]]:
    """(where, bounds, unit, compared as, source) of every numeric cut-off.

    ``bounds`` and ``unit`` are as the source publishes them; ``compared as`` is the value the
    engine compares a finding with, in the finding's unit, when the publication's unit differs
    (converted with the true molar mass and rounded to the finding's reporting precision), else
    ``=``.
    """
    items = {i.id: i for i in system.items}
    rows: list[tuple[str, str, str, str, str]] = []
    for where, h in numeric_bound_holders(system):
        ops = ("≥", ">", "≤", "<")
        published = (h.ge, h.gt, h.le, h.lt)
        compared = "="
        if isinstance(h, Criterion):
            unit = "points"
        else:
            if isinstance(h, Atom):
                inp = system.input(h.input)
            else:
                item = items[where.split(".")[1]]
                assert isinstance(item, NumericItem)
                inp = system.input(item.input)
            assert isinstance(inp, NumericInput)
            unit = h.unit or inp.unit
            if h.unit is not None and canonical(h.unit) != canonical(inp.unit):
                conv = h.bounds()
                compared = (
                    " and ".join(
                        f"{op} {v:.{inp.precision}f}"
                        for op, v in zip(ops, conv, strict=True)
                        if v is not None
                    )
                    + f" {inp.unit}"
                )
        rows.append(
            (
                where,
                " and ".join(f"{op} {v:g}" for op, v in zip(ops, published, strict=True) if v is not None),
                unit,
                compared,
                h.source or "-",
            )
        )
    return rows


def _resolve_sources_and_units(system: ScoringSystem, inputs: dict[str, Any]) -> None:
    """Check every ``source`` names a reference and convert published bounds to the input unit.

    A bound published in another unit is compared as its value converted with the true molar mass
    and rounded to the input's reporting precision (`NumericInput.precision`; the rule and its
    caveat are in `equipoise.schemas.units`): 200 umol/L creatinine is compared as 2.26 mg/dL.
    The conversion is done once here so that the engine and the plain reference evaluation read
    the same numbers; the stored fields keep the published value and unit untouched.
    """
    ref_ids = {r.id for r in system.references if r.id is not None}
    for where, holder in numeric_bound_holders(system):
        if holder.source is not None and holder.source not in ref_ids:
            raise ValueError(f"{where}: source '{holder.source}' is not a reference id {sorted(ref_ids)}")
    for item in system.items:
        holders: list[tuple[str, Band | Atom]] = []
        if isinstance(item, NumericItem):
            holders = [(item.input, b) for b in item.bands]
        elif isinstance(item, RuleItem):
            holders = [(a.input, a) for case in item.cases for a in iter_atoms(case.when)]
        for input_id, h in holders:
            if h.unit is None:
                continue
            inp = inputs[input_id]
            if not isinstance(inp, NumericInput):
                raise ValueError(f"item '{item.id}': unit '{h.unit}' on non-numeric input '{input_id}'")
            if canonical(h.unit) == canonical(inp.unit):
                continue
            h.__dict__.pop("bounds_in_input_unit", None)  # never keep bounds cached before conversion
            try:
                h._in_input_unit = tuple(
                    None
                    if v is None
                    else to_precision(convert(v, h.unit, inp.unit, inp.quantity), inp.precision)
                    for v in (h.ge, h.gt, h.le, h.lt)
                )
            except UnitError as exc:
                raise ValueError(f"item '{item.id}': cut-off of input '{input_id}': {exc}") from None
