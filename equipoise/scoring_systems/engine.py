"""The determinability engine: exact reachable totals of a scoring system under missing findings.

Why it is exact
---------------
Every finding has finitely many *classes*: binary findings have two, categorical ones one per value,
and a numeric finding's range ``[min, max]`` is cut by every band bound and condition bound that
mentions it (the published cut-offs, converted exactly into the finding's unit) into points and open
intervals on which every item behaves the same (`Partition`). The classes are real-valued: any
value in range, on the case-generation grid ``min + k*step`` or not, falls in exactly one, so the
grid never moves a cut-off. Any completion of the missing findings is therefore equivalent, for
every item, to a choice of one class per missing finding. Items (or capped groups of items) that
read disjoint sets of missing findings vary independently, so the engine enumerates the class
product *within* each cluster of items linked by a shared missing finding, and combines clusters by
an exact sumset convolution that also counts completions and keeps a witness completion for every
reachable total.

Points are scaled to integers (e.g. Wells PE's 1.5 becomes 3 half-points) so the arithmetic is exact.

Why it is fast
--------------
Labelling many partial cases of one system repeats the same work, so a compiled system keeps
bounded memo caches (see `_FastPath`): the clustering of each missing set, each cluster's sub-total
distribution per context of known classes it reads, and the clusters' summed distribution per
missing set and contexts. Known inputs outside the clusters only add a constant, which shifts a
cached distribution without changing its counts or witnesses. Every cached value is a pure
function of its key and is computed in the same order as the plain enumeration, so results,
witnesses included, are exactly those of the uncached algorithm.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from equipoise.schemas.scoring import (
    AllOf,
    AnyOf,
    Atom,
    Band,
    BinaryInput,
    BinaryItem,
    CategoricalInput,
    CategoricalItem,
    Condition,
    Not,
    NumericInput,
    NumericItem,
    RuleItem,
    ScoringSystem,
    iter_atoms,
)
from equipoise.schemas.units import UnitError, canonical, convert, parse_value, to_precision


class Measured(float):
    """A numeric finding given in a unit other than its definition's (``"6.49 mmol/L"`` for BUN).

    Why a float subclass: everywhere a value is shown, range-checked or used as a class
    representative it *is* the finding in the definition's unit, converted with the true molar
    mass and rounded to the reporting precision (6.49 mmol/L -> 18.2 mg/dL). Only the comparison
    with a cut-off differs: a cut-off published in the unit the finding was given in is compared
    with the value *as given* (6.49 < 6.5 mmol/L, so no Blatchford points, although 18.2 mg/dL is
    the US table's cut-off), so a finding stated in the publication's own unit gets the
    publication's exact answer. ``given`` and ``unit`` (canonical spelling) keep what was stated.
    """

    __slots__ = ("given", "unit")
    given: float
    unit: str

    def __new__(cls, value: float, given: float, unit: str) -> Measured:
        obj = super().__new__(cls, value)
        obj.given = float(given)
        obj.unit = canonical(unit)
        return obj

    def __getnewargs__(self) -> tuple[float, float, str]:  # type: ignore[override]
        return (float(self), self.given, self.unit)

    def __repr__(self) -> str:
        return f"Measured({float(self)!r}, given={self.given!r}, unit={self.unit!r})"

    def stated(self) -> str:
        """The finding as given, e.g. ``'6.49 mmol/L'`` (what `evaluate` reads back identically)."""
        return f"{self.given:g} {self.unit}"


Value = bool | str | float


class FindingError(ValueError):
    """Bad findings for a system: the message names the finding and the reason (one line)."""


# ---------------------------------------------------------------------------------------------
# Plain evaluation of conditions on raw values (also the reference the tests trust)
# ---------------------------------------------------------------------------------------------
def _bounds_hold(x: float, ge: float | None, gt: float | None, le: float | None, lt: float | None) -> bool:
    return (
        (ge is None or x >= ge)
        and (gt is None or x > gt)
        and (le is None or x <= le)
        and (lt is None or x < lt)
    )


def _holder_holds(h: Band | Atom, x: Value) -> bool:
    """Whether a numeric value satisfies the bounds of a band or atom.

    A `Measured` finding given in the unit the bounds are published in is compared as given with
    the published numbers; any other value is compared in the input's unit with the bounds as
    converted there (`Band.bounds`: converted and rounded to the reporting precision).
    """
    if isinstance(x, Measured) and h.unit is not None and canonical(h.unit) == x.unit:
        return _bounds_hold(x.given, h.ge, h.gt, h.le, h.lt)
    return _bounds_hold(float(x), *h.bounds())


def condition_holds(cond: Condition, values: Mapping[str, Value]) -> bool:
    """Evaluate a condition tree on complete raw values."""
    if isinstance(cond, Atom):
        v = values[cond.input]
        if cond.eq is not None:
            return v == cond.eq
        if cond.in_ is not None:
            return v in cond.in_
        return _holder_holds(cond, v)
    if isinstance(cond, AnyOf):
        return any(condition_holds(c, values) for c in cond.any)
    if isinstance(cond, AllOf):
        return all(condition_holds(c, values) for c in cond.all)
    assert isinstance(cond, Not)
    return not condition_holds(cond.not_, values)


def _band_holds(band: Band, x: Value) -> bool:
    return _holder_holds(band, x)


def item_points(item: Any, values: Mapping[str, Value]) -> float:
    """Points of one item from complete raw values (unscaled)."""
    if isinstance(item, BinaryItem):
        return item.points if values[item.input] is True else 0
    if isinstance(item, CategoricalItem):
        return item.points[str(values[item.input])]
    if isinstance(item, NumericItem):
        x = values[item.input]
        for band in item.bands:
            if _band_holds(band, x):
                return band.points
        return 0
    assert isinstance(item, RuleItem)
    for case in item.cases:
        if condition_holds(case.when, values):
            return case.points
    return item.default


def score_values(system: ScoringSystem, values: Mapping[str, Value]) -> float:
    """Total score of a *complete* set of findings, straight from the definition.

    This is deliberately the naive path (no classes, no scaling): the tests compare the engine's
    reachable sets against this function applied to every completion.
    """
    pts = {it.id: item_points(it, values) for it in system.items}
    total = 0.0
    grouped: set[str] = set()
    for g in system.groups:
        sub = sum(pts[i] for i in g.items)
        if g.max_points is not None:
            sub = min(sub, g.max_points)
        if g.min_points is not None:
            sub = max(sub, g.min_points)
        total += sub
        grouped.update(g.items)
    total += sum(p for i, p in pts.items() if i not in grouped)
    if system.total_max is not None:
        total = min(total, system.total_max)
    if system.total_min is not None:
        total = max(total, system.total_min)
    return total


# ---------------------------------------------------------------------------------------------
# Finding validation
# ---------------------------------------------------------------------------------------------
def normalize_findings(system: ScoringSystem, findings: Mapping[str, Any]) -> dict[str, Value]:
    """Check names, types and ranges; drop explicit ``None`` (= missing). Raises FindingError."""
    out: dict[str, Value] = {}
    known = {i.id: i for i in system.inputs}
    for key, raw in findings.items():
        if key not in known:
            raise FindingError(
                f"unknown finding '{key}' for {system.name}; expected one of: {', '.join(known)}"
            )
        if raw is None:
            continue
        inp = known[key]
        if isinstance(inp, BinaryInput):
            if not isinstance(raw, bool):
                raise FindingError(f"finding '{key}' must be true or false, got {raw!r}")
            out[key] = raw
        elif isinstance(inp, CategoricalInput):
            if not isinstance(raw, str) or raw not in inp.values():
                raise FindingError(f"finding '{key}' must be one of {inp.values()}, got {raw!r}")
            out[key] = raw
        else:
            assert isinstance(inp, NumericInput)
            out[key] = numeric_finding(inp, raw)
    return out


def numeric_finding(inp: NumericInput, raw: Any) -> float:
    """A numeric finding in the input's unit: a number, ``"6.5 mmol/L"`` or ``{value, unit}``.

    A bare number (or one in the input's own unit) is taken as given. A value given in another
    unit becomes a `Measured`: its value in the input's unit (converted with the true molar mass
    and rounded to the reporting precision, ``"200 umol/L"`` -> 2.26 mg/dL), which remembers the
    value and unit as given, so cut-offs published in that unit compare it exactly (see
    `equipoise.schemas.units`). Refuses (FindingError naming the finding) an unknown or
    incompatible unit, a non-finite value and a value outside the input's physiologically
    possible range ``min..max``.
    """
    key = inp.id
    try:
        x, unit = parse_value(raw)
    except UnitError:
        raise FindingError(
            f"finding '{key}' must be a number in {inp.unit}, or a number with its unit "
            f"(e.g. '{_fmt(inp.normal)} {inp.unit}'), got {raw!r}"
        ) from None
    as_given = x
    other_unit = unit if unit is not None and canonical(unit) != canonical(inp.unit) else None
    if other_unit is not None:
        try:
            x = to_precision(convert(x, other_unit, inp.unit, inp.quantity), inp.precision)
        except UnitError as exc:
            raise FindingError(f"finding '{key}' ({inp.label}, {inp.unit}): {exc}") from None
    if not math.isfinite(x):
        raise FindingError(f"finding '{key}' must be finite, got {raw!r}")
    if not inp.min <= x <= inp.max:
        given = f" (given {raw!r})" if not isinstance(raw, int | float) else ""
        raise FindingError(
            f"finding '{key}' = {_fmt(x)} {inp.unit}{given} is outside the possible range "
            f"{_fmt(inp.min)}..{_fmt(inp.max)} {inp.unit}"
        )
    return x if other_unit is None else Measured(x, as_given, other_unit)


# ---------------------------------------------------------------------------------------------
# Compilation: classes per input, integer point tables per unit
# ---------------------------------------------------------------------------------------------
def _numeric_cuts(system: ScoringSystem, input_id: str) -> list[float]:
    cuts: set[float] = set()
    for item in system.items:
        bounds: list[Any] = []
        if isinstance(item, NumericItem) and item.input == input_id:
            bounds.extend(item.bands)
        if isinstance(item, RuleItem):
            bounds.extend(a for c in item.cases for a in iter_atoms(c.when) if a.input == input_id)
        for b in bounds:
            for v in b.bounds():
                if v is not None:
                    cuts.add(float(v))
    return sorted(cuts)


def grid_value(inp: NumericInput, k: int) -> float:
    return round(inp.min + k * inp.step, inp.decimals)


def grid_size(inp: NumericInput) -> int:
    return round((inp.max - inp.min) / inp.step) + 1


def numeric_signature(system: ScoringSystem, input_id: str, x: float) -> tuple[bool, ...]:
    """Truth of every bound that mentions this input: values with equal signatures score alike."""
    sig: list[bool] = []
    for item in system.items:
        if isinstance(item, NumericItem) and item.input == input_id:
            sig.extend(_band_holds(b, x) for b in item.bands)
        if isinstance(item, RuleItem):
            for case in item.cases:
                for a in iter_atoms(case.when):
                    if a.input == input_id:
                        sig.append(_holder_holds(a, x))
    return tuple(sig)


@dataclass(frozen=True)
class Partition:
    """The exact split of a numeric input's range ``[min, max]`` by the published cut-offs.

    ``points`` are the cut-offs inside the range plus both ends, sorted; the pieces are each point
    and each open interval between neighbours. ``at[j]`` is the class of ``points[j]`` and
    ``between[j]`` the class of the open interval ``(points[j], points[j+1])``. Every item reads
    the input only through bounds, so a bound's truth (the signature) is constant on a piece; the
    class of *any* value in range, on the grid or not, is found by bisection.
    """

    points: list[float]
    at: list[int]
    between: list[int]
    # signature (truth of every bound, `numeric_signature` order) -> class: how a `Measured`
    # finding, whose truth pattern is not read off the line of input-unit values, finds its class
    signatures: dict[tuple[bool, ...], int] = field(default_factory=dict, compare=False, hash=False)

    def class_of(self, x: float) -> int:
        j = bisect.bisect_left(self.points, x)
        if j < len(self.points) and self.points[j] == x:
            return self.at[j]
        return self.between[j - 1]


def _grid_run(inp: NumericInput, lo: float, hi: float, lo_open: bool, hi_open: bool) -> tuple[int, int]:
    """Grid indices (first, last) of the grid values in the piece; first > last when none."""
    n = grid_size(inp)

    def inside_lo(k: int) -> bool:
        g = grid_value(inp, k)
        return g > lo if lo_open else g >= lo

    def inside_hi(k: int) -> bool:
        g = grid_value(inp, k)
        return g < hi if hi_open else g <= hi

    k = min(max(math.floor((lo - inp.min) / inp.step), 0), n - 1)
    while k > 0 and inside_lo(k - 1):
        k -= 1
    while k < n and not inside_lo(k):
        k += 1
    m = min(max(math.ceil((hi - inp.min) / inp.step), 0), n - 1)
    while m < n - 1 and inside_hi(m + 1):
        m += 1
    while m >= 0 and not inside_hi(m):
        m -= 1
    return k, m


def numeric_partition(
    system: ScoringSystem, inp: NumericInput
) -> tuple[Partition, list[float], list[list[tuple[float, float]]]]:
    """Exact classes of a numeric input: the partition, one representative per class, and per
    class its runs of grid values ``[(low, high)]`` (what case generation samples from).

    Pieces with equal signatures form one class (e.g. both sides of a two-sided band). The
    representative is the middle grid value of the class's first grid run; a class without any
    grid value (refused by `check_definition` for bundled systems) is represented by an exact
    value of its first piece.
    """
    cuts = sorted({c for c in _numeric_cuts(system, inp.id) if inp.min < c < inp.max})
    points = [float(inp.min), *cuts, float(inp.max)]
    sig_class: dict[tuple[bool, ...], int] = {}
    exact_rep: list[float] = []
    pieces: list[tuple[int, float, float, bool, bool]] = []  # (class, lo, hi, lo_open, hi_open)

    def classify(x: float) -> int:
        sig = numeric_signature(system, inp.id, x)
        c = sig_class.get(sig)
        if c is None:
            c = sig_class[sig] = len(sig_class)
            exact_rep.append(x)
        return c

    at: list[int] = []
    between: list[int] = []
    for j, p in enumerate(points):
        c = classify(p)
        at.append(c)
        pieces.append((c, p, p, False, False))
        if j + 1 < len(points):
            q = points[j + 1]
            mid = p + (q - p) / 2
            c = classify(mid)
            between.append(c)
            pieces.append((c, p, q, True, True))
    runs: list[list[tuple[int, int]]] = [[] for _ in sig_class]
    last: tuple[int, int] | None = None  # (class, last grid index) of the previous run
    for c, lo, hi, lo_open, hi_open in pieces:
        k, m = _grid_run(inp, lo, hi, lo_open, hi_open)
        if k > m:
            continue
        if last is not None and last[0] == c and runs[c] and runs[c][-1][1] == k - 1:
            runs[c][-1] = (runs[c][-1][0], m)
        else:
            runs[c].append((k, m))
        last = (c, m)
    reps: list[float] = []
    segments: list[list[tuple[float, float]]] = []
    for c, rs in enumerate(runs):
        if rs:
            a, b = rs[0]
            reps.append(grid_value(inp, (a + b) // 2))
        else:
            reps.append(exact_rep[c])
        segments.append([(grid_value(inp, a), grid_value(inp, b)) for a, b in rs])
    return Partition(points, at, between, dict(sig_class)), reps, segments


def numeric_classes(
    system: ScoringSystem, inp: NumericInput
) -> list[tuple[float, list[tuple[float, float]]]]:
    """Classes of a numeric input: (representative, [(low, high) grid runs]) per class."""
    _, reps, segs = numeric_partition(system, inp)
    return list(zip(reps, segs, strict=True))


def _scale_of(system: ScoringSystem) -> int:
    pts: list[float] = []
    for it in system.items:
        if isinstance(it, BinaryItem):
            pts.append(it.points)
        elif isinstance(it, CategoricalItem):
            pts.extend(it.points.values())
        elif isinstance(it, NumericItem):
            pts.extend(b.points for b in it.bands)
        else:
            pts.extend(c.points for c in it.cases)
            pts.append(it.default)
    for g in system.groups:
        pts.extend(p for p in (g.max_points, g.min_points) if p is not None)
    pts.extend(p for p in (system.total_min, system.total_max) if p is not None)
    for c in system.criteria:
        pts.extend(p for p in (c.ge, c.gt, c.le, c.lt) if p is not None)
    scale = 1
    for p in pts:
        d = Fraction(str(p)).limit_denominator(1000).denominator
        scale = scale * d // math.gcd(scale, d)
    return scale


@dataclass(frozen=True)
class Unit:
    """A scored unit: one ungrouped item, or a capped group of items (capping couples them)."""

    id: str
    inputs: tuple[str, ...]
    table: dict[tuple[int, ...], int]  # class indices of `inputs` -> scaled points


@dataclass
class CompiledSystem:
    system: ScoringSystem
    scale: int
    input_ids: list[str]
    classes: dict[str, list[Value]]  # representative value per class
    class_ranges: dict[str, list[list[tuple[float, float]]]]  # numeric: grid runs per class
    units: list[Unit]
    units_by_input: dict[str, list[int]] = field(default_factory=dict)
    # numeric input -> its exact split by the published cut-offs (class of any value in range)
    partitions: dict[str, Partition] = field(default_factory=dict)
    # criterion id -> (lowest, highest) scaled total that meets it (None = unbounded)
    criterion_bounds: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # positional tables and bounded memo caches behind `evaluate` / `reachable_scaled` (private)
    _fast: _FastPath = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for crit in self.system.criteria:
            los = [
                x
                for x in (_opt_scaled(crit.ge, self.scale, 0), _opt_scaled(crit.gt, self.scale, 1))
                if x is not None
            ]
            his = [
                x
                for x in (_opt_scaled(crit.le, self.scale, 0), _opt_scaled(crit.lt, self.scale, -1))
                if x is not None
            ]
            self.criterion_bounds[crit.id] = (max(los) if los else None, min(his) if his else None)
        self._fast = _FastPath(self)

    def class_of(self, input_id: str, value: Value) -> int:
        part = self.partitions.get(input_id)
        if part is not None:
            if value.__class__ is Measured:
                return self.measured_class(input_id, value)  # type: ignore[arg-type]
            return part.class_of(float(value))
        return self.classes[input_id].index(value)

    def measured_class(self, input_id: str, value: Measured) -> int:
        """The class of a finding given in another unit, from the truth of every bound.

        Bounds published in the unit it was given in compare the value as given, the others its
        value in the input's unit, so the truth pattern may be one no input-unit value has (none
        of the bundled systems allows it: two cut-offs would have to cross when rounded). That is
        refused, never mapped to a nearby class.
        """
        sig = numeric_signature(self.system, input_id, value)
        c = self.partitions[input_id].signatures.get(sig)
        if c is None:
            inp = self.system.input(input_id)
            raise FindingError(
                f"finding '{input_id}' = {value.stated()}: its comparison with the published cut-offs "
                f"matches no value in {getattr(inp, 'unit', '')}; give it in "
                f"{getattr(inp, 'unit', 'the definition unit')}"
            )
        return c

    def to_scaled(self, points: float) -> int:
        return round(points * self.scale)

    def from_scaled(self, s: int) -> float:
        v = s / self.scale
        return float(int(v)) if float(v).is_integer() else v


def _opt_scaled(v: float | None, scale: int, shift: int) -> int | None:
    """Scaled integer bound: ``gt x`` on integer totals is ``>= x*scale + 1`` (shift 1)."""
    return None if v is None else round(v * scale) + shift


def _input_classes(
    system: ScoringSystem, inp: Any
) -> tuple[list[Value], list[list[tuple[float, float]]], Partition | None]:
    if isinstance(inp, BinaryInput):
        return [False, True], [], None
    if isinstance(inp, CategoricalInput):
        return list(inp.values()), [], None
    part, reps, segs = numeric_partition(system, inp)
    return list(reps), segs, part


def _item_inputs(item: Any) -> list[str]:
    if isinstance(item, RuleItem):
        seen: list[str] = []
        for case in item.cases:
            for a in iter_atoms(case.when):
                if a.input not in seen:
                    seen.append(a.input)
        return seen
    return [item.input]


_COMPILED: dict[int, tuple[ScoringSystem, CompiledSystem]] = {}


def compile_system(system: ScoringSystem) -> CompiledSystem:
    """Compile once per definition object.

    Definitions are frozen, so the object's identity is a safe key; the cache keeps a reference
    to the system so its id cannot be reused by another object while the entry exists.
    """
    hit = _COMPILED.get(id(system))
    if hit is not None and hit[0] is system:
        return hit[1]
    cs = _compile(system)
    if len(_COMPILED) > 512:
        _COMPILED.clear()
    _COMPILED[id(system)] = (system, cs)
    return cs


def _compile(system: ScoringSystem) -> CompiledSystem:
    scale = _scale_of(system)
    classes: dict[str, list[Value]] = {}
    ranges: dict[str, list[list[tuple[float, float]]]] = {}
    partitions: dict[str, Partition] = {}
    for inp in system.inputs:
        classes[inp.id], ranges[inp.id], part = _input_classes(system, inp)
        if part is not None:
            partitions[inp.id] = part
    items = {it.id: it for it in system.items}
    unit_specs: list[tuple[str, list[Any], Any]] = []
    grouped: set[str] = set()
    for g in system.groups:
        unit_specs.append((g.id, [items[i] for i in g.items], g))
        grouped.update(g.items)
    for it in system.items:
        if it.id not in grouped:
            unit_specs.append((it.id, [it], None))
    units: list[Unit] = []
    for uid, its, group in unit_specs:
        ins: list[str] = []
        for it in its:
            for i in _item_inputs(it):
                if i not in ins:
                    ins.append(i)
        table: dict[tuple[int, ...], int] = {}
        for combo in itertools.product(*(range(len(classes[i])) for i in ins)):
            vals = {i: classes[i][c] for i, c in zip(ins, combo, strict=True)}
            sub = sum(item_points(it, vals) for it in its)
            if group is not None:
                if group.max_points is not None:
                    sub = min(sub, group.max_points)
                if group.min_points is not None:
                    sub = max(sub, group.min_points)
            table[combo] = round(sub * scale)
        units.append(Unit(uid, tuple(ins), table))
    by_input: dict[str, list[int]] = {i.id: [] for i in system.inputs}
    for ui, u in enumerate(units):
        for i in u.inputs:
            by_input[i].append(ui)
    return CompiledSystem(
        system, scale, [i.id for i in system.inputs], classes, ranges, units, by_input, partitions
    )


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CriterionResult:
    criterion_id: str
    label: str  # Met / Not met / Unable to determine
    completions_met: int
    completions_not_met: int
    witness_met: dict[str, Value] | None
    witness_not_met: dict[str, Value] | None


@dataclass(frozen=True)
class Evaluation:
    """Everything the engine knows about a (possibly partial) set of findings."""

    system_id: str
    known: dict[str, Value]
    missing: list[str]
    reachable: list[float]  # sorted distinct reachable totals
    completions: int  # number of class completions of the missing findings
    criteria: dict[str, CriterionResult]
    witness_min: dict[str, Value]
    witness_max: dict[str, Value]

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def s_min(self) -> float:
        return self.reachable[0]

    @property
    def s_max(self) -> float:
        return self.reachable[-1]

    @property
    def total(self) -> float | None:
        return self.reachable[0] if self.complete else None

    def label(self, criterion_id: str) -> str:
        return self.criteria[criterion_id].label

    def __str__(self) -> str:
        rng = (
            f"total {_fmt(self.s_min)}" if self.complete else f"range {_fmt(self.s_min)}..{_fmt(self.s_max)}"
        )
        labels = ", ".join(f"{k}: {v.label}" for k, v in self.criteria.items())
        return f"{self.system_id}: {rng}; {labels}"


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _clamp(cs: CompiledSystem, s: int) -> int:
    sy = cs.system
    if sy.total_max is not None:
        s = min(s, cs.to_scaled(sy.total_max))
    if sy.total_min is not None:
        s = max(s, cs.to_scaled(sy.total_min))
    return s


# ---------------------------------------------------------------------------------------------
# Fast path: positional tables, one plan per missing set, memoised distributions
# ---------------------------------------------------------------------------------------------
# Every cache below maps a key to a pure function of that key, so dropping entries only costs a
# recomputation. A full cache is cleared rather than trimmed: ``dict.clear`` is atomic under the
# GIL, so threads sharing a compiled system never see a half-evicted cache, and memory stays bounded.
_PLAN_CACHE_CAP = 4096  # missing-input sets per system (2**inputs at most)
_CLUSTER_CACHE_CAP = 4096  # distinct (units, missing inputs) clusters per system
_CONTRIB_CACHE_CAP = 16384  # (cluster, known classes it reads) -> its sub-total distribution
_DIST_CACHE_CAP = 4096  # (missing set, known classes the clusters read) -> summed distribution

_BINARY, _CATEGORICAL, _NUMERIC = 0, 1, 2

# a cluster's sub-totals as (sub-total, completions, witness class tuple), in first-reached order
_Contrib = list[tuple[int, int, tuple[int, ...]]]


class _Cluster:
    """Units linked through shared missing inputs, ready to enumerate.

    Its distribution of sub-totals depends only on the classes of the known inputs its units also
    read (its context), so it is enumerated once per distinct context and reused by every later
    case whose missing set produces the same cluster (see `_FastPath._convolve`).
    """

    __slots__ = ("cid", "ctx_get", "ins", "ins_classes", "ins_ids", "ranges", "units")

    def __init__(self, fast: _FastPath, cid: int, us: tuple[int, ...], missing_bits: int) -> None:
        ins: list[int] = []  # missing inputs in first-read order: the witness key order
        ctx: list[int] = []
        for ui in us:
            for p in fast.units[ui][0]:
                if missing_bits >> p & 1:
                    if p not in ins:
                        ins.append(p)
                elif p not in ctx:
                    ctx.append(p)
        self.cid = cid
        self.ins = tuple(ins)
        self.ins_ids = tuple(fast.ids[p] for p in ins)
        self.ins_classes = tuple(fast.classes[p] for p in ins)
        self.ranges = tuple(fast.class_ranges[p] for p in ins)
        # class vector -> hashable context key (an int for one known input, a tuple for several)
        self.ctx_get = operator.itemgetter(*ctx) if ctx else None
        # per unit: flat table, its known (position, stride) pairs, its stride for each of `ins`
        self.units: list[tuple[list[int], tuple[tuple[int, int], ...], tuple[int, ...]]] = []
        for ui in us:
            upos, strides, flat = fast.units[ui]
            stride_of = dict(zip(upos, strides, strict=True))
            known = tuple((p, st) for p, st in stride_of.items() if not missing_bits >> p & 1)
            self.units.append((flat, known, tuple(stride_of.get(p, 0) for p in ins)))

    def enumerate(self, kc: list[int]) -> _Contrib:
        """Every class combination of the missing inputs, in ``itertools.product`` order.

        The order matters: the first combination reaching a sub-total is its witness, exactly as
        in the plain enumeration this replaces, so witnesses never change.
        """
        units = [
            (flat, sum(kc[p] * st for p, st in known), ins_strides) for flat, known, ins_strides in self.units
        ]
        mul = operator.mul
        counts: dict[int, int] = {}
        wits: dict[int, tuple[int, ...]] = {}
        for combo in itertools.product(*self.ranges):
            s = 0
            for flat, base, ins_strides in units:
                s += flat[base + sum(map(mul, combo, ins_strides))]
            if s in counts:
                counts[s] += 1
            else:
                counts[s] = 1
                wits[s] = combo
        return [(s, c, wits[s]) for s, c in counts.items()]


class _Dist:
    """Summed distribution of a plan's clusters, *before* adding the fixed units' constant.

    Shifting every sum by the same constant keeps collisions and visiting order, so one
    distribution serves every case that differs only in known inputs outside the clusters.
    ``counts``/``wits`` keep first-reached order (what `reachable_scaled` returns); ``totals``
    and ``cum`` are the sorted sums and their prefix counts (what the labels need); ``shown``
    holds witnesses already turned into finding values, which callers only ever get copies of.
    """

    __slots__ = ("counts", "cum", "shown", "totals", "wits")

    def __init__(self, counts: dict[int, int], wits: dict[int, tuple[int, ...]]) -> None:
        self.counts = counts
        self.wits = wits
        self.shown: dict[int, dict[str, Value]] = {}
        self.totals = sorted(counts)
        self.cum = list(itertools.accumulate(map(counts.__getitem__, self.totals)))


class _ScaledTotals(dict[int, float]):
    """Scaled total -> reported value (as `CompiledSystem.from_scaled`), computed on first use.

    A system reaches only a few distinct totals, so the map stays small without a cap.
    """

    __slots__ = ("scale",)

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def __missing__(self, t: int) -> float:
        v = t / self.scale
        v = float(int(v)) if v.is_integer() else v
        self[t] = v
        return v


class _Plan:
    """Everything about one missing set that does not depend on the known values."""

    __slots__ = (
        "clusters",
        "ctx_gets",
        "dist",
        "fixed1",
        "fixedn",
        "mask",
        "missing",
        "order",
        "order_classes",
    )

    def __init__(
        self,
        mask: int,
        fixed1: tuple[tuple[int, list[int]], ...],
        fixedn: tuple[tuple[tuple[int, ...], tuple[int, ...], list[int]], ...],
        clusters: tuple[_Cluster, ...],
        order: tuple[str, ...],
        order_classes: tuple[list[Value], ...],
        missing: tuple[str, ...],
    ) -> None:
        self.mask = mask
        self.fixed1 = fixed1  # single-input fixed units: (input position, points per class)
        self.fixedn = fixedn  # other fixed units: (positions, mixed-radix strides, flat table)
        self.clusters = clusters
        # context getters of the clusters that read known inputs: with none, one distribution
        # serves every case of this missing set and is kept right here in `dist`
        self.ctx_gets = tuple(cl.ctx_get for cl in clusters if cl.ctx_get is not None)
        self.dist: _Dist | None = None
        self.order = order  # witness keys: the clusters' missing inputs, cluster by cluster
        self.order_classes = order_classes  # class representatives of each witness key
        self.missing = missing  # missing input ids in definition order


class _FastPath:
    """Per-system lookup tables and caches behind `evaluate` and `reachable_scaled`.

    Inputs are addressed by position, sets of inputs by bit masks and class vectors are plain
    lists, so a call does no pydantic attribute walks and no dict-per-combination work. What
    depends only on the missing set (clusters, fixed units, witness key order) is planned once per
    set; each cluster's distribution is enumerated once per context of known classes, and the
    clusters' summed distribution is convolved once per missing set and contexts.
    """

    def __init__(self, cs: CompiledSystem) -> None:
        system = cs.system
        ids = tuple(cs.input_ids)
        self.ids = ids
        self.pos = {i: p for p, i in enumerate(ids)}
        self.n_classes = tuple(len(cs.classes[i]) for i in ids)
        self.class_ranges = tuple(range(n) for n in self.n_classes)
        self.classes = tuple(cs.classes[i] for i in ids)
        self.blank = [-1] * len(ids)
        self.all_missing = (1 << len(ids)) - 1
        self.bit_of = tuple(1 << p for p in range(len(ids)))
        self.names = ", ".join(i.id for i in system.inputs)  # for the unknown-finding message
        # input id -> (position, kind, kind-specific validation / classing data)
        self.inputs: dict[str, tuple[int, int, Any]] = {}
        for inp in system.inputs:
            p = self.pos[inp.id]
            if isinstance(inp, BinaryInput):
                self.inputs[inp.id] = (p, _BINARY, None)
            elif isinstance(inp, CategoricalInput):
                lookup: dict[Value, int] = {}
                for c, v in enumerate(cs.classes[inp.id]):
                    lookup.setdefault(v, c)  # first index, as list.index finds
                self.inputs[inp.id] = (p, _CATEGORICAL, (lookup, inp))
            else:
                assert isinstance(inp, NumericInput)
                part = cs.partitions[inp.id]
                self.inputs[inp.id] = (
                    p,
                    _NUMERIC,
                    (inp, inp.min, inp.max, part.points, part.at, part.between),
                )
        # per unit: (input positions, mixed-radix strides, flat points table), and its input bits
        self.units: list[tuple[tuple[int, ...], tuple[int, ...], list[int]]] = []
        self.unit_bits: list[int] = []
        for u in cs.units:
            upos = tuple(self.pos[i] for i in u.inputs)
            strides: list[int] = []
            size = 1
            for p in reversed(upos):
                strides.append(size)
                size *= self.n_classes[p]
            strides.reverse()
            flat = [0] * size
            for combo, pts in u.table.items():
                flat[sum(c * st for c, st in zip(combo, strides, strict=True))] = pts
            self.units.append((upos, tuple(strides), flat))
            self.unit_bits.append(sum(1 << p for p in set(upos)))
        # what a unit adds to a plan when none of its inputs is missing
        self.fixed_entries: list[tuple[bool, Any]] = [
            (True, (upos[0], flat)) if len(upos) == 1 else (False, (upos, strides, flat))
            for upos, strides, flat in self.units
        ]
        # inputs read by two or more units: only these can link units into one cluster
        seen = shared = 0
        for bits in self.unit_bits:
            shared |= seen & bits
            seen |= bits
        self.shared_bits = shared
        self.solo = [(ui,) for ui in range(len(self.units))]  # cluster keys of lone units
        inf = math.inf
        self.crits: list[tuple[str, float, float]] = [
            (cid, -inf if lo is None else lo, inf if hi is None else hi)
            for cid, (lo, hi) in cs.criterion_bounds.items()
        ]
        self.floats = _ScaledTotals(cs.scale)
        self.tmax = None if system.total_max is None else cs.to_scaled(system.total_max)
        self.tmin = None if system.total_min is None else cs.to_scaled(system.total_min)
        self.clamped = self.tmin is not None or self.tmax is not None
        self.plans: dict[int, _Plan] = {}
        # (unit indices, missing input bits) -> cluster
        self.clusters: dict[tuple[tuple[int, ...], int], _Cluster] = {}
        self.contribs: dict[Any, _Contrib] = {}
        self.dists: dict[Any, _Dist] = {}
        self._cids = itertools.count()  # next() is atomic, so ids stay unique across threads

    def plan(self, mask: int) -> _Plan:
        """The plan of a missing set (bit p of ``mask`` set = input at position p is missing)."""
        plan = self.plans.get(mask)
        if plan is None:
            plan = self._make_plan(mask)
            if len(self.plans) >= _PLAN_CACHE_CAP:
                self.plans.clear()
            self.plans[mask] = plan
        return plan

    def _make_plan(self, mask: int) -> _Plan:
        """Cluster the units: two units share a cluster when linked by a chain of missing inputs.

        Clusters come out ordered by their lowest unit index with units ascending, and each
        cluster lists its missing inputs in first-read order; witness keys follow that order.
        A unit whose missing inputs no other unit reads is a cluster of its own, so only units
        holding a shared missing input are matched against earlier (linkable) clusters.
        """
        shared = self.shared_bits
        registry = self.clusters
        # clusters, and [missing bits, unit indices (None once absorbed)] groups to resolve,
        # all in first-unit order
        entries: list[Any] = []
        linkable: list[list[Any]] = []  # the groups holding a shared missing input
        fixed1: list[tuple[int, list[int]]] = []
        fixedn: list[tuple[tuple[int, ...], tuple[int, ...], list[int]]] = []
        for ui, bits in enumerate(self.unit_bits):
            m = bits & mask
            if not m:
                single, entry = self.fixed_entries[ui]
                (fixed1 if single else fixedn).append(entry)
                continue
            if not m & shared:  # no other unit reads its missing inputs: a cluster of its own
                us1 = self.solo[ui]
                entries.append(registry.get((us1, m)) or self._cluster(us1, m))
                continue
            home: list[Any] | None = None
            for g in linkable:  # live groups have disjoint bits; all are in first-unit order
                if g[1] is not None and g[0] & m:
                    if home is None:  # the earliest linked group takes the unit ...
                        home = g
                        g[0] |= m
                        g[1].append(ui)
                    else:  # ... and absorbs every later group the unit links it to
                        home[0] |= g[0]
                        home[1].extend(g[1])
                        g[1] = None
            if home is None:
                g = [m, [ui]]
                entries.append(g)
                linkable.append(g)
        planned: list[_Cluster] = []
        order: list[str] = []
        order_classes: list[list[Value]] = []
        for e in entries:
            if type(e) is list:
                bits, us = e
                if us is None:
                    continue
                us.sort()
                key = tuple(us)
                cl = registry.get((key, bits)) or self._cluster(key, bits)
            else:
                cl = e
            planned.append(cl)
            order.extend(cl.ins_ids)
            order_classes.extend(cl.ins_classes)
        return _Plan(
            mask,
            tuple(fixed1),
            tuple(fixedn),
            tuple(planned),
            tuple(order),
            tuple(order_classes),
            tuple(itertools.compress(self.ids, map(mask.__and__, self.bit_of))),
        )

    def _cluster(self, us: tuple[int, ...], bits: int) -> _Cluster:
        """A new cluster of units ``us`` with missing inputs ``bits``, registered under both."""
        cl = _Cluster(self, next(self._cids), us, bits)
        if len(self.clusters) >= _CLUSTER_CACHE_CAP:
            self.clusters.clear()
        self.clusters[us, bits] = cl
        return cl

    @staticmethod
    def const(plan: _Plan, kc: list[int]) -> int:
        """Scaled points of the units that read no missing input."""
        const = 0
        for p, flat in plan.fixed1:
            const += flat[kc[p]]
        for upos, strides, flat in plan.fixedn:
            k = 0
            for p, st in zip(upos, strides, strict=False):  # equal lengths by construction
                k += kc[p] * st
            const += flat[k]
        return const

    def dist(self, plan: _Plan, kc: list[int]) -> _Dist:
        """The clusters' summed distribution for these known classes, memoised.

        It depends on the known classes only through the clusters' contexts, so a plan whose
        clusters read no known input keeps its single distribution; others are cached by
        (missing set, contexts).
        """
        gets = plan.ctx_gets
        if not gets:
            d = plan.dist
            if d is None:
                d = plan.dist = self._convolve(plan, kc)
            return d
        key = (plan.mask, gets[0](kc)) if len(gets) == 1 else (plan.mask, *[g(kc) for g in gets])
        d = self.dists.get(key)
        if d is None:
            d = self._convolve(plan, kc)
            if len(self.dists) >= _DIST_CACHE_CAP:
                self.dists.clear()
            self.dists[key] = d
        return d

    def _convolve(self, plan: _Plan, kc: list[int]) -> _Dist:
        """Sumset of the clusters' distributions with counts and first-reached witnesses.

        Same sums, counts and witnesses as merging the clusters' dicts one by one: partial sums
        are visited in the same insertion order and the first pair reaching a sum keeps its
        witness; witnesses are class tuples, concatenated instead of merged as dicts.
        """
        acc_c: dict[int, int] = {0: 1}
        acc_w: dict[int, tuple[int, ...]] = {0: ()}
        contribs = self.contribs
        first = True
        for cl in plan.clusters:
            ctx_get = cl.ctx_get
            key = cl.cid if ctx_get is None else (cl.cid, ctx_get(kc))
            contrib = contribs.get(key)
            if contrib is None:
                contrib = cl.enumerate(kc)
                if len(contribs) >= _CONTRIB_CACHE_CAP:
                    contribs.clear()
                contribs[key] = contrib
            if first:  # a single partial sum (0, count 1, no witness yet): a copy
                first = False
                acc_c = {b: cb for b, cb, _ in contrib}
                acc_w = {b: wb for b, _, wb in contrib}
                continue
            new_c: dict[int, int] = {}
            new_w: dict[int, tuple[int, ...]] = {}
            for a, ca in acc_c.items():
                wa = acc_w[a]
                for b, cb, wb in contrib:
                    t = a + b
                    if t in new_c:
                        new_c[t] += ca * cb
                    else:
                        new_c[t] = ca * cb
                        new_w[t] = wa + wb
            acc_c, acc_w = new_c, new_w
        return _Dist(acc_c, acc_w)

    def reach(self, plan: _Plan, kc: list[int]) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
        """Scaled total -> completions, and -> witness class tuple (keys ``plan.order``).

        Fresh dicts in first-reached order, with the system's total clamp applied: a clamped
        total keeps the first witness that reaches it, as before.
        """
        d = self.dist(plan, kc)
        const = self.const(plan, kc)
        tmin, tmax = self.tmin, self.tmax
        counts: dict[int, int] = {}
        wits: dict[int, tuple[int, ...]] = {}
        dw = d.wits
        for s, c in d.counts.items():
            t = s + const
            if tmax is not None and t > tmax:
                t = tmax
            if tmin is not None and t < tmin:
                t = tmin
            if t in counts:
                counts[t] += c
            else:
                counts[t] = c
                wits[t] = dw[s]
        return counts, wits

    def classes_of(self, known_cls: Mapping[str, int], missing: list[str]) -> tuple[int, list[int]]:
        """Missing mask and class vector from the public by-name arguments.

        Fails like the dict-based code did: an unknown missing name, or a known input with no
        (valid) class, raises KeyError.
        """
        pos = self.pos
        mask = 0
        for i in missing:
            mask |= 1 << pos[i]
        kc = list(self.blank)
        for i, p in pos.items():
            if not mask >> p & 1:
                c = known_cls[i]
                if c not in self.class_ranges[p]:
                    raise KeyError((i, c))
                kc[p] = int(c)
        return mask, kc


def reachable_scaled(
    cs: CompiledSystem, known_cls: Mapping[str, int], missing: list[str]
) -> tuple[dict[int, int], dict[int, dict[str, int]]]:
    """Exact map scaled-total -> number of class completions, and one witness (missing -> class)."""
    fast = cs._fast
    mask, kc = fast.classes_of(known_cls, missing)
    plan = fast.plan(mask)
    counts, wits = fast.reach(plan, kc)
    order = plan.order
    # inputs that no unit reads cannot exist (the schema forbids them), so every completion counted
    return counts, {t: dict(zip(order, w, strict=True)) for t, w in wits.items()}


def evaluate(system: ScoringSystem, findings: Mapping[str, Any]) -> Evaluation:
    """Score complete findings, or give the exact reachable range and per-criterion labels.

    Validation and classing are fused into one pass over the findings with the checks, messages
    and error precedence of `normalize_findings` followed by `CompiledSystem.class_of`.
    """
    cs = compile_system(system)
    fast = cs._fast
    specs = fast.inputs
    known: dict[str, Value] = {}
    kc = list(fast.blank)
    mask = fast.all_missing
    for key, raw in findings.items():
        spec = specs.get(key)
        if spec is None:
            raise FindingError(f"unknown finding '{key}' for {system.name}; expected one of: {fast.names}")
        if raw is None:
            continue
        p, kind, data = spec
        if kind == _BINARY:
            if raw is not True and raw is not False:
                raise FindingError(f"finding '{key}' must be true or false, got {raw!r}")
            kc[p] = 1 if raw else 0
            known[key] = raw
        elif kind == _CATEGORICAL:
            lookup, inp = data
            c = lookup.get(raw) if isinstance(raw, str) else None
            if c is None:
                raise FindingError(f"finding '{key}' must be one of {inp.values()}, got {raw!r}")
            kc[p] = c
            known[key] = raw
        else:
            inp, lo, hi, points, at, between = data
            if raw.__class__ is float or raw.__class__ is int:  # the common case: a plain number
                x = float(raw)
                if not lo <= x <= hi:  # also refuses NaN
                    x = numeric_finding(inp, raw)
            else:
                x = numeric_finding(inp, raw)
            if x.__class__ is Measured:
                kc[p] = cs.measured_class(key, x)  # type: ignore[arg-type]
            else:
                j = bisect.bisect_left(points, x)
                kc[p] = at[j] if points[j] == x else between[j - 1]
            known[key] = x
        mask &= ~(1 << p)
    return _evaluate_plan(cs, fast.plan(mask), kc, known, None)


def _evaluate_classes(
    cs: CompiledSystem, known: dict[str, Value], known_cls: Mapping[str, int], missing: list[str]
) -> Evaluation:
    mask, kc = cs._fast.classes_of(known_cls, missing)
    return _evaluate_plan(cs, cs._fast.plan(mask), kc, dict(known), list(missing))


def _evaluate_plan(
    cs: CompiledSystem, plan: _Plan, kc: list[int], known: dict[str, Value], missing: list[str] | None
) -> Evaluation:
    """Labels, counts and witnesses of one case (``missing`` None: the plan's, in definition order).

    A criterion is an interval of totals, so on the sorted totals its met side is one slice
    (found by bisection, counted from prefix sums), its first met total the slice start and its
    first unmet total either the very first total or the one just past the slice. Unclamped
    totals are the plan's distribution shifted by the fixed units' constant, so the search runs
    on the unshifted sums against shifted bounds. Each distinct witness is built once per
    distribution; every returned witness is still its own dict, as before.
    """
    fast = cs._fast
    shown: dict[int, dict[str, Value]]
    if fast.clamped:
        counts, wits = fast.reach(plan, kc)
        totals = sorted(counts)
        cum = list(itertools.accumulate(map(counts.__getitem__, totals)))
        shift = 0
        shown = {}
    else:
        d = fast.dist(plan, kc)
        totals, cum, wits, shown = d.totals, d.cum, d.wits, d.shown
        shift = fast.const(plan, kc)
    completions = cum[-1]
    n = len(totals)
    order = plan.order
    order_classes = plan.order_classes

    def witness(s: int) -> dict[str, Value]:
        w = shown.get(s)
        if w is None:
            # equal lengths by construction; strict=True would cost a third of the build
            w = dict(zip(order, map(operator.getitem, order_classes, wits[s]), strict=False))
            shown[s] = w
        return w.copy()  # the kept dict never leaves: callers may mutate what they get

    results: dict[str, CriterionResult] = {}
    for crit_id, lo, hi in fast.crits:
        i = bisect.bisect_left(totals, lo - shift)
        j = bisect.bisect_right(totals, hi - shift)
        if j > i:
            n_met = cum[j - 1] - (cum[i - 1] if i else 0)
            w_met = witness(totals[i])
        else:
            n_met = 0
            w_met = None
        if i > 0:
            w_not = witness(totals[0])
        elif j < n:
            w_not = witness(totals[j])
        else:
            w_not = None
        label = "Met" if w_not is None else "Not met" if w_met is None else "Unable to determine"
        results[crit_id] = CriterionResult(crit_id, label, n_met, completions - n_met, w_met, w_not)
    floats = fast.floats.__getitem__
    return Evaluation(
        system_id=cs.system.id,
        known=known,
        missing=list(plan.missing) if missing is None else missing,
        reachable=list(map(floats, map(shift.__add__, totals))) if shift else list(map(floats, totals)),
        completions=completions,
        criteria=results,
        witness_min=witness(totals[0]),
        witness_max=witness(totals[-1]),
    )


def label_for(system: ScoringSystem, criterion_id: str, findings: Mapping[str, Any]) -> str:
    return evaluate(system, findings).label(criterion_id)


# ---------------------------------------------------------------------------------------------
# Definition checks beyond the schema
# ---------------------------------------------------------------------------------------------
def check_definition(system: ScoringSystem) -> None:
    """Semantic checks: non-overlapping bands, a grid value in every class (so case generation
    can produce every class; the cut-offs themselves need not lie on the grid), and every
    criterion can go both ways."""
    cs = compile_system(system)
    for item in system.items:
        if isinstance(item, NumericItem):
            inp = system.input(item.input)
            assert isinstance(inp, NumericInput)
            for rep in cs.classes[inp.id]:
                hits = [b for b in item.bands if _band_holds(b, float(rep))]
                if len(hits) > 1:
                    raise ValueError(f"field 'items.{item.id}.bands': bands overlap at {inp.label} = {rep}")
    for inp in system.inputs:
        if isinstance(inp, NumericInput):
            if grid_size(inp) > 200_000:
                raise ValueError(f"field 'inputs.{inp.id}': grid too fine ({grid_size(inp)} values)")
            for rep, segs in zip(cs.classes[inp.id], cs.class_ranges[inp.id], strict=True):
                if not segs:
                    raise ValueError(
                        f"field 'inputs.{inp.id}': no value of the grid {inp.min} + k*{inp.step} "
                        f"falls in the class of {rep} {inp.unit}; use a finer step"
                    )
    ev = _evaluate_classes(cs, {}, {}, list(cs.input_ids))
    for crit in system.criteria:
        r = ev.criteria[crit.id]
        if r.label != "Unable to determine":
            raise ValueError(
                f"field 'criteria.{crit.id}': always '{r.label}' whatever the findings "
                f"(reachable totals {ev.reachable[0]}..{ev.reachable[-1]})"
            )
