"""Units of clinical measurements: parse a finding given with a unit and convert it exactly.

Why this module exists: a scoring system is published in one unit convention (Blatchford's urea
bands are mmol/L, the HAS-BLED renal criterion is 200 umol/L of creatinine) while clinicians report
in another (BUN in mg/dL, creatinine in mg/dL in the US). Converting by hand is where errors come
from, so a finding may carry its unit and a cut-off may be stored in its publication's unit; both
are converted here, through pint, into the unit of the finding's definition.

Conversions between a substance concentration (mmol/L) and a mass concentration (mg/dL) need a
molar mass; they are the only chemistry allowed, and only for the analytes listed in
`MOLAR_MASS_G_PER_MOL`, with the true molar masses (no factor is bent to make a table agree):

* urea: mass concentrations mean *urea nitrogen* (BUN), two nitrogen atoms per urea molecule:
  2 x 14.0067 = 28.0134 g/mol (1 mmol/L urea = 2.80134 mg/dL BUN)
* creatinine 113.12 g/mol (1 mg/dL = 88.40 umol/L)
* glucose 180.16 g/mol (1 mmol/L = 18.016 mg/dL)
* bilirubin 584.66 g/mol (1 mg/dL = 17.10 umol/L)
* calcium 40.078 g/mol (1 mmol/L = 4.008 mg/dL)

Haemoglobin and albumin are mass concentrations in both conventions (g/dL <-> g/L, no molar mass),
temperature converts between degrees Celsius and Fahrenheit, and pressure between mmHg and kPa.
Inputs that declare no `quantity` accept only their own unit: a heart rate or an age has a single
unit, and pint would happily (and wrongly) read 'points' as a typographic length.

Exactness: pint computes in binary floating point (6.5 mmol/L becomes 18.2087... mg/dL with a
tail of binary noise), so every converted value is first rounded to 12 significant digits
(`denoise`). That removes representation noise and nothing else.

The reporting-precision rule (how a cut-off published in one unit is compared in another)
-----------------------------------------------------------------------------------------
A finding is defined in one unit Y (the input's ``unit``) and has a *reporting precision*: the
decimals a laboratory reports it with in Y (``NumericInput.precision``: BUN 1 decimal in mg/dL,
creatinine 2, bilirubin 1, glucose 0, haemoglobin 1 in g/dL, PaO2 0 in mmHg). Then:

1. A cut-off published in unit X is compared, for that finding, as the published value converted
   to Y with the true molar mass and rounded (half up) to Y's reporting precision (`to_precision`).
   Blatchford's urea 6.5 / 8.0 / 10.0 / 25 mmol/L become 18.2 / 22.4 / 28.0 / 70.0 mg/dL, HAS-BLED's
   creatinine 200 umol/L becomes 2.26 mg/dL, CURB-65's urea > 7 mmol/L becomes BUN > 19.6 mg/dL,
   Glasgow-Imrie's PaO2 8 kPa becomes 60 mmHg, calcium 2 mmol/L 8.0 mg/dL and glucose 10 mmol/L
   180 mg/dL. This is how the published US-unit tables were derived from the SI ones, so the rule
   reproduces them exactly, without bending a molar mass.
2. A number given in Y itself is compared exactly as given (with rule 1's values).
3. A finding given in another unit X (``"199.9 umol/L"``) is compared with every cut-off published
   in X exactly as given, with the published number: 199.9 umol/L is below HAS-BLED's 200 umol/L,
   6.49 mmol/L urea below Blatchford's 6.5, and 7.01 mmol/L above CURB-65's 7, although each is
   reported in Y as that table's US cut-off (2.26, 18.2, 19.6 mg/dL). So a clinician using the
   publication's own unit gets the publication's exact answer. Against a cut-off published in any
   other unit (Y, or a third one) the finding counts as its value converted with the true molar
   mass and rounded to Y's reporting precision, the value a laboratory would report in Y. The
   engine keeps such a finding as a `Measured` value (its Y value, plus the value and unit as
   given) and finds its class from the truth of every bound; a truth pattern that no Y value has
   (possible only if two rounded cut-offs crossed) is refused, never mapped to a nearby class.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Any, Literal

Quantity = Literal[
    "urea",
    "creatinine",
    "glucose",
    "bilirubin",
    "calcium",
    "hemoglobin",
    "albumin",
    "temperature",
    "pressure",
]

MOLAR_MASS_G_PER_MOL: dict[str, float] = {
    "urea": 2 * 14.0067,  # as urea nitrogen (BUN): two N atoms per urea molecule, 28.0134 g/mol
    "creatinine": 113.12,
    "glucose": 180.16,
    "bilirubin": 584.66,
    "calcium": 40.078,
}

# spellings clinicians write -> what pint parses
_ALIASES: dict[str, str] = {
    "°C": "degC",
    "℃": "degC",
    "C": "degC",
    "degC": "degC",
    "°F": "degF",
    "℉": "degF",
    "F": "degF",
    "degF": "degF",
    "μmol/L": "umol/L",
    "µmol/L": "umol/L",
    "mg/100 mL": "mg/dL",
    "mg/100mL": "mg/dL",
    "g/100 mL": "g/dL",
    "g/100mL": "g/dL",
}

_SIGNIFICANT = 12
_NUMBER_UNIT = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


class UnitError(ValueError):
    """A value whose unit is unknown or does not fit the quantity (one-line message)."""


@lru_cache(maxsize=1)
def _registry() -> Any:
    """The pint registry, built on first use (building it costs ~0.4 s, so not at import)."""
    import pint

    return pint.UnitRegistry()


def canonical(unit: str) -> str:
    """The spelling pint understands (`°C` -> `degC`, `µmol/L` -> `umol/L`)."""
    u = unit.strip()
    return _ALIASES.get(u, u)


def denoise(x: float) -> float:
    """Round to 12 significant digits: drops binary noise of a conversion, nothing clinical."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{_SIGNIFICANT}g}")


