"""Every suite builds offline from the embedded defaults into a dataset `load_dataset` reads."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from equipoise.builders.calc_mcq import category_partition
from equipoise.builders.dataset_writer import write_manifest
from equipoise.builders.mcq_build import ALL_SUITES, build_mcq_suite
from equipoise.builders.sources.mini import mini_items
from equipoise.builders.validate import validate_folder
from equipoise.cli import app
from equipoise.schemas.items import MCQItem
from equipoise.scoring_systems.loader import get_system
from tests import bruteforce
from tests.conftest import load_local

SMALL = {"per_system": 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("suites")
    out = {}
    for suite in ALL_SUITES:
        out[suite] = (root / suite, build_mcq_suite(suite, root / suite, seed=4, **SMALL))
    return out


def test_bundled_source_meets_its_brief():
    items = mini_items()
    assert len(items) >= 120
    assert len({i.metadata.specialty for i in items}) >= 6
    types = Counter(i.metadata.question_type for i in items)
    assert set(types) == {
        "diagnosis",
        "treatment",
        "diagnostic_test",
        "definition",
        "procedure_operation",
        "other",
    }
    assert all(i.metadata.key_fact and i.metadata.key_fact in i.question for i in items)
    splits = Counter(i.source.split for i in items)
    assert splits["test"] > 0 and splits["train"] > 0


@pytest.mark.parametrize("suite", ALL_SUITES)
def test_every_config_loads_with_datasets(built, suite):
    folder, manifest = built[suite]
    for name, info in manifest["configs"].items():
        ds = load_local(folder, name)
        assert ds.num_rows == info["rows"] > 0, name
        row = ds[0]
        item = MCQItem.model_validate(row)  # rows re-validate as the typed record
        assert item.variant and item.provenance is not None
    rep = validate_folder(folder)
    assert rep.ok, rep.problems


def test_medabstain_design(built):
    folder, m = built["medabstain"]
    rows = {n: [MCQItem.model_validate(r) for r in _rows(folder, m, n)] for n in m["configs"]}
    n_test = len(rows["NA"])
    assert len(rows["A"]) == n_test and len(rows["NAP"]) == len(rows["AP"]) == n_test
    a = {i.base_id: i for i in rows["A"]}
    nap = {i.base_id: i for i in rows["NAP"]}
    for ap in rows["AP"]:
        # AP = NAP + abstain option, same edit, same position as A
        assert ap.question == nap[ap.base_id].question
        assert [o.option_id for o in ap.options] == [o.option_id for o in a[ap.base_id].options]
        assert ap.target.role == "gold" and ap.abstain_expected
    assert all(sum(o.role == "abstain" for o in i.options) == 1 for i in rows["A"])
    assert all(not any(o.role == "abstain" for o in i.options) for i in rows["NA"] + rows["NAP"])
    prand = rows["pool_P-RandAbst"]
    n_abst_target = sum(i.target.role == "abstain" for i in prand)
    n_pert = sum(i.abstain_expected for i in rows["pool_P-NA"])
    assert n_pert == len(prand) // 2 and n_abst_target == n_pert // 2
    test_ids = {i.base_id for i in rows["NA"]}
    assert not test_ids & {i.base_id for n in m["pool_configs"] for i in rows[n]}


def test_clear_design(built):
    folder, m = built["clear"]
    names = list(m["configs"])
    assert {"k1_gold", "k1_na", "k1_idk", "k1_ina", "k1_na_idk", "k1_na_ina", "k3_gold"} <= set(names)
    k2 = {
        n: {i.base_id: i for i in map(MCQItem.model_validate, _rows(folder, m, n))}
        for n in ("k2_gold", "k2_na", "k2_na_idk")
    }
    for bid, g in k2["k2_gold"].items():
        na = k2["k2_na"][bid]
        # the same distractor subset S_k under every task
        dis = lambda it: {o.option_id for o in it.options if o.role == "distractor"}  # noqa: E731
        assert dis(g) == dis(na) == dis(k2["k2_na_idk"][bid])
        assert len(dis(g)) == 2 and g.target.role == "gold"
        assert na.target.framing == "NA" and not any(o.role == "gold" for o in na.options)
        both = k2["k2_na_idk"][bid]
        assert both.target.framing == "NA" and {o.framing for o in both.options if o.framing} == {"NA", "IDK"}


def test_nota_and_shuffle(built):
    folder, m = built["nota"]
    plus = [MCQItem.model_validate(r) for r in _rows(folder, m, "plus_nota")]
    minus = [MCQItem.model_validate(r) for r in _rows(folder, m, "minus_correct_plus_nota")]
    assert all(i.target.role == "gold" and i.options[-1].role == "nota" for i in plus)
    assert all(i.target.role == "nota" for i in minus)
    folder, m = built["shuffle"]
    sh = [MCQItem.model_validate(r) for r in _rows(folder, m, "shuffled")]
    orig = {i.base_id: i for i in map(MCQItem.model_validate, _rows(folder, m, "original"))}
    assert len(sh) == 4 * len(orig)
    for s in sh:
        assert s.target.option_id == orig[s.base_id].target.option_id


def test_calc_mcq_abstain_targets_are_proved(built):
    folder, m = built["calc-mcq"]
    checked = 0
    for name in m["configs"]:
        for it in map(MCQItem.model_validate, _rows(folder, m, name)):
            params = it.provenance[0].params
            system = get_system(params["system"])
            known = json.loads(_case_findings(params, system))
            totals = bruteforce.reachable(system, known, _reps(system))
            part = category_partition(system)
            if part is not None:
                hit = {c.id for c in part if any(c.holds(t) for t in totals)}
            else:
                pc = system.primary_criterion
                hit = {f"{pc.id}:{pol}" for pol in (True, False) if any(pc.holds(t) == pol for t in totals)}
            if len(hit) == 1:
                assert it.target.role == "gold" and not it.abstain_expected
            else:
                assert it.target.role == "abstain" and it.abstain_expected
                assert name == "incomplete_undeterminable"
            checked += 1
    assert checked > 50


def test_same_seed_same_bytes(built, tmp_path):
    for suite in ("medabstain", "clear"):
        folder, m = built[suite]
        again = build_mcq_suite(suite, tmp_path / suite, seed=4, **SMALL)
        assert again == m
        for rel in m["files"]:
            assert (folder / rel).read_bytes() == (tmp_path / suite / rel).read_bytes()


def test_cli_build_and_validate(tmp_path):
    out = tmp_path / "nota"
    r = CliRunner().invoke(app, ["build", "nota", "--out", str(out), "--seed", "2"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["validate", str(out)])
    assert r.exit_code == 0 and "nota" in r.output, r.output


def test_validate_catches_pool_leakage(built, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    from equipoise.builders.dataset_writer import sha256_file

    folder, m = built["medabstain"]
    bad = tmp_path / "leak"
    shutil.copytree(folder, bad)
    pool_path = bad / m["configs"]["pool_NA"]["path"]
    na = pq.read_table(bad / m["configs"]["NA"]["path"])
    pool = pq.read_table(pool_path)
    import pyarrow as pa

    leaked = pa.concat_tables([pool, na.slice(0, 1)])
    pq.write_table(leaked, pool_path)
    man = json.loads((bad / "manifest.json").read_text())
    man["files"][m["configs"]["pool_NA"]["path"]] = sha256_file(pool_path)
    man["configs"]["pool_NA"]["rows"] = leaked.num_rows
    write_manifest(bad, man)  # a consistent manifest and digest: only the leak check can object
    rep = validate_folder(bad)
    assert not rep.ok and any("leaks" in p for p in rep.problems)


def _rows(folder, manifest, name):
    import pyarrow.parquet as pq

    return pq.read_table(folder / manifest["configs"][name]["path"]).to_pylist()


def _reps(system):
    from equipoise.scoring_systems.engine import compile_system

    cs = compile_system(system)
    return {i: list(cs.classes[i]) for i in cs.input_ids if system.input(i).kind == "numeric"}


def _case_findings(params, system):
    """Recover the stated findings of a calc-mcq item from its source ClinDet case."""
    from equipoise.builders.clindet import build_case

    case_id = params["case_id"]
    _, crit, cond, label, idx = _parse_case_id(case_id, system)
    case = build_case(system, system.criterion(crit), cond, label, idx, seed=4)
    assert case is not None and case.case_id == case_id
    return case.findings_json


def _parse_case_id(case_id, system):
    rest = case_id[len(system.id) + 1 :]
    for c in system.criteria:
        if rest.startswith(c.id + "-"):
            rest2 = rest[len(c.id) + 1 :]
            for cond in ("complete", "incomplete_determinable", "incomplete_undeterminable"):
                if rest2.startswith(cond + "-"):
                    lab, idx = rest2[len(cond) + 1 :].rsplit("-", 1)
                    return system.id, c.id, cond, {"met": "Met", "not_met": "Not met"}[lab], int(idx)
    raise AssertionError(case_id)
