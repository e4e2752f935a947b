"""The `clindet` suite: generated cases for every bundled scoring system, written as a dataset."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from string import Template
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.progress import Progress

from equipoise import __version__
from equipoise.builders.clindet import GENERATOR_VERSION, Shortfall, generate_system_cases
from equipoise.builders.dataset_writer import ConfigData, DatasetSpec, write_dataset
from equipoise.builders.prompts import all_templates, get_template
from equipoise.builders.vignette import UNIT_CONVENTIONS, Units
from equipoise.schemas.clindet import CONDITIONS, DeterminabilityCase, canonical_json
from equipoise.scoring_systems.loader import all_systems, definition_sha256
from equipoise.scoring_systems.rubric import build_rubric

CARDS_DIR = Path(__file__).resolve().parent.parent / "cards"
LICENSE = "cc-by-4.0"


class ExplanationRow(BaseModel):
    """One explanation-task prompt per system, with the rubric that grades the reply."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    system_id: str
    system_name: str
    template_id: str
    template_sha256: str
    messages_json: str
    rubric_json: str


class PromptRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    template_id: str
    task: str
    style: str
    sha256: str
    variables: list[str]
    messages_json: str


def build_clindet(
    out: Path,
    per_system: int = 60,
    seed: int = 0,
    systems: list[str] | None = None,
    progress: bool = True,
    units: Units = "us",
) -> dict[str, Any]:
    """Generate and write the suite; ``per_system`` cases per system for *each* condition.

    ``units`` only changes how vignettes state lab values ('us': the definitions' units, e.g. BUN
    mg/dL; 'si': SI, e.g. urea mmol/L): findings, labels and every proof are identical.

    The dataset is written into a hidden sibling of ``out`` and renamed into place when complete
    (:func:`equipoise.builders.mcq_build.staged`), so ``out`` is the old dataset or the new one, never
    half of one.
    """
    if units not in UNIT_CONVENTIONS:
        raise ValueError(f"units must be one of {UNIT_CONVENTIONS}, got {units!r}")
    registry = all_systems()
    chosen = [registry[s] for s in (systems or sorted(registry))]
    cases: list[DeterminabilityCase] = []
    shortfalls: list[Shortfall] = []
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("generating cases", total=len(chosen))
        for system in chosen:
            bar.update(task, description=f"generating {system.name}")
            got, short = generate_system_cases(system, per_system, seed, units=units)
            cases.extend(got)
            shortfalls.extend(short)
            bar.advance(task)
    by_cond = {c: [x for x in cases if x.condition == c] for c in CONDITIONS}
    expl_tpl = get_template("clindet_explanation")
    explanation = [
        ExplanationRow(
            system_id=s.id,
            system_name=s.name,
            template_id=expl_tpl.id,
            template_sha256=expl_tpl.sha256,
            messages_json=canonical_json(expl_tpl.render(system_name=s.name)),
            rubric_json=canonical_json(build_rubric(s).model_dump()),
        )
        for s in chosen
    ]
    prompts = [
        PromptRow(
            template_id=t.id,
            task=t.task,
            style=t.style,
            sha256=t.sha256,
            variables=t.variables,
            messages_json=canonical_json([m.model_dump() for m in t.messages]),
        )
        for t in all_templates().values()
        if t.id.startswith("clindet_")
    ]
    configs = [
        ConfigData("all", DeterminabilityCase, cases, "every case, all three conditions", default=True),
        *(ConfigData(c, DeterminabilityCase, by_cond[c], f"cases of condition {c}") for c in CONDITIONS),
        ConfigData(
            "explanation", ExplanationRow, explanation, "explanation-task prompt and rubric per system"
        ),
        ConfigData("prompts", PromptRow, prompts, "prompt templates with content hashes"),
    ]
    label_counts = {c: dict(sorted(Counter(x.label for x in by_cond[c]).items())) for c in CONDITIONS}
    per_system_counts = {
        s.id: dict(sorted(Counter(x.condition for x in cases if x.system_id == s.id).items())) for s in chosen
    }
    manifest_extra = {
        "suite": "clindet",
        "builder": "equipoise.builders.clindet",
        "builder_version": GENERATOR_VERSION,
        "package_version": __version__,
        "seed": seed,
        "per_system": per_system,
        "units": units,
        "sources": {
            s.id: {"name": s.name, "version": s.version, "definition_sha256": definition_sha256(s.id)}
            for s in chosen
        },
        "label_counts": label_counts,
        "cases_per_system": per_system_counts,
        "shortfalls": [sf.__dict__ for sf in shortfalls],
        "prompt_templates": {t.template_id: t.sha256 for t in prompts},
    }
    spec = DatasetSpec(
        pretty_name="Equipoise ClinDet determinability suite",
        license=LICENSE,
        configs=configs,
        manifest_extra=manifest_extra,
        card_body=_card(chosen, configs, shortfalls, seed, per_system, units),
        tags=["medical", "abstention", "determinability", "clinical-scoring-systems", "equipoise"],
    )
    # the same staged write as the MCQ builds: a failure leaves no half-written ``out``
    from equipoise.builders.mcq_build import staged

    with staged(out) as tmp:
        manifest = write_dataset(tmp, spec)
    return manifest