def to_precision(x: float, decimals: int) -> float:
    """``x`` rounded half up to ``decimals`` places: a value as a laboratory reports it.

    Rounds the decimal the float stands for (after `denoise`), so 2.255 becomes 2.26, not the
    2.25 that binary rounding of 2.25499999... would give.
    """
    if not math.isfinite(x):
        return x
    q = Decimal(repr(denoise(x))).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return float(q)


def convert(value: float, from_unit: str, to_unit: str, quantity: str | None) -> float:
    """``value`` in ``from_unit`` expressed in ``to_unit`` (raises UnitError).

    Identical units (after spelling aliases) return the value untouched, so a number already in
    the definition's unit is never perturbed.
    """
    src, dst = canonical(from_unit), canonical(to_unit)
    if src == dst:
        return value
    if quantity is None:
        raise UnitError(f"takes only {to_unit}; got unit '{from_unit}'")
    import pint

    ureg = _registry()
    try:
        q = ureg.Quantity(value, src)
    except (pint.errors.UndefinedUnitError, pint.errors.DefinitionSyntaxError, ValueError, AttributeError):
        raise UnitError(f"unknown unit '{from_unit}'") from None
    except Exception:  # pint's parser raises assorted errors on garbage such as '@@'
        raise UnitError(f"unknown unit '{from_unit}'") from None
    try:
        mw = MOLAR_MASS_G_PER_MOL.get(quantity)
        out = q.to(dst, "chemistry", mw=ureg.Quantity(mw, "g/mol")) if mw is not None else q.to(dst)
    except pint.errors.DimensionalityError:
        raise UnitError(f"unit '{from_unit}' cannot be converted to {to_unit}") from None
    return denoise(float(out.magnitude))


def parse_value(raw: Any) -> tuple[float, str | None]:
    """Split a finding into (number, unit or None).

    Accepts a number, a string such as ``"6.5 mmol/L"`` (a bare ``"6.5"`` means the definition's
    unit), or a mapping ``{"value": 6.5, "unit": "mmol/L"}``. Booleans are not numbers here.
    """
    if isinstance(raw, bool):
        raise UnitError(f"must be a number, got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw), None
    if isinstance(raw, str):
        m = _NUMBER_UNIT.match(raw)
        if not m:
            raise UnitError(f"must be a number with an optional unit such as '6.5 mmol/L', got {raw!r}")
        return float(m.group(1)), (m.group(2) or None)
    if isinstance(raw, dict):
        if set(raw) - {"value", "unit"} or "value" not in raw:
            raise UnitError(f"must be {{'value': number, 'unit': text}}, got {raw!r}")
        v, unit = raw["value"], raw.get("unit")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise UnitError(f"'value' must be a number, got {v!r}")
        if unit is not None and not isinstance(unit, str):
            raise UnitError(f"'unit' must be text, got {unit!r}")
        return float(v), (unit.strip() or None) if unit is not None else None
    raise UnitError(f"must be a number, got {raw!r}")


def format_number(x: float, decimals: int) -> str:
    """Fixed decimals, with -0 shown as 0 (a rendered vignette value)."""
    s = f"{x:.{decimals}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s
