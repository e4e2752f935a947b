"""Issue 14: published cut-offs kept exactly (with their source), findings with units, SI inputs.

Conversions are checked against hand arithmetic with the molar masses written out here, not
against pint, so a wrong registry factor or context would fail.
"""

from __future__ import annotations

import json
import math
import random
from decimal import ROUND_HALF_UP, Decimal

import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.schemas.scoring import Atom, Band, NumericInput, numeric_bound_holders
from equipoise.schemas.units import UnitError, convert, parse_value, to_precision
from equipoise.scoring_systems.engine import FindingError, compile_system, evaluate, item_points
from tests import bruteforce
from tests.conftest import SYSTEM_IDS, SYSTEMS, random_value

runner = CliRunner()

GBS_CASE = {
    "sex": "male",
    "bun": 18.2,
    "hemoglobin": 14,
    "sbp": 120,
    "heart_rate": 80,
    "melena": False,
    "syncope": False,
    "liver_disease": False,
    "heart_failure": False,
}
HAS_BLED_CASE = {
    "age": 60,
    "sbp": 130,
    "creatinine": 2.26,
    "renal_replacement": False,
    "chronic_liver_disease": False,
    "bilirubin": 0.8,
    "ast": 30,
    "prior_stroke": False,
    "bleeding_predisposition": False,
    "labile_inr": False,
    "antiplatelet_nsaid": False,
    "alcohol_excess": False,
}


# --------------------------------------------------------------------------------------------
# Conversions, by hand
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "src", "dst", "quantity", "expect"),
    [
        (6.5, "mmol/L", "mg/dL", "urea", 6.5 * 28.0134 / 10),  # urea nitrogen, 2 x 14.0067 g/mol
        (18.2, "mg/dL", "mmol/L", "urea", 18.2 * 10 / 28.0134),
        (200, "µmol/L", "mg/dL", "creatinine", 200 * 113.12 / 10_000),
        (200, "umol/L", "mg/dL", "creatinine", 200 * 113.12 / 10_000),
        (10, "mmol/L", "mg/dL", "glucose", 10 * 180.16 / 10),
        (34.2, "µmol/L", "mg/dL", "bilirubin", 34.2 * 584.66 / 10_000),
        (2.0, "mmol/L", "mg/dL", "calcium", 2.0 * 40.078 / 10),
        (140, "g/L", "g/dL", "hemoglobin", 14.0),
        (32, "g/L", "g/dL", "albumin", 3.2),
        (100.4, "°F", "°C", "temperature", (100.4 - 32) * 5 / 9),
        (8, "kPa", "mmHg", "pressure", 8000 / 133.322387415),
    ],
)
def test_conversion_matches_hand_arithmetic(value, src, dst, quantity, expect):
    assert math.isclose(convert(value, src, dst, quantity), expect, rel_tol=1e-10)


def test_conversion_uses_true_molar_masses_and_removes_only_binary_noise():
    """The true molar masses, no fudge: 6.5 mmol/L urea is 18.2087 mg/dL BUN, not 18.2."""
    assert convert(6.5, "mmol/L", "mg/dL", "urea") == 18.20871
    assert convert(25, "mmol/L", "mg/dL", "urea") == 70.0335
    assert convert(200, "µmol/L", "mg/dL", "creatinine") == 2.2624
    assert convert(140, "g/L", "g/dL", "hemoglobin") == 14.0
    assert convert(5.0, "mg/dL", "mg/dL", None) == 5.0  # same unit: untouched, no pint


@pytest.mark.parametrize(
    ("x", "decimals", "expect"),
    [
        (18.20871, 1, 18.2),
        (2.2624, 2, 2.26),
        (2.255, 2, 2.26),
        (2.2549, 2, 2.25),
        (19.60938, 1, 19.6),
        (60.0049, 0, 60.0),
        (180.16, 0, 180.0),
        (8.0156, 1, 8.0),
        (44.82144, 1, 44.8),
        (0.05, 1, 0.1),
    ],
)
def test_to_precision_rounds_half_up_on_the_decimal(x, decimals, expect):
    """Half up on the decimal the float stands for (2.255 -> 2.26, not binary rounding's 2.25)."""
    assert to_precision(x, decimals) == expect


