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
from equipoise.builders.edits import ImportedEdit
from equipoise.builders.transforms import (
    TransformError,
    add_nota,
    apply_imported_edit,
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


ABSTAIN_POSITIONS = ("random", "first", "last", "source")
MEDABSTAIN_EVAL = ("NA", "A", "NAP", "AP")
MEDABSTAIN_POOLS = ("pool_NA", "pool_A", "pool_P-NA", "pool_P-RandAbst")


@dataclass
class SuiteOptions:
    seed: int = 0
    context_removal: str = "span"  # span | llm (imported edits, when given, take precedence)
    remover: ContextRemover | None = None
    max_k: int | None = None
    n_shuffles: int = 4
    eval_split: str = "test"  # source split evaluated (MedMCQA: 'validation', its test has no keys)
    pool_split: str = "train"  # source split few-shot pools are drawn from
    configs: list[str] | None = None  # None: every config of the suite
    edits: dict[str, ImportedEdit] = field(default_factory=dict)  # base id -> edit made elsewhere
    abstain_text: str | None = None  # None: the framing's standard text
    abstain_position: str = "random"  # random | first | last | source (the source's own position)
    abstain_positions: dict[str, int] = field(default_factory=dict)  # base id -> source's index
    pool_size: int | None = None  # None: every pool-split item
    pool_perturbed_share: float = 0.5  # share of the blended pools' items that are perturbed

    def wants(self, name: str) -> bool:
        return self.configs is None or name in self.configs


@dataclass
class SuiteResult:
    configs: dict[str, list[MCQItem]]
    descriptions: dict[str, str]
    failures: list[dict[str, str]] = field(default_factory=list)
    eval_configs: list[str] = field(default_factory=list)
    pool_configs: list[str] = field(default_factory=list)
    # items meant for each config (its denominator) and each one left out, with the reason
    items_in: dict[str, int] = field(default_factory=dict)
    dropped: list[dict[str, str]] = field(default_factory=list)
    # why a config came out empty and how to get it built: {config: (reason, fix)}
    empty_reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _split(items: list[MCQItem], name: str) -> list[MCQItem]:
    return [i for i in items if i.source.split == name]


def _perturb(item: MCQItem, opts: SuiteOptions) -> MCQItem:
    """Remove the key context once; every derived variant reuses this single recorded edit.

    An imported edit for the item (``--edits``, a release's perturbed file) is used first."""
    edit = opts.edits.get(item.base_id)
    if edit is not None:
        return apply_imported_edit(item, edit)
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


def _abstain_at(item: MCQItem, opts: SuiteOptions) -> int | str:
    """Where the abstain option goes for ``item`` (A and AP share it, so they differ in one factor)."""
    if opts.abstain_position == "first":
        return 0
    if opts.abstain_position == "source" and item.base_id in opts.abstain_positions:
        return opts.abstain_positions[item.base_id]
    if opts.abstain_position in ("random", "last", "source"):
        return "last" if opts.abstain_position == "last" else "random"
    raise TransformError(f"abstain position must be one of {', '.join(ABSTAIN_POSITIONS)}")


def _with_abstain(item: MCQItem, opts: SuiteOptions) -> MCQItem:
    return insert_abstain(
        item, "Abstain", position=_abstain_at(item, opts), seed=opts.seed, text=opts.abstain_text
    )


def _drops(config: str, wanted: list[MCQItem], built: dict[str, MCQItem], failures: list[dict[str, str]]):
    reason = {f["item"]: f["reason"] for f in failures}
    return [
        {"config": config, "item": i.base_id, "reason": reason.get(i.base_id, "not built")}
        for i in wanted
        if i.base_id not in built
    ]


def _removal_fix(opts: SuiteOptions) -> str:
    if opts.context_removal == "llm":
        return "check the LLM endpoint and the failures in build_report.json, or pass --edits FILE"
    return "use --context-removal llm, --edits FILE"


# ---------------------------------------------------------------------------------------------
# MedAbstain (seed 000)
# ---------------------------------------------------------------------------------------------
def medabstain(items: list[MCQItem], opts: SuiteOptions) -> SuiteResult:
    """NA / A / NAP / AP on the test split, and the four few-shot pools (Appendix C) on train.

    Fix over the public release: AP is *always* NAP plus the abstain option, built from the same
    recorded edit and the same abstain position as A, so NAP vs AP differ in exactly one factor.
    Only the requested configs are built (no LLM call is made for NAP when only NA / A are asked).
    """
    seed = opts.seed
    failures: list[dict[str, str]] = []
    dropped: list[dict[str, str]] = []
    empty: dict[str, tuple[str, str]] = {}
    test = _split(items, opts.eval_split)
    configs: dict[str, list[MCQItem]] = {}
    items_in: dict[str, int] = {}
    if opts.edits:
        how = "have a usable edit (imported, or from the key fact)"
    elif opts.context_removal == "span":
        how = "have a key fact or an edit"
    else:
        how = "got an accepted LLM edit"
    if opts.wants("NA"):
        configs["NA"] = [set_variant(i, "NA") for i in test]
    if opts.wants("A"):
        configs["A"] = [set_variant(_with_abstain(i, opts), "A") for i in test]
    if opts.wants("NAP") or opts.wants("AP"):
        pert = _perturb_all(test, opts, failures)
        if opts.wants("NAP"):
            configs["NAP"] = [set_variant(pert[i.base_id], "NAP") for i in test if i.base_id in pert]
            dropped += _drops("NAP", test, pert, failures)
        if opts.wants("AP"):
            configs["AP"] = [
                set_variant(_with_abstain(pert[i.base_id], opts), "AP") for i in test if i.base_id in pert
            ]
            dropped += _drops("AP", test, pert, failures)
        for name in ("NAP", "AP"):
            empty[name] = (f"0 of {len(test)} items {how}", _removal_fix(opts))
    for name in MEDABSTAIN_EVAL:
        if name in configs:
            items_in[name] = len(test)

    share = opts.pool_perturbed_share
    if not 0.0 <= share <= 1.0:
        raise TransformError(f"the perturbed share of the pools must be in 0..1, got {share}")
    if any(opts.wants(n) for n in MEDABSTAIN_POOLS):
        train = _split(items, opts.pool_split)
        if opts.pool_size is not None and opts.pool_size < len(train):
            keep = set(
                i.base_id
                for i in random.Random(sub_seed(seed, "medabstain-pool-size")).sample(train, opts.pool_size)
            )
            train = [i for i in train if i.base_id in keep]  # source order kept
        if opts.wants("pool_NA"):
            configs["pool_NA"] = [set_variant(i, "pool_NA") for i in train]
        if opts.wants("pool_A"):
            configs["pool_A"] = [set_variant(_with_abstain(i, opts), "pool_A") for i in train]
        if opts.wants("pool_P-NA") or opts.wants("pool_P-RandAbst"):
            tpert = _perturb_all(train, opts, failures)
            rng = random.Random(sub_seed(seed, "medabstain-pools"))
            eligible = [i for i in train if i.base_id in tpert]
            n_half = int(len(eligible) * share)
            half = set(i.base_id for i in rng.sample(eligible, n_half))
            mixed = [tpert[i.base_id] if i.base_id in half else i for i in train]
            perturbed_half = sorted(half)
            relabel = set(rng.sample(perturbed_half, len(perturbed_half) // 2))
            blended = {
                "pool_P-NA": [set_variant(i, "pool_P-NA") for i in mixed],
                "pool_P-RandAbst": [
                    set_variant(
                        replace_gold(i, "Abstain", position="gold", seed=seed, text=opts.abstain_text)
                        if i.base_id in relabel
                        else i,
                        "pool_P-RandAbst",
                    )
                    for i in mixed
                ],
            }
            for name, rows in blended.items():
                if not opts.wants(name):
                    continue
                if share > 0 and n_half == 0:
                    # the card promises perturbed items: an unperturbed "blend" is not built
                    rows = []
                    empty[name] = (
                        f"0 of {len(train)} pool items {how}, so the pool cannot be {share:.0%} perturbed",
                        _removal_fix(opts),
                    )
                    dropped += [
                        {"config": name, "item": i.base_id, "reason": "no perturbed pool item to blend"}
                        for i in train
                    ]
                configs[name] = rows
        for name in MEDABSTAIN_POOLS:
            if name in configs:
                items_in[name] = len(train)
    pct = f"{share:.0%}"
    text = f"'{opts.abstain_text}'" if opts.abstain_text else "the standard abstain text"
    where = {
        "random": "at a seeded random position",
        "first": "first",
        "last": "last",
        "source": "at the source's own position",
    }.get(opts.abstain_position, opts.abstain_position)
    desc = {
        "NA": "original test items, no abstain option",
        "A": f"abstain option ({text}) inserted {where}; gold still the target",
        "NAP": "key clinical context removed (one recorded edit); no abstain option",
        "AP": "NAP plus the abstain option at A's position (same edit as NAP)",
        "pool_NA": "few-shot pool: original train items",
        "pool_A": "few-shot pool: train items with the abstain option",
        "pool_P-NA": f"few-shot pool: {pct} perturbed, the rest original train items",
        "pool_P-RandAbst": "few-shot pool: as P-NA, with half the perturbed items relabelled so "
        "the abstain option replaces the gold and is the target",
    }
    return SuiteResult(
        configs,
        {k: v for k, v in desc.items() if k in configs},
        failures,
        [n for n in MEDABSTAIN_EVAL if n in configs],
        [n for n in MEDABSTAIN_POOLS if n in configs],
        items_in=items_in,
        dropped=dropped,
        empty_reasons=empty,
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
    max_dis = max(n_dis, default=0)
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
    dropped = [
        {"config": name, "item": it.base_id, "reason": f"only {n} distractor(s)"}
        for name in configs
        for it, n in zip(test, n_dis, strict=True)
        if n < int(name[1 : name.index("_")])
    ]
    items_in = {name: len(test) for name in configs}
    return SuiteResult(configs, desc, [], list(configs), [], items_in=items_in, dropped=dropped)


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
    return SuiteResult(configs, desc, [], list(configs), [], items_in={n: len(test) for n in configs})


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
    return SuiteResult(configs, desc, [], list(configs), [], items_in={n: len(test) for n in configs})


MCQ_SUITES: dict[str, Callable[[list[MCQItem], SuiteOptions], SuiteResult]] = {
    "medabstain": medabstain,
    "clear": clear,
    "nota": nota,
    "shuffle": shuffle,
}
