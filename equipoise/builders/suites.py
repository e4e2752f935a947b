"""Named recipes that reproduce each seed paper's variant design from one set of source items.

A suite maps source items to named configs. Each recipe is declared once here and is pure given
(items, seed, context remover), so a rebuild is byte-identical and every row's provenance says how it
was made. Departures from the seeds' public releases are deliberate and documented per recipe.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from equipoise.builders.clindet import sub_seed
from equipoise.builders.transforms import (
    TransformError,
    add_nota,
    apply_llm_edit,
    insert_abstain,
    keep_k_distractors,
    remove_key_context_span,
    replace_gold,
    set_variant,
    shuffle_options,
)
from equipoise.schemas.items import LLMEdit, MCQItem


class ContextRemover(Protocol):
    """Something that proposes a key-context removal for an item (an LLM client, a cache)."""

    def edit(self, item: MCQItem) -> LLMEdit: ...


@dataclass
class SuiteOptions:
    seed: int = 0
    context_removal: str = "span"  # span | llm
    remover: ContextRemover | None = None
    max_k: int | None = None
    n_shuffles: int = 4
    eval_split: str = "test"  # source split evaluated (MedMCQA: 'validation', its test has no keys)
    pool_split: str = "train"  # source split few-shot pools are drawn from


@dataclass
class SuiteResult:
    configs: dict[str, list[MCQItem]]
    descriptions: dict[str, str]
    failures: list[dict[str, str]] = field(default_factory=list)
    eval_configs: list[str] = field(default_factory=list)
    pool_configs: list[str] = field(default_factory=list)


def _split(items: list[MCQItem], name: str) -> list[MCQItem]:
    return [i for i in items if i.source.split == name]


def _perturb(item: MCQItem, opts: SuiteOptions) -> MCQItem:
    """Remove the key context once; every derived variant reuses this single recorded edit."""
    if opts.context_removal == "span":
        return remove_key_context_span(item)
    if opts.context_removal == "llm":
        if opts.remover is None:
            raise TransformError("context_removal='llm' needs a remover (an OpenAI-compatible client)")
        return apply_llm_edit(item, opts.remover.edit(item))
    raise TransformError(f"unknown context removal method {opts.context_removal!r}")


def _perturb_all(
    items: list[MCQItem], opts: SuiteOptions, failures: list[dict[str, str]]
) -> dict[str, MCQItem]:
    out: dict[str, MCQItem] = {}
    for it in items:
        try:
            out[it.base_id] = _perturb(it, opts)
        except (TransformError, ValueError) as exc:
            failures.append({"item": it.base_id, "step": "remove_key_context", "reason": str(exc)})
    return out


# ---------------------------------------------------------------------------------------------
# MedAbstain (seed 000)
# ---------------------------------------------------------------------------------------------
def medabstain(items: list[MCQItem], opts: SuiteOptions) -> SuiteResult:
    """NA / A / NAP / AP on the test split, and the four few-shot pools (Appendix C) on train.

    Fix over the public release: AP is *always* NAP plus the abstain option, built from the same
    recorded edit and the same abstain position as A, so NAP vs AP differ in exactly one factor.
    """
    seed = opts.seed
    failures: list[dict[str, str]] = []
    test = _split(items, opts.eval_split)
    train = _split(items, opts.pool_split)
    na = [set_variant(i, "NA") for i in test]
    a = [set_variant(insert_abstain(i, "Abstain", seed=seed), "A") for i in test]
    pert = _perturb_all(test, opts, failures)
    nap = [set_variant(pert[i.base_id], "NAP") for i in test if i.base_id in pert]
    ap = [
        set_variant(insert_abstain(pert[i.base_id], "Abstain", seed=seed), "AP")
        for i in test
        if i.base_id in pert
    ]

    pool_na = [set_variant(i, "pool_NA") for i in train]
    pool_a = [set_variant(insert_abstain(i, "Abstain", seed=seed), "pool_A") for i in train]
    tpert = _perturb_all(train, opts, failures)
    rng = random.Random(sub_seed(seed, "medabstain-pools"))
    eligible = [i for i in train if i.base_id in tpert]
    half = set(i.base_id for i in rng.sample(eligible, len(eligible) // 2))
    mixed = [tpert[i.base_id] if i.base_id in half else i for i in train]
    pool_pna = [set_variant(i, "pool_P-NA") for i in mixed]
    perturbed_half = sorted(half)
    relabel = set(rng.sample(perturbed_half, len(perturbed_half) // 2))
    pool_prand = [
        set_variant(
            replace_gold(i, "Abstain", position="gold", seed=seed) if i.base_id in relabel else i,
            "pool_P-RandAbst",
        )
        for i in mixed
    ]
    configs = {
        "NA": na,
        "A": a,
        "NAP": nap,
        "AP": ap,
        "pool_NA": pool_na,
        "pool_A": pool_a,
        "pool_P-NA": pool_pna,
        "pool_P-RandAbst": pool_prand,
    }
    desc = {
        "NA": "original test items, no abstain option",
        "A": "abstain option inserted at a seeded random position; gold still the target",
        "NAP": "key clinical context removed (one recorded edit); no abstain option",
        "AP": "NAP plus the abstain option at A's position (same edit as NAP)",
        "pool_NA": "few-shot pool: original train items",
        "pool_A": "few-shot pool: train items with the abstain option",
        "pool_P-NA": "few-shot pool: 50% perturbed, 50% original train items",
        "pool_P-RandAbst": "few-shot pool: as P-NA, with half the perturbed items relabelled so "
        "the abstain option replaces the gold and is the target",
    }
    return SuiteResult(
        configs,
        desc,
        failures,
        ["NA", "A", "NAP", "AP"],
        ["pool_NA", "pool_A", "pool_P-NA", "pool_P-RandAbst"],
    )


# ---------------------------------------------------------------------------------------------
# CLEAR (seed 001)
# ---------------------------------------------------------------------------------------------
CLEAR_TASKS: dict[str, tuple[str | None, str | None]] = {
    # task: (replacement of the gold, extra abstain option added)
    "gold": (None, None),
    "na": ("NA", None),
    "idk": ("IDK", None),
    "ina": ("INA", None),
    "na_idk": ("NA", "IDK"),
    "na_ina": ("NA", "INA"),
}


def clear(items: list[MCQItem], opts: SuiteOptions) -> SuiteResult:
    """k = 1..max distractors x target in {gold, NA, IDK, INA}, plus the NA+IDK and NA+INA answer
    spaces (gold replaced by NA, the second framing added last). For each item and k one
    distractor subset S_k is drawn and shared by all six tasks, as in the paper's protocol."""
    test = _split(items, opts.eval_split)
    n_dis = [sum(o.role == "distractor" for o in i.options) for i in test]
    max_dis = max(n_dis)
    max_k = min(opts.max_k or max_dis, max_dis)
    configs: dict[str, list[MCQItem]] = {}
    desc: dict[str, str] = {}
    for k in range(1, max_k + 1):
        # The transforms are pure in (item, k, seed), so S_k is drawn once per item and shared by
        # all six tasks, and each gold replacement once and shared by the tasks that add a second
        # framing to it: the same items as re-deriving them per task, without the repeated work.
        kept = [
            keep_k_distractors(it, k, seed=opts.seed) for it, n in zip(test, n_dis, strict=True) if n >= k
        ]
        replaced: dict[str, list[MCQItem]] = {}
        for task, (repl, extra) in CLEAR_TASKS.items():
            name = f"k{k}_{task}"
            if repl is None:
                base = kept
            else:
                if repl not in replaced:
                    replaced[repl] = [replace_gold(x, repl, position="gold", seed=opts.seed) for x in kept]
                base = replaced[repl]
            if extra is not None:
                base = [insert_abstain(x, extra, position="last", seed=opts.seed) for x in base]
            configs[name] = [set_variant(x, name) for x in base]
            target = "the gold answer" if repl is None else f"'{repl}' (gold removed)"
            desc[name] = f"{k} distractor(s); target {target}" + (
                f"; '{extra}' also offered" if extra else ""
            )
    return SuiteResult(configs, desc, [], list(configs), [])