@pytest.mark.parametrize(
    ("system_id", "input_id", "published"),
    [
        # the published US tables, reproduced from the SI cut-offs by the reporting-precision rule
        ("glasgow_blatchford", "bun", [18.2, 22.4, 28.0, 70.0]),  # urea 6.5/8/10/25 mmol/L
        ("glasgow_blatchford", "hemoglobin", [10.0, 12.0, 13.0]),  # 100/120/130 g/L
        ("has_bled", "creatinine", [2.26]),  # 200 umol/L
        ("curb_65", "bun", [19.6]),  # urea > 7 mmol/L
        ("glasgow_imrie", "pao2", [60.0]),  # 8 kPa
        ("glasgow_imrie", "calcium", [8.0]),  # 2 mmol/L
        ("glasgow_imrie", "glucose", [180.0]),  # 10 mmol/L
        ("glasgow_imrie", "albumin", [3.2]),  # 32 g/L
        ("glasgow_imrie", "bun", [44.8]),  # urea 16 mmol/L
    ],
)
def test_converted_cutoffs_are_the_published_us_values(system_id, input_id, published):
    assert sorted(bruteforce.definition_bounds(SYSTEMS[system_id], input_id)) == published


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
def test_schema_comparison_values_equal_the_hand_computed_ones(system_id):
    """Each bound the engine compares with (`bounds()`) equals the one computed by hand from the
    published value, the true molar mass and the declared reporting precision."""
    s = SYSTEMS[system_id]
    items = {i.id: i for i in s.items}
    for where, h in numeric_bound_holders(s):
        if isinstance(h, Atom):
            inp = s.input(h.input)
        elif isinstance(h, Band):
            inp = s.input(items[where.split(".")[1]].input)
        else:
            continue
        hand = tuple(
            None if v is None else bruteforce.comparison_value(inp, v, h.unit)
            for v in (h.ge, h.gt, h.le, h.lt)
        )
        assert h.bounds() == hand, (system_id, where)


def test_reporting_precision_cannot_be_coarser_than_the_step():
    bun = SYSTEMS["glasgow_blatchford"].input("bun").model_dump()
    assert NumericInput(**{**bun, "reported_decimals": 1}).precision == 1
    with pytest.raises(ValueError, match=r"reported_decimals 0 of input 'bun' is coarser than its step 0\.1"):
        NumericInput(**{**bun, "step": 0.1, "reported_decimals": 0})


def test_reporting_precision_is_declared_or_the_step():
    gbs, hb = SYSTEMS["glasgow_blatchford"], SYSTEMS["has_bled"]
    assert gbs.input("bun").precision == 1 and gbs.input("bun").decimals == 0  # grid stays whole mg/dL
    assert hb.input("creatinine").precision == 2
    assert hb.input("bilirubin").precision == 1
    assert SYSTEMS["ranson"].input("glucose").precision == 0
    assert gbs.input("hemoglobin").precision == 1


@pytest.mark.parametrize(
    ("raw", "err"),
    [
        (("6.5", "furlongs", "mg/dL", "urea"), "cannot be converted"),
        (("6.5", "zorkmids/L", "mg/dL", "urea"), "unknown unit"),
        (("120", "kPa", "/min", None), "takes only /min"),
        (("1", "mmol/L", "g/dL", "hemoglobin"), "cannot be converted"),  # no molar mass for Hb
    ],
)
def test_bad_units_are_refused(raw, err):
    value, src, dst, quantity = raw
    with pytest.raises(UnitError, match=err):
        convert(float(value), src, dst, quantity)


def test_parse_value_forms():
    assert parse_value(6.5) == (6.5, None)
    assert parse_value("6.5 mmol/L") == (6.5, "mmol/L")
    assert parse_value(" 205umol/L ") == (205.0, "umol/L")
    assert parse_value("18.2") == (18.2, None)
    assert parse_value({"value": 6.5, "unit": "mmol/L"}) == (6.5, "mmol/L")
    for bad in (True, "high", {"value": "6.5"}, {"value": 1, "units": "x"}, [6.5]):
        with pytest.raises(UnitError):
            parse_value(bad)


