"""Write a folder laid out like the MedAbstain release, with original questions written for these tests.

Only the layout follows the release (file names; JSON lists of {id, source, question, choices, answer},
``randabst`` files with the abstain choice at a random letter, perturbed files adding
``original_question`` and ``meta: {key_information, gold_context, reason}``); every text is ours.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ABSTAIN = "I am unable to answer this question for certain reasons."

# (question, choices, gold letter, gold_context as the release states it, perturbed question)
TEST = [
    (
        "A 62-year-old woman reports crushing chest pain for 40 minutes. An ECG shows ST elevation in leads "
        "II, III and aVF. Which coronary artery is most likely occluded?",
        ["Left anterior descending artery", "Right coronary artery", "Left circumflex artery", "Left main"],
        "B",
        "An ECG shows ST elevation in leads II, III and aVF.",
        "A 62-year-old woman reports crushing chest pain for 40 minutes. Which coronary artery is most "
        "likely occluded?",
    ),
    (
        "A 7-year-old boy has periorbital swelling and cola-coloured urine two weeks after a sore throat. "
        "Which finding on serology is expected?",
        ["Low C3 complement", "Anti-GBM antibodies", "Positive ANCA", "High IgE", "Anti-dsDNA"],
        "A",
        # paraphrased: the release's gold context is rarely a verbatim span
        "the throat infection preceded the kidney signs by two weeks",
        "A 7-year-old boy has periorbital swelling and cola-coloured urine. Which finding on serology is "
        "expected?",
    ),
    (
        "A 30-year-old man has had a painless, indurated genital ulcer for a week. Dark-field microscopy "
        "shows spiral organisms. What is the treatment of choice?",
        [
            "Oral doxycycline for 3 days",
            "Intramuscular benzathine penicillin G",
            "Topical acyclovir",
            "Azithromycin",
        ],
        "B",
        "Dark-field microscopy shows spiral organisms.",
        "A 30-year-old man has had a genital ulcer for a week. What is the treatment of choice?",
    ),
    (
        "A 55-year-old man with cirrhosis has fever and abdominal tenderness. Ascitic fluid shows 480 "
        "neutrophils per microlitre. What is the most likely diagnosis?",
        [
            "Spontaneous bacterial peritonitis",
            "Hepatic encephalopathy",
            "Portal vein thrombosis",
            "Hepatorenal syndrome",
        ],
        "A",
        "Ascitic fluid shows 480 neutrophils per microlitre.",
        "A 55-year-old man with cirrhosis has fever and abdominal tenderness. What is the most likely "
        "diagnosis?",
    ),
]
VAL = [
    (
        "A 24-year-old woman has heat intolerance, weight loss and a diffuse goitre with a bruit. Which "
        "antibody is most likely present?",
        ["Anti-TSH receptor", "Anti-thyroid peroxidase only", "Anti-centromere", "Anti-Jo-1"],
        "A",
    ),
    (
        "A 70-year-old man has a resting tremor, bradykinesia and cogwheel rigidity. Loss of which neurons "
        "explains this?",
        [
            "Cerebellar Purkinje cells",
            "Dopaminergic neurons of the substantia nigra",
            "Motor neurons",
            "Basket cells",
        ],
        "B",
    ),
]
POOL = [
    (
        "A 45-year-old woman has fatigue and a haemoglobin of 8.9 g/dL with a low MCV and low ferritin. "
        "What is the next step?",
        ["Bone marrow biopsy", "Look for a source of blood loss", "Start erythropoietin", "Transfuse"],
        "B",
        "iron stores are depleted",  # paraphrased
        "A 45-year-old woman has fatigue and a haemoglobin of 8.9 g/dL. What is the next step?",
    ),
    (
        "A 19-year-old has a fever, neck stiffness and a petechial rash. CSF shows Gram-negative diplococci. "
        "Which organism is responsible?",
        [
            "Neisseria meningitidis",
            "Haemophilus influenzae",
            "Listeria monocytogenes",
            "Streptococcus agalactiae",
        ],
        "A",
        "CSF shows Gram-negative diplococci.",
        "",
    ),
    (
        "A 66-year-old smoker has haemoptysis and hypercalcaemia. Biopsy shows keratin pearls. What is the "
        "tumour type?",
        ["Small cell carcinoma", "Squamous cell carcinoma", "Carcinoid", "Mesothelioma"],
        "B",
        "Biopsy shows keratin pearls.",
        "A 66-year-old smoker has haemoptysis and hypercalcaemia. What is the tumour type?",
    ),
    (
        "A 33-year-old runner has pain at the medial tibia that worsens with exercise. X-ray is normal. "
        "What is the most likely diagnosis?",
        ["Medial tibial stress syndrome", "Osteosarcoma", "Compartment syndrome", "Gout"],
        "A",
        "The pain worsens with exercise.",
        "",
    ),
]
SOURCE = "MEDQA_1"


def _choices(texts: list[str]) -> dict[str, str]:
    return {chr(65 + k): t for k, t in enumerate(texts)}


def _row(i: int, question: str, texts: list[str], gold: str) -> dict:
    return {"id": i, "source": SOURCE, "question": question, "choices": _choices(texts), "answer": gold}


def _randabst(row: dict, rng: random.Random) -> dict:
    texts = list(row["choices"].values())
    gold_text = row["choices"][row["answer"]]
    texts.insert(rng.randrange(len(texts) + 1), ABSTAIN)
    return {**row, "choices": _choices(texts), "answer": chr(65 + texts.index(gold_text))}


def _dump(path: Path, rows: list[dict]) -> None:
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")


def write_release(folder: Path, pools: bool = True, ap_differs: tuple[int, ...] = (2,)) -> Path:
    """The release's files under ``folder``; ``pools=False`` leaves the pool files out (as many copies
    do); items in ``ap_differs`` get a different perturbed text in the randabst file (as in the
    release, whose NAP and AP texts differ for some items)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    plain = [_row(i, q, c, g) for i, (q, c, g, _, _) in enumerate(TEST)]
    _dump(folder / "medqa_1_test_noabst.json", plain)
    _dump(folder / "medqa_1_test_randabst.json", [_randabst(r, rng) for r in plain])
    pert = []
    for r, (q, _, _, gold_ctx, pq) in zip(plain, TEST, strict=True):
        meta = {"key_information": [gold_ctx], "gold_context": gold_ctx, "reason": "decides the answer"}
        pert.append({**r, "question": pq, "original_question": q, "meta": meta})
    _dump(folder / "perturbed_medqa_1_test_noabst.json", pert)
    pert_abst = []
    for r in pert:
        r2 = _randabst(r, rng)
        if r["id"] in ap_differs:
            r2 = {**r2, "question": r["question"].replace("What is", "Which is")}
        pert_abst.append(r2)
    _dump(folder / "perturbed_medqa_1_test_randabst.json", pert_abst)
    val = [_row(100 + i, q, c, g) for i, (q, c, g) in enumerate(VAL)]
    _dump(folder / "val_100_medqa_1_noabst.json", val)
    _dump(folder / "val_100_medqa_1_randabst.json", [_randabst(r, rng) for r in val])
    if pools:
        pool = [_row(200 + i, q, c, g) for i, (q, c, g, _, _) in enumerate(POOL)]
        _dump(folder / "few_shot_pool_medqa_1_train_noabst.json", pool)
        _dump(folder / "few_shot_pool_medqa_1_train_randabst.json", [_randabst(r, rng) for r in pool])
        blended = []
        for r, (_, _, _, fact, q) in zip(pool, POOL, strict=True):
            if q:  # half the pool perturbed, as the release's blended pool
                meta = {"key_information": fact, "gold_context": fact, "reason": "it is the key finding"}
                blended.append({**r, "question": q, "original_question": r["question"], "meta": meta})
            else:
                blended.append(r)
        _dump(folder / "perturbed_blended_few_shot_pool_medqa_1_train_noabst.json", blended)
    return folder