_UNITS_TEXT = {
    "us": "US conventional units in vignettes (BUN, creatinine, glucose, bilirubin, calcium in mg/dL; "
    "haemoglobin and albumin in g/dL; blood gases in mmHg; temperature in °F); `findings_json` keeps "
    "the definitions' units, and every stated value lies in the same cut-off class as the finding",
    "si": "SI units in vignettes (urea, glucose, calcium in mmol/L; creatinine and bilirubin in µmol/L; "
    "haemoglobin and albumin in g/L; blood gases in kPa); `findings_json` keeps the definitions' "
    "units, and every stated SI value lies in the same cut-off class as the finding",
}


def _card(
    systems: list,
    configs: list[ConfigData],
    shortfalls: list[Shortfall],
    seed: int,
    per: int,
    units: str = "us",
) -> str:
    config_table = "| config | rows | content |\n| --- | --- | --- |\n" + "\n".join(
        f"| `{c.name}` | {len(c.rows)} | {c.description} |" for c in configs
    )
    system_table = (
        "| id | name | target condition | primary criterion | source |\n| --- | --- | --- | --- | --- |\n"
    )
    system_table += "\n".join(
        f"| `{s.id}` | {s.name} | {s.target_condition} | {s.primary_criterion.label}: "
        f"{s.primary_criterion.describe()} | "
        f"{s.references[0].citation.split('.')[0]} ({s.references[0].year}) |"
        for s in systems
    )
    if shortfalls:
        shortfall_text = "## Slices that could not be filled\n\n" + "\n".join(
            f"- `{sf.system_id}` / `{sf.criterion_id}` / {sf.condition} / {sf.label}: "
            f"{sf.built} of {sf.requested} ({sf.reason})"
            for sf in shortfalls
        )
    else:
        shortfall_text = "Every requested slice was filled."
    tpl = Template((CARDS_DIR / "clindet.md").read_text(encoding="utf-8"))
    return tpl.substitute(
        n_systems=len(systems),
        config_table=config_table,
        generator_version=GENERATOR_VERSION,
        package_version=__version__,
        seed=seed,
        per_system=per,
        units_text=f"`{units}`: {_UNITS_TEXT[units]}",
        shortfall_text=shortfall_text,
        system_table=system_table,
        license=LICENSE,
    )


def read_cases(folder: Path, config: str = "all") -> list[DeterminabilityCase]:
    """Read a built config back through pyarrow and re-validate every row with pydantic."""
    import pyarrow.parquet as pq

    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    if config not in manifest["configs"]:
        raise KeyError(f"{folder}: no config '{config}'; has {sorted(manifest['configs'])}")
    table = pq.read_table(folder / manifest["configs"][config]["path"])
    out = []
    for i, row in enumerate(table.to_pylist()):
        try:
            out.append(DeterminabilityCase.model_validate(row))
        except Exception as exc:  # pydantic.ValidationError, with row context
            raise ValueError(f"{folder}/{manifest['configs'][config]['path']}: row {i}: {exc}") from exc
    return out