# --------------------------------------------------------------------------------------------
# Published cut-offs: exact, in their unit, sourced
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("system_id", SYSTEM_IDS)
def test_every_numeric_cutoff_names_its_source(system_id):
    """The audit: each band, numeric rule bound and criterion threshold names a reference."""
    s = SYSTEMS[system_id]
    ref_ids = {r.id for r in s.references}
    holders = numeric_bound_holders(s)
    assert holders
    missing = [where for where, h in holders if h.source is None]
    assert not missing, f"{system_id}: cut-offs without a source: {missing}"
    assert all(h.source in ref_ids for _, h in holders)


def test_all_27_systems_audited():
    assert len(SYSTEMS) == 27


def test_glasgow_blatchford_urea_bands_are_blatchford_2000_in_mmol_per_litre():
    item = next(i for i in SYSTEMS["glasgow_blatchford"].items if i.id == "urea")
    published = [(b.ge, b.lt, b.unit, b.source) for b in item.bands]
    assert published == [
        (None, 6.5, "mmol/L", "blatchford2000"),
        (6.5, 8.0, "mmol/L", "blatchford2000"),
        (8.0, 10.0, "mmol/L", "blatchford2000"),
        (10.0, 25.0, "mmol/L", "blatchford2000"),
        (25.0, None, "mmol/L", "blatchford2000"),
    ]
    # compared in the finding's unit (BUN mg/dL, 0.1 precision): the US table 18.2 / 22.4 / 28 / 70
    assert sorted({v for b in item.bands for v in b.bounds() if v is not None}) == [18.2, 22.4, 28.0, 70.0]


def test_has_bled_creatinine_is_200_umol_per_litre():
    rule = next(i for i in SYSTEMS["has_bled"].items if i.id == "a_renal")
    atom = next(a for a in rule.cases[0].when.any if isinstance(a, Atom) and a.input == "creatinine")
    assert (atom.ge, atom.unit, atom.source) == (200.0, "µmol/L", "pisters2010")
    assert atom.bounds()[0] == 2.26  # 2.2624 mg/dL at creatinine's 0.01 mg/dL precision


# --------------------------------------------------------------------------------------------
# The issue's cases, in US and SI units, and exact answers off the grid
# --------------------------------------------------------------------------------------------
def _score(system_id: str, findings: dict) -> tuple[float | None, dict[str, str]]:
    ev = evaluate(SYSTEMS[system_id], findings)
    return ev.total, {k: r.label for k, r in ev.criteria.items()}


def test_issue_glasgow_blatchford_case_scores_2_in_us_and_si_units():
    expect = (2.0, {"low_risk": "Not met", "very_low_risk_acg": "Not met"})
    assert _score("glasgow_blatchford", GBS_CASE) == expect
    for bun in ("6.5 mmol/L", {"value": 6.5, "unit": "mmol/L"}, "18.2 mg/dL"):
        si = {**GBS_CASE, "bun": bun, "hemoglobin": "140 g/L"}
        assert _score("glasgow_blatchford", si) == expect
    # below the published band, in either unit: 0
    for bun in (18.1, 18.19, "6.47 mmol/L", "6.4 mmol/L", {"value": 18.1, "unit": "mg/dL"}):
        assert _score("glasgow_blatchford", {**GBS_CASE, "bun": bun})[0] == 0, bun
    # given in the publication's unit, a urea just below 6.5 mmol/L is below the band, although
    # it is reported as 18.2 mg/dL (BUN's 0.1 mg/dL precision), the US table's cut-off
    for bun in ("6.49 mmol/L", "6.48 mmol/L", {"value": 6.4999, "unit": "mmol/L"}):
        assert _score("glasgow_blatchford", {**GBS_CASE, "bun": bun})[0] == 0, bun
    for bun, pts in (("7.99 mmol/L", 2), ("9.99 mmol/L", 3), ("24.99 mmol/L", 4)):
        assert _score("glasgow_blatchford", {**GBS_CASE, "bun": bun})[0] == pts, bun
    # the other bands at their published mmol/L values and the US values
    for bun, pts in (
        ("8 mmol/L", 3),
        (22.4, 3),
        (22.3, 2),
        ("10 mmol/L", 4),
        (28, 4),
        ("25 mmol/L", 6),
        (70, 6),
    ):
        assert _score("glasgow_blatchford", {**GBS_CASE, "bun": bun})[0] == pts, bun


