"""The `equipoise` command line.

Every command explains itself with ``--help``. Errors a user can fix (unknown system, bad finding,
tampered dataset) print one line naming what is wrong and exit with status 2; nothing is half-written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="equipoise",
    help="Measure whether medical language models know when not to answer.\n\n"
    "Build benchmark variants with proved abstention labels, run models into a DuckDB store, "
    "and compute every metric in SQL.",
    no_args_is_help=True,
    add_completion=False,
)
systems_app = typer.Typer(help="Inspect and use the bundled clinical scoring systems.", no_args_is_help=True)
app.add_typer(systems_app, name="systems")
store_app = typer.Typer(
    help="Maintain DuckDB prediction stores: merge Parquet parts, migrate an older schema.",
    no_args_is_help=True,
)
app.add_typer(store_app, name="store")

# tables here are wide (policy x condition x 5 rates); never squeeze them below 110 columns
console = Console(width=max(Console().width, 110))
err = Console(stderr=True, soft_wrap=True, highlight=False)


def _fail(message: str | BaseException) -> None:
    """Exit 2 with one line. An error is reported by the first line of its message (DuckDB's go on
    with context lines; an empty message gives the error's type name, not an IndexError)."""
    if isinstance(message, BaseException):
        from equipoise.evaluators.store import first_line

        message = first_line(message)
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _connect(store: Path, read_only: bool = False, memory_limit: str | None = None) -> Any:
    """Open a store or exit with one line (missing file, locked by another writer, bad limit)."""
    import duckdb

    from equipoise.evaluators.store import StoreError, connect

    try:
        if read_only and store.is_dir():  # a folder of Parquet parts: read into an in-memory store
            from equipoise.evaluators.parts import open_parts

            return open_parts(store)
        return connect(store, read_only=read_only, memory_limit=memory_limit)
    except (FileNotFoundError, StoreError, ValueError, duckdb.Error) as exc:
        _fail(exc)


def _refresh_facts(con: Any) -> None:
    """After a write: recompute the store's fact tables (what ``equipoise metrics`` reads), in
    batches of runs under a memory cap (``facts.refresh``). The predictions are already
    committed; should this fail, metrics still compute from the source tables, so it is a
    warning, not an error."""
    import duckdb

    from equipoise.evaluators.metrics import facts
    from equipoise.evaluators.store import first_line

    try:
        facts.refresh(con)
    except duckdb.Error as exc:
        err.print(f"warning: fact tables not refreshed ({first_line(exc)}); metrics stay correct")


# ---------------------------------------------------------------------------------------------
# systems
# ---------------------------------------------------------------------------------------------
@systems_app.command("list")
def systems_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List every bundled scoring system with its inputs, items and primary criterion."""
    from equipoise.scoring_systems.loader import all_systems

    reg = all_systems()
    if as_json:
        rows = [
            {
                "id": s.id,
                "name": s.name,
                "inputs": len(s.inputs),
                "items": len(s.items),
                "criteria": [c.id for c in s.criteria],
                "primary": s.primary_criterion.describe(),
            }
            for s in reg.values()
        ]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title=f"{len(reg)} scoring systems")
    for col in ("id", "name", "target condition", "inputs", "items", "primary criterion"):
        table.add_column(col)
    for s in reg.values():
        pc = s.primary_criterion
        table.add_row(
            s.id,
            s.name,
            s.target_condition,
            str(len(s.inputs)),
            str(len(s.items)),
            f"{pc.label}: {pc.describe()}",
        )
    console.print(table)


def _system(name: str) -> Any:
    from equipoise.scoring_systems.loader import get_system

    try:
        return get_system(name)
    except KeyError as exc:
        _fail(str(exc.args[0]))


@systems_app.command("show")
def systems_show(
    name: Annotated[str, typer.Argument(help="System id or name, e.g. chads2 or CURB-65.")],
    as_json: Annotated[bool, typer.Option("--json", help="The full definition in schema form.")] = False,
) -> None:
    """Show a system's definition: findings, items with points, criteria and sources."""
    s = _system(name)
    if as_json:
        sys.stdout.write(s.model_dump_json(indent=2, by_alias=True, exclude_none=True) + "\n")
        return
    console.print(f"[bold]{s.name}[/] ({s.id}) — {s.target_condition}")
    console.print(s.summary)
    t = Table(title="findings")
    for col in ("input", "kind", "values / unit"):
        t.add_column(col)
    for i in s.inputs:
        desc = (
            f"{i.min}..{i.max} {i.unit} (step {i.step})"
            + "".join(f"; {u} in {r.unit}" for u, r in (("SI", i.si), ("US", i.us)) if r is not None)
            if i.kind == "numeric"
            else ", ".join(i.values())
            if i.kind == "categorical"
            else "yes / no"
        )
        t.add_row(i.id, i.kind, desc)
    console.print(t)
    from equipoise.schemas.scoring import published_cutoffs

    t = Table(title="published cut-offs (as the source states them; 'compared as': in the finding's unit)")
    for col in ("where", "bounds", "unit", "compared as", "source"):
        t.add_column(col)
    for row in published_cutoffs(s):
        t.add_row(*row)
    console.print(t)
    t = Table(title="criteria")
    for col in ("criterion", "rule", "primary"):
        t.add_column(col)
    for c in s.criteria:
        t.add_row(f"{c.id}: {c.label}", c.describe(), "yes" if c.primary else "")
    console.print(t)
    for r in s.references:
        console.print(f"[dim]{r.role}:[/] {r.citation}")


@systems_app.command("score")
def systems_score(
    name: Annotated[str, typer.Argument(help="System id or name.")],
    findings: Annotated[
        str, typer.Option("--findings", "-f", help="JSON object of known findings, e.g. '{\"age\": 80}'.")
    ] = "{}",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Score findings; with missing findings, give the exact reachable range and, per criterion,
    Met / Not met / Unable to determine."""
    from equipoise.scoring_systems.engine import FindingError, evaluate

    s = _system(name)
    try:
        parsed = json.loads(findings)
    except json.JSONDecodeError as exc:
        _fail(f"--findings is not valid JSON: {exc.msg} at position {exc.pos}")
    if not isinstance(parsed, dict):
        _fail("--findings must be a JSON object mapping finding ids to values")
    try:
        ev = evaluate(s, parsed)
    except FindingError as exc:
        _fail(str(exc))
    if as_json:
        out = {
            "system": s.id,
            "complete": ev.complete,
            "total": ev.total,
            "s_min": ev.s_min,
            "s_max": ev.s_max,
            "reachable": ev.reachable,
            "missing": ev.missing,
            "criteria": {
                k: {
                    "label": r.label,
                    "completions_met": r.completions_met,
                    "completions_not_met": r.completions_not_met,
                    "witness_met": r.witness_met,
                    "witness_not_met": r.witness_not_met,
                }
                for k, r in ev.criteria.items()
            },
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    if ev.complete:
        console.print(f"{s.name}: total [bold]{ev.total:g}[/]")
    else:
        console.print(
            f"{s.name}: missing {', '.join(ev.missing)}; reachable totals "
            f"[bold]{ev.s_min:g}..{ev.s_max:g}[/] ({', '.join(f'{x:g}' for x in ev.reachable)})"
        )
    for c in s.criteria:
        r = ev.criteria[c.id]
        console.print(f"  {c.label} ({c.describe()}): [bold]{r.label}[/]")


# ---------------------------------------------------------------------------------------------
# build / validate
# ---------------------------------------------------------------------------------------------
SUITES = ("clindet", "medabstain", "clear", "nota", "shuffle", "calc-mcq")


@app.command()
def build(
    suite: Annotated[str, typer.Argument(help=f"Suite to build: {', '.join(SUITES)}.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (created).")],
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="MCQA source: 'bundled' (the embedded mini-source) or KIND:LOCATION[@REV][?k=v] with KIND "
            "in medqa4, medqa5, medmcqa, medexqa, pubmedqa, gmai_mmbench, medabstain, generic (LOCATION: a "
            "local file/folder or a Hub dataset id).",
        ),
    ] = "bundled",
    eval_split: Annotated[
        str, typer.Option("--eval-split", help="Source split to evaluate (MedMCQA: validation).")
    ] = "test",
    pool_split: Annotated[
        str, typer.Option("--pool-split", help="Source split for few-shot pools.")
    ] = "train",
    per_system: Annotated[
        int, typer.Option("--per-system", min=1, help="clindet / calc-mcq: cases per system and condition.")
    ] = 60,
    seed: Annotated[int, typer.Option("--seed", help="Seed; same inputs and seed, same bytes.")] = 0,
    system: Annotated[
        list[str] | None, typer.Option("--system", help="clindet: restrict to these systems (repeatable).")
    ] = None,
    max_k: Annotated[int | None, typer.Option("--max-k", help="clear: largest distractor count.")] = None,
    shuffles: Annotated[int, typer.Option("--shuffles", min=1, help="shuffle: permutations per item.")] = 4,
    context_removal: Annotated[
        str, typer.Option("--context-removal", help="medabstain: 'span' (annotated key fact) or 'llm'.")
    ] = "span",
    llm_model: Annotated[str | None, typer.Option("--llm-model", help="llm removal: model name.")] = None,
    llm_base_url: Annotated[
        str | None, typer.Option("--llm-base-url", help="llm removal: OpenAI-compatible endpoint.")
    ] = None,
    llm_cache: Annotated[
        Path, typer.Option("--llm-cache", help="llm removal: cache folder (rebuilds never re-ask).")
    ] = Path(".equipoise-cache/llm-edits"),
    configs: Annotated[
        str | None, typer.Option("--configs", help="Build only these configs (comma-separated).")
    ] = None,
    edits: Annotated[
        Path | None,
        typer.Option(
            "--edits",
            help="medabstain: precomputed perturbations, JSONL rows {item_id, perturbed_question, "
            "removed_text[, rationale, producer]}; used before --context-removal.",
        ),
    ] = None,
    abstain_text: Annotated[
        str | None, typer.Option("--abstain-text", help="medabstain: text of the abstain option.")
    ] = None,
    abstain_position: Annotated[
        str | None,
        typer.Option(
            "--abstain-position",
            help="medabstain: random, first, last or source (the source's own; default when it has one).",
        ),
    ] = None,
    pool_size: Annotated[
        int | None, typer.Option("--pool-size", help="medabstain: items per few-shot pool (default: all).")
    ] = None,
    pool_perturbed_share: Annotated[
        float,
        typer.Option("--pool-perturbed-share", help="medabstain: perturbed share of the blended pools."),
    ] = 0.5,
    units: Annotated[
        str, typer.Option("--units", help="clindet: lab values in vignettes in 'us' or 'si' units.")
    ] = "us",
    calibration_split: Annotated[
        str,
        typer.Option(
            "--calibration-split",
            help="Source split built into a 'validation' split of every evaluation config (calibration "
            "set); 'auto': the source's 'validation' split if it has one, 'none': no such split.",
        ),
    ] = "auto",
) -> None:
    """Build a suite as a versioned Parquet dataset that `datasets.load_dataset(OUT, CONFIG)` reads.

    clindet: determinability cases from the scoring systems. medabstain / clear / nota / shuffle:
    variants of an MCQA source. calc-mcq: category MCQs from the scoring systems with proved abstain
    labels."""
    if suite not in SUITES:
        _fail(f"unknown suite '{suite}'; available: {', '.join(SUITES)}")
    if suite == "clindet":
        from equipoise.builders.clindet_suite import build_clindet
        from equipoise.builders.sources.mini import SourceError as OutputError

        if units not in ("us", "si"):
            _fail(f"--units must be 'us' or 'si', got '{units}'")
        ids = [_system(name).id for name in system] if system else None
        try:
            manifest = build_clindet(out, per_system=per_system, seed=seed, systems=ids, units=units)  # type: ignore[arg-type]
        except OutputError as exc:  # --out is not a folder a dataset may replace
            _fail(str(exc))
        except OSError as exc:  # an unwritable --out, a full disk: nothing was left behind
            _fail(f"{out}: cannot write the dataset ({exc.strerror or exc})")
        _print_build_summary(out, manifest)
        return
    from equipoise.builders.mcq_build import build_mcq_suite
    from equipoise.builders.sources.mini import SourceError
    from equipoise.builders.transforms import TransformError

    remover = None
    if context_removal == "llm":
        if not llm_model:
            _fail("--context-removal llm needs --llm-model")
        from equipoise.builders.llm_perturb import LLMContextRemover

        remover = LLMContextRemover(model=llm_model, base_url=llm_base_url, cache_dir=llm_cache)
    try:
        manifest = build_mcq_suite(
            suite,
            out,
            source=source,
            seed=seed,
            context_removal=context_removal,
            remover=remover,
            max_k=max_k,
            n_shuffles=shuffles,
            per_system=min(per_system, 30),
            eval_split=eval_split,
            pool_split=pool_split,
            configs=[c.strip() for c in configs.split(",") if c.strip()] if configs else None,
            edits=edits,
            abstain_text=abstain_text,
            abstain_position=abstain_position,
            pool_size=pool_size,
            pool_perturbed_share=pool_perturbed_share,
            calibration_split=calibration_split,
        )
    except (SourceError, TransformError, KeyError) as exc:
        _fail(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
    except OSError as exc:  # an unwritable --out, a full disk: nothing was left behind
        _fail(f"{out}: cannot write the dataset ({exc.strerror or exc})")
    _print_build_summary(out, manifest)


def _print_build_summary(out: Path, manifest: dict[str, Any]) -> None:
    t = Table(title=f"built {manifest['suite']} into {out}")
    t.add_column("config")
    t.add_column("rows", justify="right")
    extra = sorted({s for c in manifest["configs"].values() for s in c.get("splits", {})})
    for split in extra:
        t.add_column(f"{split} rows", justify="right")
    for name, c in manifest["configs"].items():
        own = c.get("splits", {})
        t.add_row(name, str(c["rows"]), *(str(own[s]["rows"]) if s in own else "-" for s in extra))
    console.print(t)
    if manifest.get("shortfalls"):
        console.print(f"[yellow]{len(manifest['shortfalls'])} slice(s) not fully built[/] (see README.md)")
    if manifest.get("failures"):
        console.print(
            f"[yellow]{len(manifest['failures'])} item(s) could not be transformed[/] (see README.md)"
        )
    for note in manifest.get("notes") or []:
        console.print(f"[yellow]note:[/] {note}")
    if manifest.get("build_report"):
        console.print(f"items in / out per config and every dropped item: {out / manifest['build_report']}")


@app.command()
def validate(
    ref: Annotated[str, typer.Argument(help="A dataset folder, or ORG/NAME[@REV] on the Hub.")],
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="Hub endpoint (default HF_ENDPOINT).")
    ] = None,
) -> None:
    """Check a dataset: sha256 of every file, pandera frame schemas, row-by-row record validation,
    label validity (ClinDet labels re-proved by the engine) and few-shot-pool leakage."""
    from equipoise.builders.publish import PublishError, fetch_published
    from equipoise.builders.validate import validate_folder

    folder = Path(ref)
    if not folder.is_dir():
        try:
            folder = fetch_published(ref, endpoint=endpoint, verify=False)
        except (PublishError, OSError, ValueError) as exc:
            _fail(f"{ref}: {exc}")
    rep = validate_folder(folder)
    if not rep.ok:
        for p in rep.problems[:20]:
            err.print(f"[red]{p}[/]")
        _fail(f"{ref}: {len(rep.problems)} problem(s)")
    total = sum(rep.rows.values())
    console.print(f"[green]ok[/] {ref} ({rep.suite}): {len(rep.rows)} configs, {total} rows")
    for c in rep.checks:
        console.print(f"  - {c}")


@app.command()
def publish(
    folder: Annotated[Path, typer.Argument(help="A built dataset folder (verified before upload).")],
    repo: Annotated[str, typer.Option("--repo", help="ORG/NAME of the dataset repository.")],
    version: Annotated[str, typer.Option("--version", help="Semantic version tag, vX.Y.Z.")],
    target: Annotated[str, typer.Option("--target", help="'hub' (huggingface_hub) or 'local'.")] = "hub",
    local_root: Annotated[
        Path | None, typer.Option("--local-root", help="With --target local: the folder to publish into.")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="Hub endpoint (default HF_ENDPOINT).")
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the repository as private.")] = False,
) -> None:
    """Publish a built dataset as one atomic commit and tag it with VERSION (token from HF_TOKEN,
    never stored). With --target local it writes the same layout under LOCAL_ROOT/ORG/NAME/VERSION."""
    from equipoise.builders.publish import PublishError, publish_to_hub, publish_to_local

    try:
        if target == "hub":
            res = publish_to_hub(folder, repo, version, endpoint=endpoint, private=private)
        elif target == "local":
            if local_root is None:
                _fail("--target local needs --local-root PATH")
            res = publish_to_local(folder, local_root, repo, version)
        else:
            _fail(f"--target must be 'hub' or 'local', got {target!r}")
    except (PublishError, ValueError) as exc:
        _fail(str(exc))
    state = "published" if res.created else "already published (identical, nothing to do)"
    console.print(f"[green]{state}[/] {repo}@{version}: {len(res.files)} files -> {res.url or res.path}")


# ---------------------------------------------------------------------------------------------
# the main job and SQL
# ---------------------------------------------------------------------------------------------
@app.command()
def quickstart(
    workdir: Annotated[Path, typer.Option("--workdir", help="Where the datasets and store go.")] = Path(
        "equipoise-work"
    ),
    per_system: Annotated[
        int, typer.Option("--per-system", min=1, help="ClinDet cases per system and condition.")
    ] = 60,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """The main job on embedded defaults, offline: build every suite from the bundled sources (the
    scoring systems and the mini MCQA source), run the reference policies on every evaluation
    config into a local DuckDB store, and print summaries computed in SQL."""
    from equipoise.builders.clindet_suite import build_clindet
    from equipoise.builders.mcq_build import MCQ_SUITES, build_mcq_suite
    from equipoise.evaluators.reference_run import DETERMINABILITY_SQL, MCQ_SQL, run_reference_policies

    folders = {}
    folders["clindet"] = workdir / "clindet"
    _print_build_summary(
        folders["clindet"], build_clindet(folders["clindet"], per_system=per_system, seed=seed)
    )
    for suite in (*MCQ_SUITES, "calc-mcq"):
        folders[suite] = workdir / suite
        m = build_mcq_suite(suite, folders[suite], seed=seed, per_system=max(2, per_system // 10))
        console.print(
            f"built {suite}: {len(m['configs'])} configs, "
            f"{sum(c['rows'] for c in m['configs'].values())} rows -> {folders[suite]}"
        )
    store = workdir / "store.duckdb"
    con = _connect(store)
    try:
        n_runs = 0
        for folder in folders.values():
            n_runs += len(run_reference_policies(con, folder, seed=seed))
        _refresh_facts(con)
        det = con.execute(DETERMINABILITY_SQL)
        det_rows, det_cols = det.fetchall(), [d[0] for d in det.description]
        mcq = con.execute(MCQ_SQL)
        mcq_rows, mcq_cols = mcq.fetchall(), [d[0] for d in mcq.description]
    finally:
        con.close()
    _print_table(
        "ClinDet determinability by condition (reference policies; SQL over the store)", det_cols, det_rows
    )
    _print_table("MCQA suites (reference policies; SQL over the store)", mcq_cols, mcq_rows)
    from equipoise.evaluators.report import write_report

    rep = write_report(store, workdir / "report")
    console.print(
        f"{n_runs} runs in {store}; report: {len(rep.tables)} tables, {len(rep.plots)} plots "
        f"in {workdir / 'report'}"
    )
    console.print(f'Query it yourself: equipoise sql --store {store} "SELECT * FROM runs"')


_SHORT = {
    "incomplete_determinable": "determinable",
    "incomplete_undeterminable": "undeterminable",
    "premature_judgment": "premature",
    "excessive_abstention": "over-abstain",
    "acc_gold_present": "acc gold in",
    "acc_gold_absent": "acc gold out",
    "accuracy": "acc",
    "configs": "cfgs",
    "model": "policy",
}


def _print_table(title: str, cols: list[str], rows: list[tuple]) -> None:
    t = Table(title=title)
    for c in cols:
        left = c in ("model", "condition", "suite")
        t.add_column(_SHORT.get(c, c), justify="left" if left else "right", no_wrap=left)
    for r in rows:
        cells = []
        for c, v in zip(cols, r, strict=True):
            if c == "model":
                cells.append(str(v).removeprefix("reference:"))
            elif isinstance(v, float):
                cells.append(f"{v:.3f}")
            elif v is None:
                cells.append("-")
            else:
                cells.append(_SHORT.get(str(v), str(v)))
        t.add_row(*cells)
    console.print(t)


def _dataset_folder(ref: str) -> Path:
    from equipoise.builders.publish import PublishError, fetch_published

    folder = Path(ref)
    if folder.is_dir():
        return folder
    try:
        return fetch_published(ref)
    except (PublishError, OSError, ValueError) as exc:
        _fail(f"{ref}: {exc}")
    raise AssertionError  # unreachable: _fail exits


@app.command("run")
def run_cmd(
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset folder or ORG/NAME[@REV].")],
    config: Annotated[str, typer.Option("--config", help="Config to run, e.g. AP or k3_idk.")],
    backend: Annotated[str, typer.Option("--backend", help="reference | openai | vllm")],
    model: Annotated[str, typer.Option("--model", help="Model name (reference: the policy name).")],
    store: Annotated[Path, typer.Option("--store", help="DuckDB store file (created).")] = Path(
        "equipoise-work/store.duckdb"
    ),
    prompt: Annotated[
        str, typer.Option("--prompt", help="Prompt style: base | cot | safe | confidence | fewshot (MCQ).")
    ] = "base",
    shots: Annotated[int, typer.Option("--shots", min=1, help="fewshot: examples per question.")] = 4,
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="fewshot: pool config (default: the variant's MedAbstain pool)."),
    ] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per item.")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 512,
    thinking: Annotated[
        bool | None,
        typer.Option(
            "--thinking/--no-thinking",
            help="Switch the chat template's thinking mode on or off (Qwen3-style models; sent as "
            "chat_template_kwargs.enable_thinking). Left out: the template's default, nothing sent.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N items.")] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="openai: any compatible endpoint.")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="openai: requests in flight.")] = 8,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    commit_every: Annotated[
        int, typer.Option("--commit-every", min=1, help="Rows per transaction (a kill loses at most these).")
    ] = 32,
    self_eval_of: Annotated[
        str | None,
        typer.Option(
            "--self-eval-of",
            metavar="RUN_ID",
            help="Instead of answering, judge the sample-0 answers of this decision run (same dataset "
            "and config) in new conversations, Correct / Incorrect (seed 003). Stored as a run with "
            "prompt style self_eval:<the run's style>; --prompt is taken from that run.",
        ),
    ] = None,
    other_judge: Annotated[
        bool,
        typer.Option(
            "--other-judge",
            help="--self-eval-of: allow --model to differ from the judged run's model (its verdicts "
            "are still linked to that run and counted as self-evaluations).",
        ),
    ] = False,
    parse_fallback_model: Annotated[
        str | None,
        typer.Option(
            "--parse-fallback-model",
            metavar="MODEL",
            help="When no pattern parses a reply, ask this model (same --backend and --base-url) which "
            "option it chose. Off by default; recorded per row as parse_method llm_fallback.",
        ),
    ] = None,
) -> None:
    """Run a model on a dataset config into the store. Rerunning the same command resumes: only
    missing (item, sample) rows are requested. API keys come from the environment only."""
    from equipoise.evaluators.backends.base import Decoding
    from equipoise.evaluators.executor import execute_run
    from equipoise.evaluators.ingest import DatasetVersionError, register
    from equipoise.evaluators.planner import PlanError, RunSpec

    if prompt not in ("base", "cot", "safe", "confidence", "fewshot"):
        _fail(f"--prompt must be base, cot, safe, confidence or fewshot, got {prompt!r}")
    if self_eval_of is not None:
        if backend == "reference":
            _fail("--self-eval-of needs a model that writes verdicts (--backend openai or vllm)")
        if prompt != "base":
            _fail("--prompt is taken from the judged run; leave it out with --self-eval-of")
        if samples != 1:
            _fail("--self-eval-of takes one verdict per answer; leave --samples at 1")
    if other_judge and self_eval_of is None:
        _fail("--other-judge only applies with --self-eval-of")
    if parse_fallback_model is not None and backend == "reference":
        _fail("--parse-fallback-model needs --backend openai or vllm")
    if backend not in ("reference", "openai", "vllm"):
        _fail(f"--backend must be reference, openai or vllm, got {backend!r}")
    folder = _dataset_folder(dataset)
    spec = RunSpec(
        dataset=dataset,
        folder=str(folder),
        config=config,
        backend=backend,  # type: ignore[arg-type]
        model=model,
        style=prompt,
        decoding=Decoding(
            temperature=temperature, n=samples, max_tokens=max_tokens, seed=seed, thinking=thinking
        ),
        shots=shots,
        pool=pool,
        base_url=base_url,
        concurrency=concurrency,
        seed=seed,
        limit=limit,
        commit_every=commit_every,
        parse_fallback_model=parse_fallback_model,
    )
    con = _connect(store)
    try:
        try:
            loaded = register(con, folder, config, location=dataset)
            outcome = execute_run(con, spec, loaded, self_eval_of=self_eval_of, other_judge=other_judge)
        except (ValueError, DatasetVersionError, PlanError) as exc:
            _fail(str(exc))
        _refresh_facts(con)
    finally:
        con.close()
    summary = outcome.summary
    console.print(
        f"run {summary.run_id}: requested {summary.requested} item(s), wrote {summary.written} row(s), "
        f"{summary.skipped_existing} already stored"
    )
    if self_eval_of is not None:
        console.print(
            f"self-evaluation of {self_eval_of}: "
            + ", ".join(f"{k} {v}" for k, v in outcome.verdicts.items())
            + (
                f"; {summary.skipped_no_answer} answer(s) were errors, not judged"
                if summary.skipped_no_answer
                else ""
            )
        )
        return
    console.print(
        "outcomes: "
        + ", ".join(f"{k} {v}" for k, v in summary.outcomes.items())
        + (f"; accuracy {outcome.accuracy:.3f}" if outcome.accuracy is not None else "")
    )


# ---------------------------------------------------------------------------------------------
# evaluation plans (a whole sweep in one command) and Parquet parts
# ---------------------------------------------------------------------------------------------
@app.command("eval")
def eval_cmd(
    plan_file: Annotated[
        Path, typer.Argument(metavar="PLAN.yaml", help="The plan (see: equipoise schema plan).")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the runs and prediction counts; run nothing.")
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option("--shard", metavar="I/N", help="Run only slice I of N (0-based), chosen by item key."),
    ] = None,
    parts: Annotated[
        Path | None,
        typer.Option(
            "--parts",
            metavar="DIR",
            help="Write Parquet parts (store row layout) into DIR instead of the store; merge them "
            "later with: equipoise store ingest DIR --store FILE.",
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Spread the sweep over the Ray cluster ray.init() finds (pip install 'equipoise\\[ray]'); "
            "workers write parts (under --parts, or next to the store) and this process ingests them.",
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="--ray: shard tasks, or vLLM replicas (default: the cluster's CPUs, or GPUs for vLLM).",
        ),
    ] = None,
) -> None:
    """Run a whole sweep (datasets x configs x models x prompt styles) from a plan file. Rerunning
    the same command resumes the sweep; complete runs are skipped."""
    from equipoise.evaluators.executor import run_sweep, sweep_summary
    from equipoise.evaluators.ingest import DatasetVersionError
    from equipoise.evaluators.parts import open_parts, part_dirs
    from equipoise.evaluators.planner import PlanError, Shard, expand, load_plan, plan_status

    try:
        plan = load_plan(plan_file)
        sh = Shard.parse(shard) if shard else Shard()
    except PlanError as exc:
        _fail(str(exc))
    if ray and shard:
        _fail("--ray shards the sweep itself; leave out --shard")
    if workers is not None and not ray:
        _fail("--workers only applies with --ray")
    folders = {d.ref: _dataset_folder(d.ref) for d in plan.datasets}
    try:
        specs = expand(plan, folders)
    except (PlanError, DatasetVersionError) as exc:
        _fail(str(exc))
    if parts is not None and parts.exists() and not parts.is_dir():
        _fail(f"--parts {parts}: exists and is not a folder")
    if dry_run:
        con = None
        if parts is not None and part_dirs(parts):
            con = _or_fail(lambda: open_parts(parts))
        elif parts is None and plan.store.exists():
            con = _connect(plan.store, read_only=True)
        try:
            planned = _or_fail(lambda: plan_status(specs, con, sh))
        finally:
            if con is not None:
                con.close()
        _print_plan(planned, plan_file)
        return
    if ray:
        from equipoise.evaluators.ray_exec import RayUnavailable, ShardFailed, run_sweep_ray

        con = _connect(plan.store)
        try:
            try:
                planned = plan_status(specs, con)
                if sum(p.remaining for p in planned) == 0:
                    _nothing_to_do(planned, plan.store)
                else:
                    run_sweep_ray(
                        planned,
                        con,
                        parts or plan.store.with_name(plan.store.name + ".parts"),
                        workers,
                        console=err,
                    )
                summary = sweep_summary(con, [p.run_id for p in planned])
                _refresh_facts(con)
            except (RayUnavailable, ShardFailed) as exc:
                _fail(str(exc))
            except (PlanError, ValueError, DatasetVersionError) as exc:
                _fail(str(exc))
        finally:
            con.close()
        _print_sweep(planned, summary, plan.store)
        return
    if parts is not None:
        from equipoise.evaluators.executor import PartsSink

        sink = _or_fail(lambda: PartsSink(parts, sh))
        con, where = sink.con, parts
    else:
        sink, con, where = None, _connect(plan.store), plan.store
    try:
        try:
            planned = plan_status(specs, con, sh)
            if sum(p.remaining for p in planned) == 0:
                _nothing_to_do(planned, where)
            else:
                run_sweep(planned, con, shard=sh, sink=sink, console=err)
            summary = sweep_summary(con, [p.run_id for p in planned])
            if sink is None:  # a store file: keep its fact tables current (parts have none)
                _refresh_facts(con)
        except (PlanError, ValueError, DatasetVersionError) as exc:
            _fail(str(exc))
    finally:
        con.close()
    _print_sweep(planned, summary, where)


def _or_fail(fn: Any) -> Any:
    """Call ``fn``; a user error (bad parts folder, bad plan) becomes one line and exit 2."""
    from equipoise.evaluators.planner import PlanError
    from equipoise.evaluators.store import StoreError

    try:
        return fn()
    except (PlanError, ValueError, FileNotFoundError, StoreError) as exc:
        _fail(exc)


def _nothing_to_do(planned: list[Any], where: Path) -> None:
    console.print(
        f"nothing to do: all {len(planned)} run(s) are complete in {where} "
        f"({sum(p.done for p in planned):,} predictions stored)"
    )


def _print_plan(planned: list[Any], plan_file: Path) -> None:
    t = Table(title=f"{plan_file}: {len(planned)} run(s) (dry run, nothing executed)")
    for c in ("dataset", "config", "model", "prompt", "run_id", "predictions", "stored", "to do"):
        t.add_column(c, justify="right" if c in ("predictions", "stored", "to do") else "left")
    for p in planned:
        s = p.spec
        t.add_row(
            s.dataset,
            s.config,
            s.model,
            f"self_eval:{s.style}" if s.self_eval else s.style,
            p.run_id,
            str(p.total),
            str(p.done),
            str(p.remaining),
        )
    console.print(t)
    console.print(
        f"total: {sum(p.total for p in planned):,} predictions, {sum(p.done for p in planned):,} stored, "
        f"{sum(p.remaining for p in planned):,} to do"
    )


def _print_sweep(planned: list[Any], summary: dict[str, tuple], where: Path) -> None:
    t = Table(title=f"sweep summary ({where})")
    cols = (
        "dataset",
        "config",
        "model",
        "prompt",
        "run_id",
        "rows",
        "answered",
        "abstained",
        "unparsed",
        "acc",
    )
    for c in cols:
        t.add_column(c, justify="left" if c in cols[:5] else "right")
    for p in planned:
        s = p.spec
        rows, ans, abst, unp, acc = summary.get(p.run_id, (0, 0, 0, 0, None))
        t.add_row(
            Path(s.dataset).name,
            s.config,
            s.model,
            f"self_eval:{s.style}" if s.self_eval else s.style,
            p.run_id,
            str(rows),
            str(ans),
            str(abst),
            str(unp),
            "-" if acc is None else f"{acc:.3f}",
        )
    console.print(t)


@store_app.command("ingest")
def store_ingest(
    parts: Annotated[Path, typer.Argument(metavar="DIR", help="Folder of Parquet parts.")],
    store: Annotated[Path, typer.Option("--store", help="DuckDB store file (created).")] = Path(
        "equipoise-work/store.duckdb"
    ),
) -> None:
    """Merge a folder of Parquet parts into a store, idempotently: parts already merged add
    nothing, and a part a killed worker left half-written (a hidden .tmp- folder) is ignored."""
    from equipoise.evaluators.parts import ingest_parts, part_dirs

    if not parts.is_dir():
        _fail(f"{parts}: no such folder of parts")
    if not part_dirs(parts):
        _fail(f"{parts}: no Parquet parts here (write some with equipoise eval --parts)")
    con = _connect(store)
    try:
        res = _or_fail(lambda: ingest_parts(con, parts))
        _refresh_facts(con)
    finally:
        con.close()
    added = ", ".join(f"{k} {v}" for k, v in res.added.items() if v)
    console.print(
        f"ingested {res.parts} part(s) from {parts} into {store}: "
        + (f"added {added}" if added else "nothing new (already ingested)")
        + (f"; {res.replaced_errors} error row(s) replaced by answers" if res.replaced_errors else "")
    )


@app.command("import")
def import_cmd(
    file: Annotated[
        Path, typer.Argument(help="Predictions as JSONL or Parquet (see `equipoise schema prediction`).")
    ],
    store: Annotated[Path, typer.Option("--store", help="DuckDB store file.")] = Path(
        "equipoise-work/store.duckdb"
    ),
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Register this dataset first (folder or ORG/NAME@REV).")
    ] = None,
) -> None:
    """Import predictions made elsewhere. The whole file is checked first (file:line:field errors);
    nothing is written unless every record is valid, and a second import of the same file adds nothing."""
    from equipoise.evaluators.importer import ImportError_, _records, import_predictions
    from equipoise.evaluators.ingest import DatasetVersionError, register

    if not file.exists():
        _fail(f"{file}: no such file")
    con = _connect(store)
    try:
        if dataset:
            folder = _dataset_folder(dataset)
            try:
                configs = sorted(
                    {r.get("config") for _, r in _records(file) if isinstance(r.get("config"), str)}
                )
                for cfg in configs:
                    register(con, folder, cfg, location=dataset)
            except (ImportError_, DatasetVersionError) as exc:
                _fail(str(exc))
        try:
            res = import_predictions(con, file)
        except ImportError_ as exc:
            _fail(str(exc))
        _refresh_facts(con)
    finally:
        con.close()
    console.print(f"imported {file}: {res.rows} record(s), {res.added} new, runs {', '.join(res.runs)}")


@app.command()
def schema(
    name: Annotated[str, typer.Argument(help="prediction | item | case | scoring-system | plan")],
) -> None:
    """Print the JSON Schema of a record type (the import format is `prediction`)."""
    from equipoise.evaluators.importer import prediction_json_schema
    from equipoise.evaluators.planner import plan_json_schema
    from equipoise.schemas.clindet import DeterminabilityCase
    from equipoise.schemas.items import MCQItem
    from equipoise.schemas.scoring import ScoringSystem

    schemas = {
        "prediction": prediction_json_schema,
        "item": MCQItem.model_json_schema,
        "case": DeterminabilityCase.model_json_schema,
        "scoring-system": ScoringSystem.model_json_schema,
        "plan": plan_json_schema,
    }
    if name not in schemas:
        _fail(f"unknown schema '{name}'; known: {', '.join(schemas)}")
    sys.stdout.write(json.dumps(schemas[name](), indent=2) + "\n")


def _md_table(df: Any) -> str:
    """A GitHub-markdown table (floats to 4 decimals, NULL as '-'); no extra dependency."""

    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


# shared by `metrics` and `report`
MemoryLimit = Annotated[
    str | None,
    typer.Option(
        "--memory-limit",
        help="Cap DuckDB's memory, e.g. 2GB; the rest spills to <store>.tmp (slower, but a large "
        "store then needs less RAM than its own size). Default, when the store's write-time facts "
        "are current: what aims to keep the pass's peak RSS under 95% of the store file (half of a "
        "freshly built 1M-prediction store, 88% at 10M; registry.pass_memory_cap; a store under "
        "about 400 MB gets a 128 MiB floor and can peak above its file), else DuckDB's 80% of RAM. "
        "A value given here is used as given, higher or lower than that default.",
    ),
]


def _metric_failed(name: str, exc: BaseException) -> None:
    """Exit with one line for what a metric raised on bad input (unknown grouping or column, a bad
    parameter, a query DuckDB refused); anything else returns, for the caller to re-raise."""
    import duckdb

    if isinstance(exc, KeyError):
        _fail(str(exc.args[0]))
    if isinstance(exc, ValueError | TypeError | duckdb.Error):
        from equipoise.evaluators.store import first_line

        _fail(f"{name}: {first_line(exc)}")


def _metric_written(name: str, rows: int, path: Path) -> None:
    console.print(f"{name}: {rows:,} rows -> {path}", highlight=False)


@app.command()
def metrics(
    store: Annotated[
        Path,
        typer.Option("--store", help="DuckDB store file (opened read-only), or a folder of Parquet parts."),
    ] = Path("equipoise-work/store.duckdb"),
    metric: Annotated[
        list[str] | None, typer.Option("--metric", help="Metric name (repeatable; default: all).")
    ] = None,
    by: Annotated[list[str] | None, typer.Option("--by", help="Group by these strata (repeatable).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="md | csv | json")] = "md",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="KEY=VALUE metric parameter (repeatable), e.g. alpha=0.05, confidence=token_mean, "
            "n_boot=2000. Given to every selected metric that declares KEY; see --list.",
        ),
    ] = None,
    list_only: Annotated[bool, typer.Option("--list", help="List the registered metrics and exit.")] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write each metric to DIR/<metric>.parquet instead of printing it. Metrics that are one "
            "query (per-item scores, curves) stream from DuckDB to the file without a pandas copy: the "
            "way to get per-item tables of a large store.",
        ),
    ] = None,
    memory_limit: MemoryLimit = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Compute every metric even when <store>.cache/ holds it for this exact store content.",
        ),
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            min=1,
            help="With --out: compute the metrics in N lanes, each lane a DuckDB connection taking "
            "whole metric modules, all under the one memory limit (metrics/pass_runner.py); files "
            "are listed as they are written. 1 computes one metric at a time; more needs the "
            "store's current write-time facts (else 1 is used). Default: 2.",
        ),
    ] = None,
) -> None:
    """Compute registered metrics in SQL over a store, grouped by any strata (model, suite, variant,
    k, framing, condition, specialty, question_type, imaging_modality, ...). Results are cached in
    <store>.cache/ keyed by the store's content, so asking again for an unchanged store is instant."""
    from equipoise.evaluators.metrics.registry import REGISTRY, STRATA, _load_all, compute, metric_names

    _load_all()
    if list_only:
        for name, m in sorted(REGISTRY.items()):
            params = ", ".join(f"{k}={v}" for k, v in m.params.items())
            console.print(f"[bold]{name}[/] ({m.sql or 'python over SQL'}): {m.description}")
            if params:
                console.print(f"    params: {params}", highlight=False)
        console.print(f"strata for --by: {', '.join(STRATA)}")
        return
    names = metric or metric_names()
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        _fail(f"unknown metric(s) {unknown}; see equipoise metrics --list")
    given = _parse_params(param or [])
    unused = [k for k in given if not any(k in REGISTRY[n].params for n in names)]
    if unused:
        _fail(f"no selected metric takes parameter(s) {unused}; see equipoise metrics --list")
    if jobs is not None and out_dir is None:
        _fail("--jobs applies to --out (metrics written to files); without --out it has no effect")
    import shutil

    from equipoise.evaluators.metrics import cache
    from equipoise.evaluators.metrics.registry import prepare
    from equipoise.evaluators.store import scalar, sql_literal

    opened = cache.file_stat(store)  # before opening: the memo must be of the file opened
    con = _connect(store, read_only=True, memory_limit=memory_limit)
    out: dict[str, Any] = {}
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            con.close()
            _fail(f"{out_dir}: cannot create the output folder ({exc.strerror or exc})")
    try:
        # the fingerprint's scan, once: the pass below checks its facts against the same sums
        version, sums = (None, None) if no_cache else cache.content_version(con, store, opened)
        prepared = False
        # --out: the metrics to compute, their files, parameters and cache keys
        targets: dict[str, Path] = {}
        missed_params: dict[str, dict[str, object]] = {}
        keys: dict[str, str | None] = {}
        for name in names:
            mine = {k: v for k, v in given.items() if k in REGISTRY[name].params}
            k = None if version is None else cache.key(version, name, by, mine)
            try:
                if out_dir is not None:
                    target = out_dir / f"{name}.parquet"
                    hit = None if k is None else cache.path_for(store, k)
                    if hit is not None and hit.exists():
                        shutil.copyfile(hit, target)
                        # the file's row count from its footer, read by DuckDB: pyarrow is not
                        # imported by a metrics pass (its ~30 MiB would come out of the pass's cap)
                        footer = f"SELECT num_rows FROM parquet_file_metadata({sql_literal(str(target))})"
                        _metric_written(name, int(scalar(con, footer) or 0), target)
                    else:  # computed below, all in one pass (pass_runner: lanes, the base joins once)
                        targets[name], missed_params[name], keys[name] = target, mine, k
                    continue
                df = None if k is None else cache.get(store, k)
                if df is None:
                    if not prepared:
                        prepare(con, materialize=True, sums=sums)
                        prepared = True
                    df = compute(con, name, by=by, params=mine)
                    if k is not None:
                        cache.put_frame(store, k, df)
            except Exception as exc:
                _metric_failed(name, exc)
                raise
            out[name] = df
        if targets:
            from equipoise.evaluators.metrics.pass_runner import DEFAULT_JOBS, MetricDone, PassError, run_pass

            def written(done: MetricDone) -> None:
                k = keys[done.name]
                if k is not None:
                    cache.put_file(store, k, done.path)
                _metric_written(done.name, done.rows, done.path)

            try:
                run_pass(
                    con,
                    targets,
                    by=by,
                    params=missed_params,
                    jobs=DEFAULT_JOBS if jobs is None else jobs,
                    on_done=written,
                    sums=sums,
                )
            except PassError as exc:
                _metric_failed(exc.name, exc.error)
                raise
    finally:
        con.close()
    if out_dir is not None:
        return
    if fmt == "json":
        sys.stdout.write(
            json.dumps({k: json.loads(v.to_json(orient="records")) for k, v in out.items()}) + "\n"
        )
    elif fmt == "csv":
        for name, df in out.items():
            sys.stdout.write(f"# {name}\n{df.to_csv(index=False)}\n")
    else:
        for name, df in out.items():
            sys.stdout.write(f"## {name}\n\n{_md_table(df)}\n\n")


def _parse_params(items: list[str]) -> dict[str, object]:
    """KEY=VALUE strings to typed values: int, then float, then true/false, else the string."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--param '{item}': expected KEY=VALUE")
        value: object = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[key.strip()] = value
    return out


@app.command()
def report(
    store: Annotated[Path, typer.Option("--store", help="DuckDB store file (opened read-only).")] = Path(
        "equipoise-work/store.duckdb"
    ),
    out: Annotated[Path, typer.Option("--out", help="Folder for CSV tables and PNG plots.")] = Path(
        "equipoise-work/report"
    ),
    memory_limit: MemoryLimit = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            min=1,
            help="Compute the tables in N lanes, as `equipoise metrics --out DIR --jobs N` "
            "(1: one metric at a time). Default: 2.",
        ),
    ] = None,
) -> None:
    """Write every metric as a CSV table and the plots a reader would rather look at (reliability,
    humility deficit, accuracy vs abstention across k, set size, risk-coverage, determinability)."""
    import duckdb

    from equipoise.evaluators.metrics.pass_runner import DEFAULT_JOBS
    from equipoise.evaluators.report import write_report
    from equipoise.evaluators.store import StoreError

    if not store.exists():
        _fail(f"{store}: no such store")
    try:
        rep = write_report(store, out, memory_limit=memory_limit, jobs=DEFAULT_JOBS if jobs is None else jobs)
    except (ValueError, StoreError, duckdb.Error) as exc:
        _fail(exc)
    console.print(f"wrote {len(rep.tables)} tables and {len(rep.plots)} plots to {out}")
    for p in rep.plots:
        console.print(f"  - {out / p}")
    for s in rep.skipped:
        console.print(f"  [dim]skipped {s}[/]")


@store_app.command("migrate")
def store_migrate(
    store: Annotated[Path, typer.Argument(help="DuckDB store file to upgrade in place.")],
) -> None:
    """Upgrade a store to this package's schema version. Works on a copy that replaces the store
    only when every step succeeded, so a failure leaves the store as it was; the store is locked
    from the copy to the swap (another process opening it then gets DuckDB's lock error)."""
    import duckdb

    from equipoise.evaluators.store import StoreError, migrate_store

    try:
        before, after = migrate_store(store)
    except (FileNotFoundError, StoreError, OSError, duckdb.Error) as exc:
        _fail(exc)
    if before == after:
        console.print(f"{store}: already at schema v{after}; nothing to do", highlight=False)
    else:
        console.print(f"{store}: migrated schema v{before} -> v{after}", highlight=False)
    con = _connect(store)
    try:
        _refresh_facts(con)
    finally:
        con.close()


@store_app.command("compact")
def store_compact(
    store: Annotated[Path, typer.Argument(help="DuckDB store file to rewrite in place.")],
    memory_limit: Annotated[
        str | None,
        typer.Option(
            "--memory-limit",
            help="DuckDB memory limit while copying (e.g. 2GB; spills go to STORE.tmp). Default: the "
            "store file's size, at least 1 GiB; much less fails on a large store (its key indexes are "
            "rebuilt in memory).",
        ),
    ] = None,
) -> None:
    """Give a store's free space back to the file system: copy its contents into a fresh file,
    check the copy table by table (rows, hashes, keys, views) and swap it in only then. Useful after
    the fact tables were rebuilt in place (every write refreshes those of the runs it changed, a
    package upgrade all of them), which leaves their old blocks free inside the file. Needs the
    store closed everywhere else."""
    import duckdb

    from equipoise.evaluators.store import StoreError, compact_store

    try:
        with console.status(f"compacting {store} ..."):
            before, after = compact_store(store, memory_limit)
    except (FileNotFoundError, ValueError, StoreError, OSError, duckdb.Error) as exc:
        _fail(exc)
    mib = 2**20
    change = (
        f"{(before - after) / mib:,.1f} MiB given back"
        if after <= before
        else f"{(after - before) / mib:,.1f} MiB larger: the store had no free space to give back"
    )
    console.print(f"{store}: {before / mib:,.1f} MiB -> {after / mib:,.1f} MiB ({change})", highlight=False)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only SQL query.")],
    store: Annotated[
        Path, typer.Option("--store", help="DuckDB store file, or a folder of Parquet parts.")
    ] = Path("equipoise-work/store.duckdb"),
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
) -> None:
    """Run SQL over a prediction store through a read-only connection (writes are refused)."""
    import duckdb

    con = _connect(store, read_only=True)
    try:
        con.execute("SET enable_external_access = false")
        cur = con.execute(query)
        rows = cur.fetchall()
        cols = [d[0] for d in cur.description] if cur.description else []
    except duckdb.Error as exc:
        _fail(exc)
    finally:
        con.close()
    if fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(cols, r, strict=True)) for r in rows], default=str) + "\n")
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    else:
        t = Table()
        for c in cols:
            t.add_column(c)
        for r in rows:
            t.add_row(*[str(v) for v in r])
        console.print(t)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