# ---------------------------------------------------------------------------------------------
# NOTA stress tests (seed 004) and option shuffling (seed 002)
# ---------------------------------------------------------------------------------------------
def nota(items: list[MCQItem], opts: SuiteOptions) -> SuiteResult:
    test = _split(items, opts.eval_split)
    configs = {
        "original": [set_variant(i, "original") for i in test],
        "plus_nota": [set_variant(add_nota(i, "last", seed=opts.seed), "plus_nota") for i in test],
        "minus_correct_plus_nota": [
            set_variant(replace_gold(i, "nota", position="gold", seed=opts.seed), "minus_correct_plus_nota")
            for i in test
        ],
    }
    desc = {
        "original": "unperturbed items (the flip-analysis baseline)",
        "plus_nota": "+nota: 'None of the options is correct' added as a distractor; gold stays",
        "minus_correct_plus_nota": "-correct+nota: the gold is replaced by the NOTA option, now the target",
    }
    return SuiteResult(configs, desc, [], list(configs), [])


def shuffle(items: list[MCQItem], opts: SuiteOptions) -> SuiteResult:
    test = _split(items, opts.eval_split)
    rows = []
    for i in test:
        for p in shuffle_options(i, opts.n_shuffles, seed=opts.seed):
            rows.append(p.model_copy(update={"variant": "shuffled"}))
    configs = {"original": [set_variant(i, "original") for i in test], "shuffled": rows}
    desc = {
        "original": "unshuffled items",
        "shuffled": f"{opts.n_shuffles} seeded permutations per item; option_id keeps identity",
    }
    return SuiteResult(configs, desc, [], list(configs), [])


MCQ_SUITES: dict[str, Callable[[list[MCQItem], SuiteOptions], SuiteResult]] = {
    "medabstain": medabstain,
    "clear": clear,
    "nota": nota,
    "shuffle": shuffle,
}