def test_issue_has_bled_case_scores_1_in_us_and_si_units():
    assert _score("has_bled", HAS_BLED_CASE) == (1.0, {"high_risk": "Not met"})
    for cr in (
        2.26,
        "200 umol/L",
        "205 umol/L",
        "200 µmol/L",
        {"value": 200, "unit": "µmol/L"},
        "2.26 mg/dL",
    ):
        assert _score("has_bled", {**HAS_BLED_CASE, "creatinine": cr})[0] == 1, cr
    for cr in (2.25, 2.259, "198 umol/L", "199 umol/L", {"value": 198, "unit": "umol/L"}):
        assert _score("has_bled", {**HAS_BLED_CASE, "creatinine": cr})[0] == 0, cr
    # 199.9 umol/L is reported as 2.26 mg/dL, but given in umol/L it is compared with the
    # published 200 umol/L as given: no point
    assert _score("has_bled", {**HAS_BLED_CASE, "creatinine": "199.9 umol/L"})[0] == 0
    assert _score("has_bled", {**HAS_BLED_CASE, "creatinine": "199.99 µmol/L"})[0] == 0


def test_curb_65_urea_above_7_mmol_per_litre_in_both_units():
    """Urea > 7 mmol/L is BUN > 19.6 mg/dL (7 x 2.80134 = 19.609, at 0.1 mg/dL)."""
    case = {"confusion": False, "age": 50, "resp_rate": 16, "sbp": 120, "dbp": 80}
    for bun, pts in (
        (19.6, 0),
        (19.7, 1),
        (19.61, 1),
        ("7 mmol/L", 0),
        ("7.0 mmol/L", 0),
        ("7.1 mmol/L", 1),
        ({"value": 7, "unit": "mmol/L"}, 0),
        ("7.02 mmol/L", 1),
        ("6.9 mmol/L", 0),
        ("7.01 mmol/L", 1),  # above the published > 7 mmol/L, although reported as 19.6 mg/dL
        ("7.001 mmol/L", 1),
        ("19.6 mg/dL", 0),
        ("19.61 mg/dL", 1),
    ):
        assert _score("curb_65", {**case, "bun": bun})[0] == pts, bun


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
def test_any_value_in_range_scores_like_its_class(system_id):
    """Off-grid values (random floats, the bounds and their float neighbours) fall in the class
    whose representative scores the same for every item, in random contexts."""
    system = SYSTEMS[system_id]
    cs = compile_system(system)
    rng = random.Random(f"offgrid-{system_id}")
    for inp in system.inputs:
        if not isinstance(inp, NumericInput):
            continue
        xs = bruteforce.cut_candidates(system, inp) + [rng.uniform(inp.min, inp.max) for _ in range(200)]
        contexts = [{i.id: random_value(i, rng) for i in system.inputs} for _ in range(3)]
        for x in xs:
            rep = cs.classes[inp.id][cs.class_of(inp.id, x)]
            for ctx in contexts:
                for item in system.items:
                    assert item_points(item, {**ctx, inp.id: x}) == item_points(item, {**ctx, inp.id: rep}), (
                        f"{system_id}.{item.id}: {inp.id}={x!r} scores unlike representative {rep}"
                    )


@pytest.mark.parametrize(
    ("system_id", "findings", "needle"),
    [
        (
            "glasgow_blatchford",
            {"bun": "6.5 zorkmids"},
            "finding 'bun' (Blood urea nitrogen, mg/dL): unknown unit",
        ),
        (
            "glasgow_blatchford",
            {"bun": "6.5 mmHg"},
            "finding 'bun' (Blood urea nitrogen, mg/dL): unit 'mmHg'",
        ),
        ("glasgow_blatchford", {"hemoglobin": "900 g/L"}, "finding 'hemoglobin' = 90 g/dL"),
        ("glasgow_blatchford", {"heart_rate": {"value": 80, "unit": "mmHg"}}, "finding 'heart_rate'"),
        ("has_bled", {"creatinine": -1}, "outside the possible range"),
        ("has_bled", {"creatinine": "lots"}, "finding 'creatinine' must be a number in mg/dL"),
    ],
)
def test_unknown_units_and_impossible_values_are_refused(system_id, findings, needle):
    with pytest.raises(FindingError) as exc:
        evaluate(SYSTEMS[system_id], findings)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_cli_issue_examples_and_one_line_errors():
    res = runner.invoke(app, ["systems", "score", "glasgow_blatchford", "--findings", json.dumps(GBS_CASE)])
    assert res.exit_code == 0, res.output
    assert "total 2" in res.output and "Low risk (total ≤ 0): Not met" in res.output
    si = {**GBS_CASE, "bun": "6.5 mmol/L", "hemoglobin": {"value": 140, "unit": "g/L"}}
    res = runner.invoke(app, ["systems", "score", "glasgow_blatchford", "--findings", json.dumps(si)])
    assert res.exit_code == 0 and "total 2" in res.output
    for cr in ("205 umol/L", "200 umol/L", 2.26):
        case = {**HAS_BLED_CASE, "creatinine": cr}
        res = runner.invoke(app, ["systems", "score", "has_bled", "--findings", json.dumps(case)])
        assert res.exit_code == 0 and "total 1" in res.output, res.output
    for bad in ({"bun": "6.5 zorkmids"}, {"bun": 5000}, {"bun": "9 kPa"}):
        res = runner.invoke(app, ["systems", "score", "glasgow_blatchford", "--findings", json.dumps(bad)])
        assert res.exit_code == 2
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: finding 'bun'"), res.output
        assert "Traceback" not in res.output


