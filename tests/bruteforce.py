"""Independent reference for the engine: plain enumeration of completions.

Nothing here uses the engine's classes, scaling, clustering or sumsets. Totals come from
``score_values`` (a direct reading of the definition's point table) applied to every completion
built with ``itertools.product``.

Numeric findings are real-valued, so their completions cannot all be listed; `cut_candidates`
reads the bounds straight from the definition and lists, for each, the bound itself and the
floats immediately below and above it, plus both ends of the range. Every interval between two
consecutive bounds then holds a candidate, and a value's points depend only on which side of each
bound it lies, so enumerating these candidates reaches every total any real value in range can
reach, without trusting the engine's class split.

A bound published in another unit is converted here by hand (`comparison_value`: the published
value times a factor written from the true molar mass, rounded half up to the input's declared
reporting precision), not read from the engine's or the schema's converted bounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal

from equipoise.schemas.scoring import (
    BinaryInput,
    CategoricalInput,
    NumericInput,
    NumericItem,
    RuleItem,
    ScoringSystem,
    iter_atoms,
)
from equipoise.scoring_systems.engine import score_values


def full_grid(inp: NumericInput) -> list[float]:
    n = round((inp.max - inp.min) / inp.step) + 1
    return [round(inp.min + k * inp.step, 6) for k in range(n)]


# (quantity, published unit, input unit) -> factor, from the true molar masses by hand:
# urea nitrogen 2 x 14.0067 = 28.0134 g/mol, creatinine 113.12, glucose 180.16, calcium 40.078,
# bilirubin 584.66 g/mol; 1 mmHg = 0.133322387415 kPa.
FACTORS: dict[tuple[str | None, str, str], Decimal] = {
    ("urea", "mmol/L", "mg/dL"): Decimal("28.0134") / 10,
    ("creatinine", "µmol/L", "mg/dL"): Decimal("113.12") / 10_000,
    ("glucose", "mmol/L", "mg/dL"): Decimal("180.16") / 10,
    ("calcium", "mmol/L", "mg/dL"): Decimal("40.078") / 10,
    ("bilirubin", "µmol/L", "mg/dL"): Decimal("584.66") / 10_000,
    ("hemoglobin", "g/L", "g/dL"): Decimal("0.1"),
    ("albumin", "g/L", "g/dL"): Decimal("0.1"),
    ("pressure", "kPa", "mmHg"): 1 / Decimal("0.133322387415"),
}


def reporting_decimals(inp: NumericInput) -> int:
    """The declared reporting precision, else the decimals of the step (read from the YAML fields)."""
    if inp.reported_decimals is not None:
        return inp.reported_decimals
    return max(0, -Decimal(str(inp.step)).normalize().as_tuple().exponent)


def comparison_value(inp: NumericInput, value: float, unit: str | None) -> float:
    """A published bound as compared for ``inp``: as is in its own unit, else converted by the
    hand factor and rounded half up to the reporting precision."""
    if unit is None or unit == inp.unit:
        return float(value)
    exact = Decimal(str(value)) * FACTORS[(inp.quantity, unit, inp.unit)]
    return float(exact.quantize(Decimal(1).scaleb(-reporting_decimals(inp)), rounding=ROUND_HALF_UP))


def holders_of(system: ScoringSystem, item: object, input_id: str) -> list:
    """The bands or rule atoms of one item that bound ``input_id``."""
    if isinstance(item, NumericItem) and item.input == input_id:
        return list(item.bands)
    if isinstance(item, RuleItem):
        return [a for c in item.cases for a in iter_atoms(c.when) if a.input == input_id]
    return []


def definition_bounds(system: ScoringSystem, input_id: str) -> set[float]:
    """Every bound on one numeric input, in the input's unit, read from the items directly."""
    inp = system.input(input_id)
    assert isinstance(inp, NumericInput)
    out: set[float] = set()
    for item in system.items:
        for h in holders_of(system, item, input_id):
            published = (h.ge, h.gt, h.le, h.lt)
            out.update(comparison_value(inp, v, h.unit) for v in published if v is not None)
    return out


def cut_candidates(system: ScoringSystem, inp: NumericInput) -> list[float]:
    """Values visiting every interval the definition's bounds cut ``[min, max]`` into."""
    vals = {float(inp.min), float(inp.max)}
    for c in definition_bounds(system, inp.id):
        for v in (c, math.nextafter(c, -math.inf), math.nextafter(c, math.inf)):
            if inp.min <= v <= inp.max:
                vals.add(v)
    return sorted(vals)


def candidates(
    inp: BinaryInput | CategoricalInput | NumericInput, numeric: Iterable[float] | None = None
) -> list:
    if isinstance(inp, BinaryInput):
        return [False, True]
    if isinstance(inp, CategoricalInput):
        return inp.values()
    return list(numeric) if numeric is not None else full_grid(inp)


def reachable(
    system: ScoringSystem,
    known: Mapping[str, object],
    numeric_values: Mapping[str, list[float]] | None = None,
) -> list[float]:
    """Sorted distinct totals over every completion of the inputs missing from ``known``."""
    missing = [i for i in system.inputs if i.id not in known]
    pools = [candidates(i, (numeric_values or {}).get(i.id)) for i in missing]
    totals = set()
    for combo in itertools.product(*pools):
        values = dict(known)
        values.update({i.id: v for i, v in zip(missing, combo, strict=True)})
        totals.add(score_values(system, values))
    return sorted(totals)


def labels(system: ScoringSystem, totals: list[float]) -> dict[str, str]:
    out = {}
    for c in system.criteria:
        sides = {c.holds(t) for t in totals}
        out[c.id] = "Met" if sides == {True} else "Not met" if sides == {False} else "Unable to determine"
    return out


def space_size(system: ScoringSystem, missing: list[str]) -> int:
    n = 1
    for i in system.inputs:
        if i.id in missing:
            n *= len(candidates(i))
    return n
