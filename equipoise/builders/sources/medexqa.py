"""MedExQA: one config per specialty, header-less TSV files (dev / test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    RowError,
    SourceKind,
    SourceSpec,
    has_configs,
    letter_gold,
    make_item,
    open_location,
    opt_text,
    register,
    root_cause,
    sha256_files,
    text_field,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import ItemMetadata, MCQItem

# MedExQA's five specialties (Hub config names) and the names its README table gives them.
MEDEXQA_SPECIALTIES = {
    "biomedical_engineer": "Biomedical Engineering",
    "clinical_laboratory_scientist": "Clinical Laboratory Science",
    "clinical_psychologist": "Clinical Psychology",
    "occupational_therapist": "Occupational Therapy",
    "speech_pathologist": "Speech Language Pathology",
}
MEDEXQA_COLUMNS = ["question", "A", "B", "C", "D", "exp0", "exp1", "answer"]  # the TSVs have no header


# ---------------------------------------------------------------------------------------------
# MedExQA: bluesky333/MedExQA, one config per specialty, header-less TSV (dev / test).
# Checked against the Hub card (configs, file paths) and knowlab/MedExQA (README: "provided without
# headers", columns question, A-D, two explanations, answer; evaluate_MedExQA.py reads them with
# names=[question, A, B, C, D, exp0, exp1, answer]).
# ---------------------------------------------------------------------------------------------
def medexqa_row(row: dict[str, Any], ctx: Ctx, specialty: str) -> MCQItem:
    """Columns (no header): question, A, B, C, D, exp0, exp1, answer letter -> item."""
    question = text_field(row, "question")
    options = []
    for i, letter in enumerate("ABCD"):
        text = opt_text(row.get(letter))
        if text is None:
            raise RowError(letter, "missing or empty option")
        options.append((i, text))
    gold = letter_gold(row.get("answer"), "answer", list("ABCD"))
    n = f"{ctx.n:04d}"
    return make_item(
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
    elif loc.is_dir() and not has_configs(loc):
        specialties = sorted({p.name.rsplit("_", 1)[0] for p in loc.rglob("*.tsv")})
    else:
        try:
            specialties = datasets.get_dataset_config_names(spec.location, revision=spec.revision)
        except Exception as exc:
            raise SourceError(f"{spec.location}: cannot list its configs ({root_cause(exc)})") from exc
    release_folder = loc.is_dir() and not has_configs(loc)
    open_spec = spec
    if release_folder and not spec.revision:  # one revision for every specialty's files together
        used = [p for p in loc.rglob("*.tsv") if p.name.rsplit("_", 1)[0] in specialties]
        if not used:
            raise SourceError(f"{loc}: no <specialty>_<split>.tsv files for {specialties}")
        open_spec = spec.model_copy(update={"revision": sha256_files(used, loc)})
    col = Collector(spec)
    revisions: list[str] = []
    notes: dict[str, str] = {}
    for sp in specialties:
        opened = open_location(
            open_spec,
            config=None if (loc.is_file() or release_folder) else sp,
            data_glob="**/*.tsv",
            name_filter=lambda p, sp=sp: p.name.rsplit("_", 1)[0] == sp,
            builder_kwargs=kw,
        )
        revisions.append(opened.revision)
        notes.update(opened.notes)
        for part in opened.parts:
            ctx = Ctx(dataset="medexqa", prefix="medexqa", split=part.split, revision=opened.revision)
            col.run(part, ctx, lambda r, c, sp=sp: medexqa_row(r, c, sp))
    revision = (
        revisions[0]
        if len(set(revisions)) == 1
        else ",".join(f"{s}:{r}" for s, r in zip(specialties, revisions, strict=True))
    )
    return col.items, col.record("medexqa", revision, spec, specialties=",".join(specialties), **notes)


register(SourceKind("medexqa", _load_medexqa, frozenset({"specialty"}), summary="MedExQA"))