def test_si_rendering_units_convert_from_the_finding_unit():
    """Every `si` block names a unit the finding converts to (checked at load, shown here)."""
    n = 0
    for s in SYSTEMS.values():
        for inp in s.inputs:
            if isinstance(inp, NumericInput) and inp.si is not None:
                assert convert(inp.normal, inp.unit, inp.si.unit, inp.quantity) > 0
                n += 1
    assert n >= 20


def test_band_unit_must_convert(tmp_path):
    import yaml

    from equipoise.scoring_systems.loader import DEFINITIONS_DIR, DefinitionError, load_definition

    data = yaml.safe_load((DEFINITIONS_DIR / "glasgow_blatchford.yaml").read_text())
    data["items"][0]["bands"][0]["unit"] = "mmHg"
    p = tmp_path / "glasgow_blatchford.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    with pytest.raises(DefinitionError, match="cannot be converted"):
        load_definition(p)
    data["items"][0]["bands"][0]["unit"] = "mmol/L"
    data["items"][0]["bands"][0]["source"] = "nobody1999"
    p.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    with pytest.raises(DefinitionError, match="source 'nobody1999' is not a reference id"):
        load_definition(p)
    assert Band(lt=1, points=0).bounds() == (None, None, None, 1.0)


# --------------------------------------------------------------------------------------------
# Vignettes in SI or US units: same findings and labels, SI values in the same class
# --------------------------------------------------------------------------------------------
SI_SYSTEMS = ["glasgow_blatchford", "has_bled", "glasgow_imrie", "curb_65", "sirs", "alvarado"]


def test_si_and_us_builds_share_findings_and_labels_and_card_says_which(tmp_path):
    from equipoise.builders.clindet_suite import build_clindet, read_cases
    from equipoise.builders.vignette import stated_text

    folders = {}
    for units in ("us", "si"):
        folders[units] = tmp_path / units
        manifest = build_clindet(
            folders[units], per_system=3, seed=5, systems=SI_SYSTEMS, progress=False, units=units
        )
        assert manifest["units"] == units
        assert json.loads((folders[units] / "manifest.json").read_text())["units"] == units
        card = (folders[units] / "README.md").read_text(encoding="utf-8")
        assert f"units: `{units}`" in card
    built = {u: read_cases(folders[u]) for u in ("us", "si")}
    assert len(built["us"]) == len(built["si"]) > 0
    key = lambda c: (c.case_id, c.findings_json, c.label, c.s_min, c.s_max, c.completions_met)  # noqa: E731
    assert [key(c) for c in built["us"]] == [key(c) for c in built["si"]]
    n_stated = {"us": 0, "si": 0}
    for units, cases in built.items():
        for case in cases:
            system = SYSTEMS[case.system_id]
            known = json.loads(case.findings_json)
            stated = dict(known)
            for fid, value in known.items():
                inp = system.input(fid)
                if isinstance(inp, NumericInput) and (got := stated_text(inp, value, units)) is not None:
                    text = f"{got[0]} {got[1]}"
                    assert text in case.vignette, (units, case.case_id, fid)
                    stated[fid] = text  # what the vignette says, with its unit
                    n_stated[units] += 1
            # the label of what the vignette states, evaluated independently, is the case's label
            assert evaluate(system, stated).label(case.criterion_id) == case.label, (units, case.case_id)
    n_si_values = n_stated["si"]
    assert n_stated["us"] > 5  # temperatures stated in °F
    assert n_si_values > 20
    # an SI rebuild with the same seed is byte-identical (every file hash in the manifest)
    again = tmp_path / "si-again"
    build_clindet(again, per_system=3, seed=5, systems=SI_SYSTEMS, progress=False, units="si")
    assert (again / "manifest.json").read_bytes() == (folders["si"] / "manifest.json").read_bytes()
    assert (again / "README.md").read_bytes() == (folders["si"] / "README.md").read_bytes()


def test_build_units_option_is_checked(tmp_path):
    res = runner.invoke(app, ["build", "clindet", "--out", str(tmp_path / "x"), "--units", "metric"])
    assert res.exit_code == 2 and "--units must be 'us' or 'si'" in res.output


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
def test_evaluate_at_every_bound_and_its_neighbours_equals_the_point_table(system_id):
    """Deterministic sweep of the values where exactness matters: each bound and the floats just
    either side, one numeric finding at a time in random complete contexts, through `evaluate`'s
    own validation and classing path, against `score_values` on the raw values."""
    from equipoise.scoring_systems.engine import score_values

    system = SYSTEMS[system_id]
    rng = random.Random(f"bounds-{system_id}")
    contexts = [{i.id: random_value(i, rng) for i in system.inputs} for _ in range(3)]
    for inp in system.inputs:
        if not isinstance(inp, NumericInput):
            continue
        for x in bruteforce.cut_candidates(system, inp):
            for ctx in contexts:
                values = {**ctx, inp.id: x}
                assert evaluate(system, values).total == score_values(system, values), (system_id, inp.id, x)


def test_systems_show_lists_published_cutoffs_with_unit_and_source():
    res = runner.invoke(app, ["systems", "show", "has_bled"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.output.splitlines() if "a_renal" in ln)
    assert "≥ 200" in row and "µmol/L" in row and "pisters2010" in row
    assert "≥ 2.26 mg/dL" in row  # the comparison value in the finding's unit, next to the published one


def _hand_to_input_unit(inp: NumericInput, x: Decimal, unit: str) -> float:
    """A finding in another unit as the rule reads it, by hand: hand factor, then half up."""
    if inp.quantity == "temperature":
        exact = (x - 32) * 5 / 9  # °F -> °C
    else:
        exact = x * bruteforce.FACTORS[(inp.quantity, unit, inp.unit)]
    step = Decimal(1).scaleb(-bruteforce.reporting_decimals(inp))
    return float(exact.quantize(step, rounding=ROUND_HALF_UP))


def _other_unit(inp: NumericInput) -> str | None:
    r = inp.si or inp.us
    return None if r is None else r.unit


def _same_unit(a: str | None, b: str) -> bool:
    return a is not None and a.replace("µ", "u").replace("μ", "u") == b.replace("µ", "u").replace("μ", "u")


def _hand_truths(system, inp: NumericInput, y: float, given: tuple[Decimal, str] | None) -> tuple[bool, ...]:
    """Truth of every bound on ``inp``, by hand: a bound published in the unit the finding was
    given in compares the value as given; every other bound compares the input-unit value ``y``
    with the bound's hand comparison value (`bruteforce.comparison_value`)."""

    def holds(v: Decimal | float, ge, gt, le, lt) -> bool:
        return (
            (ge is None or v >= ge)
            and (gt is None or v > gt)
            and (le is None or v <= le)
            and (lt is None or v < lt)
        )

    out = []
    for item in system.items:
        for h in bruteforce.holders_of(system, item, inp.id):
            pub = (h.ge, h.gt, h.le, h.lt)
            if given is not None and _same_unit(h.unit, given[1]):
                out.append(holds(given[0], *(None if v is None else Decimal(str(v)) for v in pub)))
            else:
                cmp_ = [None if v is None else bruteforce.comparison_value(inp, v, h.unit) for v in pub]
                out.append(holds(y, *cmp_))
    return tuple(out)


def _hand_total(system, inp: NumericInput, ctx: dict, x: Decimal, unit: str, y: float) -> float | None:
    """The total of ``ctx`` with ``inp`` given as ``x unit``, by hand: the input-unit value whose
    bounds hold exactly as the given finding's do (found among the brute-force cut candidates)
    scored by the point table; None when no input-unit value has that truth pattern."""
    from equipoise.scoring_systems.engine import score_values

    want = _hand_truths(system, inp, y, (x, unit))
    for c in bruteforce.cut_candidates(system, inp):
        if _hand_truths(system, inp, c, None) == want:
            return score_values(system, {**ctx, inp.id: c})
    return None


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
def test_findings_in_other_units_score_like_their_hand_conversion(system_id):
    """Brute force over findings given in the other convention's unit: each published cut-off in
    that unit and values a hundredth, a tenth and a few reporting steps either side of it, plus
    random values across the range, scored through `evaluate`'s parsing path, against a hand
    evaluation: cut-offs published in the finding's unit compare the value as given, the others
    its hand-converted, hand-rounded value (`_hand_total`)."""

    system = SYSTEMS[system_id]
    rng = random.Random(f"units-{system_id}")
    contexts = [{i.id: random_value(i, rng) for i in system.inputs} for _ in range(3)]
    for inp in system.inputs:
        if not isinstance(inp, NumericInput) or (unit := _other_unit(inp)) is None:
            continue
        factor = None if inp.quantity == "temperature" else bruteforce.FACTORS[(inp.quantity, unit, inp.unit)]

        def to_x(y: float, factor: Decimal | None = factor) -> Decimal:
            return Decimal(str(y)) * 9 / 5 + 32 if factor is None else Decimal(str(y)) / factor

        lo, hi = to_x(inp.min), to_x(inp.max)
        anchors = [to_x(b) for b in bruteforce.definition_bounds(system, inp.id)]
        anchors += [
            Decimal(str(v))
            for item in system.items
            for h in bruteforce.holders_of(system, item, inp.id)
            if h.unit is not None and h.unit != inp.unit
            for v in (h.ge, h.gt, h.le, h.lt)
            if v is not None
        ]
        xs = {
            round(a + d, 4)
            for a in anchors
            for d in map(Decimal, ("0", "0.01", "-0.01", "0.1", "-0.1", "1", "-1"))
        }
        xs |= {Decimal(f"{rng.uniform(float(lo), float(hi)):.2f}") for _ in range(60)}
        n = 0
        for x in sorted(xs):
            y = _hand_to_input_unit(inp, x, unit)
            if not inp.min <= y <= inp.max:
                continue
            for ctx in contexts:
                want = _hand_total(system, inp, ctx, x, unit, y)
                if want is None:  # no input-unit value compares like it: refused, never guessed
                    with pytest.raises(FindingError, match="matches no value"):
                        evaluate(system, {**ctx, inp.id: f"{x} {unit}"})
                    continue
                got = evaluate(system, {**ctx, inp.id: f"{x} {unit}"}).total
                assert got == want, (system_id, inp.id, f"{x} {unit}", y)
                n += 1
        assert n > 0


# --------------------------------------------------------------------------------------------
# Findings given in a cut-off's own unit meet it exactly (the `Measured` path)
# --------------------------------------------------------------------------------------------
def test_measured_finding_keeps_what_was_given_and_survives_copies():
    import copy
    import pickle

    from equipoise.scoring_systems.engine import Measured

    ev = evaluate(SYSTEMS["glasgow_blatchford"], {**GBS_CASE, "bun": "6.49 mmol/L"})
    m = ev.known["bun"]
    assert isinstance(m, Measured) and m == 18.2 and (m.given, m.unit) == (6.49, "mmol/L")
    assert m.stated() == "6.49 mmol/L"
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert isinstance(twin, Measured) and twin == m and twin.stated() == m.stated()
    # read back from its stated form it scores the same; its rounded US value alone would not
    assert evaluate(SYSTEMS["glasgow_blatchford"], {**GBS_CASE, "bun": m.stated()}).total == 0
    assert evaluate(SYSTEMS["glasgow_blatchford"], {**GBS_CASE, "bun": float(m)}).total == 2
    # the same unit under another spelling is the definition's unit: a plain number
    plain = evaluate(SYSTEMS["has_bled"], {**HAS_BLED_CASE, "creatinine": "2.26 mg/dL"}).known["creatinine"]
    assert plain.__class__ is float


def test_witnesses_of_a_case_with_a_measured_finding_complete_it_on_their_side():
    """A partial case with urea given in mmol/L: each criterion's witness completion, added to
    the findings as given, scores on the side the witness claims."""
    system = SYSTEMS["glasgow_blatchford"]
    case = {k: v for k, v in GBS_CASE.items() if k not in ("melena", "sbp")}
    for bun in ("6.49 mmol/L", "6.5 mmol/L"):
        ev = evaluate(system, {**case, "bun": bun})
        assert ev.missing == ["sbp", "melena"] or set(ev.missing) == {"sbp", "melena"}
        for cid, r in ev.criteria.items():
            crit = next(c for c in system.criteria if c.id == cid)
            for w, side in ((r.witness_met, True), (r.witness_not_met, False)):
                if w is not None:
                    total = evaluate(system, {**case, "bun": bun, **w}).total
                    assert total is not None and crit.holds(total) is side, (bun, cid, w)


def test_a_truth_pattern_no_definition_unit_value_has_is_refused(tmp_path):
    """Two cut-offs that meet at the same rounded value (6.5 mmol/L urea and a crafted 18.2 mg/dL
    band): 6.49 mmol/L is below the first and, as 18.2 mg/dL, on the second, which no value in
    mg/dL can be. The engine refuses it rather than guessing a class."""
    import yaml

    from equipoise.scoring_systems.loader import DEFINITIONS_DIR, load_definition

    data = yaml.safe_load((DEFINITIONS_DIR / "glasgow_blatchford.yaml").read_text())
    data["items"].append(
        {
            "id": "crafted_bun",
            "label": "crafted BUN band in mg/dL",
            "kind": "rule",
            "cases": [{"when": {"input": "bun", "ge": 18.2}, "points": 1}],
            "default": 0,
        }
    )
    data.pop("examples", None)
    p = tmp_path / "glasgow_blatchford.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    system = load_definition(p)
    assert evaluate(system, {**GBS_CASE, "bun": "6.5 mmol/L"}).total == 3
    assert evaluate(system, {**GBS_CASE, "bun": "6.4 mmol/L"}).total == 0
    with pytest.raises(FindingError, match=r"bun.*6\.49 mmol/L.*matches no value in mg/dL"):
        evaluate(system, {**GBS_CASE, "bun": "6.49 mmol/L"})


@pytest.mark.parametrize("system_id", SI_SYSTEMS)
def test_random_partial_findings_with_values_in_other_units_equal_enumeration(system_id):
    """Random partial cases whose known numeric findings are off-grid values given in the other
    convention's unit (two decimals, anywhere in range): the engine's reachable totals and labels
    equal plain enumeration of class completions (`bruteforce.reachable`, totals by the point
    table on the values as parsed)."""
    from equipoise.scoring_systems.engine import normalize_findings

    system = SYSTEMS[system_id]
    cs = compile_system(system)
    rng = random.Random(f"measured-partial-{system_id}")
    ids = [i.id for i in system.inputs]
    reps = {i.id: list(cs.classes[i.id]) for i in system.inputs if isinstance(i, NumericInput)}
    trials = 0
    for _ in range(120):
        full: dict = {}
        for inp in system.inputs:
            unit = _other_unit(inp) if isinstance(inp, NumericInput) else None
            if unit is None or inp.quantity == "temperature":
                full[inp.id] = random_value(inp, rng)
                continue
            factor = bruteforce.FACTORS[(inp.quantity, unit, inp.unit)]
            lo, hi = Decimal(str(inp.min)) / factor, Decimal(str(inp.max)) / factor
            full[inp.id] = f"{rng.uniform(float(lo), float(hi)):.2f} {unit}"
        missing = rng.sample(ids, rng.randint(1, len(ids)))
        known = {i: v for i, v in full.items() if i not in missing}
        space = 1
        for i in missing:
            space *= len(cs.classes[i])
        if space > 20_000:
            continue
        try:
            parsed = normalize_findings(system, known)
        except FindingError:  # rounded just outside the possible range
            continue
        expect = bruteforce.reachable(system, parsed, reps)
        ev = evaluate(system, known)
        assert ev.reachable == expect, (system_id, known)
        assert {c: r.label for c, r in ev.criteria.items()} == bruteforce.labels(system, expect)
        trials += 1
    assert trials >= 30
