"""Plan runs: turn what a user asked for (one ``equipoise run`` or a whole plan file) into run specs.

A *run* is one model with one decoding and one prompt style on one dataset config; its id is the
hash :func:`runner.run_id_for` computes. This module only decides *which* runs a request means and
what each one is called; :mod:`executor` does them. Keeping the two apart lets ``--dry-run`` list
run ids and prediction counts without loading a model, and lets a shard, a Ray task and a plain
single process all execute exactly the same specs.

The plan file (``equipoise eval PLAN.yaml``) is a YAML mapping validated by :class:`Plan`; its
JSON schema is printed by ``equipoise schema plan``. ``configs: all`` means the dataset's
evaluation configs (the manifest's ``eval_configs``; every config when it lists none), the same set
the reference job runs, so few-shot pools are not evaluated by accident.

Sharding (``--shard I/N``) is by item key: an item belongs to shard ``int(sha256(item_id)) % N``,
so every run of a sweep splits the same way, whatever the order of items or runs, and N workers
started independently (a SLURM array, a CI matrix, Ray tasks) never overlap and never miss an item.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from equipoise.evaluators.backends.base import Decoding

PROMPT_STYLES = ("base", "cot", "safe", "confidence", "fewshot")
BACKENDS = ("reference", "openai", "vllm")


class PlanError(ValueError):
    """A plan (or a run request) that cannot be carried out; the message names the file and field."""


# ---------------------------------------------------------------------------------------------
# the plan file
# ---------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetEntry(_Strict):
    """One dataset: a local folder or a published Hub dataset pinned to a revision."""

    path: str | None = Field(default=None, description="A built dataset folder.")
    hub: str | None = Field(default=None, description="ORG/NAME@REVISION of a published dataset.")
    configs: Literal["all"] | list[str] = Field(
        default="all", description="'all' (the evaluation configs) or a list of config names."
    )

    @model_validator(mode="after")
    def _one_source(self) -> DatasetEntry:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of 'path' or 'hub'")
        if self.hub is not None and "@" not in self.hub:
            raise ValueError(f"hub dataset '{self.hub}' needs a pinned revision: ORG/NAME@REVISION")
        if isinstance(self.configs, list) and not self.configs:
            raise ValueError("'configs' is empty; use 'all' or name at least one")
        return self

    @property
    def ref(self) -> str:
        return self.path if self.path is not None else str(self.hub)


class PlanDecoding(_Strict):
    """Decoding of one model; the number of samples and the seed are plan-wide."""

    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=512, ge=1)
    thinking: bool | None = None


class ModelEntry(_Strict):
    """One model: for ``reference`` the name is a reference policy (chance, oracle, ...)."""

    name: str = Field(min_length=1)
    backend: Literal["reference", "openai", "vllm"]
    decoding: PlanDecoding = Field(default_factory=PlanDecoding)
    base_url: str | None = Field(default=None, description="openai: any compatible endpoint.")
    concurrency: int = Field(default=8, ge=1, description="openai: requests in flight per endpoint.")


class Plan(_Strict):
    """A whole sweep: every model x every config of every dataset x every prompt style."""

    store: Path = Field(default=Path("equipoise-work/store.duckdb"), description="DuckDB store file.")
    datasets: list[DatasetEntry] = Field(min_length=1)
    models: list[ModelEntry] = Field(min_length=1)
    prompts: list[Literal["base", "cot", "safe", "confidence", "fewshot"]] = Field(
        default_factory=lambda: ["base"], min_length=1
    )
    samples: int = Field(default=1, ge=1, le=128, description="Samples per item.")
    shots: int = Field(default=4, ge=1, description="fewshot: examples per question.")
    seed: int = 0
    commit_every: int = Field(default=32, ge=1, description="Rows per transaction or part file.")
    self_eval: bool = Field(
        default=False,
        description="After each decision run of an openai or vllm model, the same model judges its "
        "sample-0 answers Correct / Incorrect in a new conversation (a self-evaluation run).",
    )

    @field_validator("prompts")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("prompt styles repeat")
        return v


def plan_json_schema() -> dict[str, Any]:
    return Plan.model_json_schema()


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file; errors are one line naming the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"{path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: a plan is a YAML mapping with datasets, models, prompts, ...")
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        raise PlanError(f"{path}: field '{where}': {e['msg']}") from exc
    # a relative store is relative to the plan, so the same plan runs the same from any directory
    if not plan.store.is_absolute():
        plan = plan.model_copy(update={"store": path.parent / plan.store})
    fixed = []
    for d in plan.datasets:
        if d.path is not None and not Path(d.path).is_absolute():
            d = d.model_copy(update={"path": str(path.parent / d.path)})
        fixed.append(d)
    return plan.model_copy(update={"datasets": fixed})


# ---------------------------------------------------------------------------------------------
# run specs
# ---------------------------------------------------------------------------------------------
class RunSpec(_Strict):
    """One run to execute: picklable and self-contained, so a Ray task or a shard can take it."""

    dataset: str = Field(description="The dataset reference as the user wrote it (stored as location).")
    folder: str = Field(description="The local dataset folder (fetched when the reference is a Hub id).")
    config: str
    backend: Literal["reference", "openai", "vllm"]
    model: str
    style: str = "base"
    decoding: Decoding = Field(default_factory=Decoding)
    shots: int = 4
    pool: str | None = None
    base_url: str | None = None
    concurrency: int = 8
    seed: int = 0
    limit: int | None = None
    commit_every: int = 32
    parse_fallback_model: str | None = Field(
        default=None, description="Helper model (same backend and endpoint) for unparsed replies."
    )
    self_eval: bool = Field(
        default=False,
        description="This spec is the self-evaluation (one verdict per item) of the decision run "
        "the other fields name; ``decoding`` is the decision's.",
    )


def expand(plan: Plan, folders: dict[str, Path]) -> list[RunSpec]:
    """All runs of ``plan`` in a fixed order (dataset, config, model, prompt). ``folders`` maps
    each dataset reference to its local folder (fetched by the caller for Hub ids)."""
    specs: list[RunSpec] = []
    for d in plan.datasets:
        folder = folders[d.ref]
        configs = eval_configs(folder) if d.configs == "all" else list(d.configs)
        manifest = _manifest(folder)
        for config in configs:
            if config not in manifest["configs"]:
                raise PlanError(f"dataset '{d.ref}': no config '{config}'; has {sorted(manifest['configs'])}")
            for m in plan.models:
                for style in plan.prompts:
                    if manifest["suite"] == "clindet" and style not in ("base", "cot", "safe"):
                        raise PlanError(
                            f"dataset '{d.ref}' is determinability (ClinDet): prompt '{style}' is for MCQ "
                            "items; use base, cot or safe"
                        )
                    decision = RunSpec(
                        dataset=d.ref,
                        folder=str(folder),
                        config=config,
                        backend=m.backend,
                        model=m.name,
                        style=style,
                        decoding=Decoding(
                            temperature=m.decoding.temperature,
                            top_p=m.decoding.top_p,
                            max_tokens=m.decoding.max_tokens,
                            thinking=m.decoding.thinking,
                            n=plan.samples,
                            seed=plan.seed,
                        ),
                        shots=plan.shots,
                        base_url=m.base_url,
                        concurrency=m.concurrency,
                        seed=plan.seed,
                        commit_every=plan.commit_every,
                    )
                    specs.append(decision)
                    if plan.self_eval and m.backend != "reference":
                        specs.append(decision.model_copy(update={"self_eval": True}))
    return specs


def _manifest(folder: Path) -> dict[str, Any]:
    mpath = folder / "manifest.json"
    if not mpath.exists():
        raise PlanError(f"{folder}: no manifest.json (not an Equipoise dataset folder)")
    return json.loads(mpath.read_text(encoding="utf-8"))


def eval_configs(folder: Path) -> list[str]:
    """The configs ``configs: all`` means: ClinDet's one config, else the manifest's evaluation
    configs (every config when it names none)."""
    manifest = _manifest(folder)
    if manifest["suite"] == "clindet":
        return ["all"]
    return list(manifest.get("eval_configs") or manifest["configs"])


def model_identity(backend: str, model: str) -> tuple[str, str]:
    """(backend name, model name) as the store records them, without building the backend (a
    vLLM backend loads its weights when built; planning must not)."""
    if backend == "reference":
        from equipoise.evaluators.policies import ReferenceBackend

        try:
            return "reference", ReferenceBackend.model_name(model)
        except KeyError as exc:
            raise PlanError(str(exc.args[0])) from exc
    if backend not in ("openai", "vllm"):
        raise PlanError(f"backend must be reference, openai or vllm, got {backend!r}")
    return backend, model


def make_backend(spec: RunSpec, records: dict[str, Any], model: str | None = None) -> Any:
    """Build the backend a spec names (``records``: the reference policies answer from them;
    ``model`` overrides the spec's model, for the parse-fallback helper)."""
    name = model or spec.model
    if spec.backend == "reference":
        from equipoise.evaluators.policies import ReferenceBackend

        try:
            return ReferenceBackend(name, records, seed=spec.seed)
        except KeyError as exc:
            raise PlanError(str(exc.args[0])) from exc
    if spec.backend == "openai":
        from equipoise.evaluators.backends.openai_backend import OpenAIBackend

        # the cap is per endpoint: the sweep's models on one server (and a parse-fallback helper)
        # share it instead of each bringing their own
        return OpenAIBackend(
            name, base_url=spec.base_url, concurrency=spec.concurrency, endpoint_concurrency=spec.concurrency
        )
    if spec.backend == "vllm":
        from equipoise.evaluators.backends.vllm_backend import VLLMBackend

        return VLLMBackend(name)
    raise PlanError(f"backend must be reference, openai or vllm, got {spec.backend!r}")


# ---------------------------------------------------------------------------------------------
# shards
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """Slice ``index`` of ``count`` (0-based): the items whose key hashes to ``index``."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        idx, sep, cnt = text.partition("/")
        try:
            shard = cls(int(idx), int(cnt))
        except ValueError:
            raise PlanError(f"--shard '{text}': expected I/N, e.g. 0/4") from None
        if not sep or shard.count < 1 or not 0 <= shard.index < shard.count:
            raise PlanError(f"--shard '{text}': need 0 <= I < N (shards are numbered from 0)")
        return shard

    def keeps(self, item_id: str) -> bool:
        if self.count == 1:
            return True
        h = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big")
        return h % self.count == self.index

    @property
    def tag(self) -> str:
        return f"s{self.index:03d}of{self.count:03d}"


WHOLE = Shard()  # the whole sweep: one shard of one


# ---------------------------------------------------------------------------------------------
# what is planned vs what is stored
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedRun:
    """A spec with its run id and its prediction counts in this shard: ``total`` rows the run has
    when complete, ``done`` rows already stored (answers, not error rows, which are asked again)."""

    spec: RunSpec
    run_id: str
    total: int
    done: int
    of_run: str | None = None  # a self-evaluation: the decision run it judges

    @property
    def remaining(self) -> int:
        return max(self.total - self.done, 0)


def plan_status(
    specs: list[RunSpec], con: Any | None, shard: Shard | None = None, loaded_cache: dict | None = None
) -> list[PlannedRun]:
    """Run ids and counts for ``specs`` against the store ``con`` (None: nothing stored yet).
    Reads the dataset folders but builds no backend and writes nothing."""
    from equipoise.evaluators.ingest import read_config
    from equipoise.evaluators.runner import plan_run

    shard = shard or WHOLE
    cache: dict[tuple[str, str], Any] = {} if loaded_cache is None else loaded_cache
    out: list[PlannedRun] = []
    for spec in specs:
        key = (spec.folder, spec.config)
        if key not in cache:
            cache[key] = read_config(Path(spec.folder), spec.config)
        loaded = cache[key]
        backend_name, model = model_identity(spec.backend, spec.model)
        fallback = None
        if spec.parse_fallback_model is not None:
            from equipoise.evaluators.runner import ParseFallback

            fallback = ParseFallback(_NamedBackend(*model_identity(spec.backend, spec.parse_fallback_model)))
        ident = plan_run(
            Path(spec.folder),
            loaded,
            model,
            backend_name,
            spec.style,
            spec.decoding,
            pool_config=spec.pool,
            shots=spec.shots,
            parse_fallback=fallback,
        )
        records = loaded.records[: spec.limit] if spec.limit else loaded.records
        ids = [i for i in (loaded.item_id(r) for r in records) if shard.keeps(i)]
        if spec.self_eval:
            out.append(_self_eval_status(spec, ident.row, loaded, ids, con))
            continue
        done = _stored(con, ident.run_id, spec.decoding.n, ids)
        out.append(PlannedRun(spec, ident.run_id, len(ids) * spec.decoding.n, done))
    return out


def _stored(con: Any | None, run_id: str, n: int, ids: list[str], errors: bool = False) -> int:
    """Rows of ``run_id`` for ``ids`` with sample index < ``n``: answers, or (``errors``) error rows."""
    if con is None or not ids:
        return 0
    op = "=" if errors else "<>"
    return int(
        con.execute(
            f"SELECT count(*) FROM predictions WHERE run_id = ? AND outcome {op} 'error' "
            "AND sample_index < ? AND item_id IN (SELECT unnest(?::VARCHAR[]))",
            [run_id, n, ids],
        ).fetchall()[0][0]
    )


def _self_eval_status(
    spec: RunSpec, decision: Any, loaded: Any, ids: list[str], con: Any | None
) -> PlannedRun:
    """A self-evaluation gives one verdict per judged answer: every item of the shard except those
    whose decision (sample 0) is an error row, which the decision run asks again first."""
    from equipoise.evaluators.runner import plan_self_eval

    judged = {"model": decision.model, "backend": decision.backend, "style": decision.prompt_style}
    judge_decoding = spec.decoding.model_copy(update={"n": 1})
    row = plan_self_eval(judged, decision.run_id, loaded, decision.backend, decision.model, judge_decoding)
    total = len(ids) - _stored(con, decision.run_id, 1, ids, errors=True)
    return PlannedRun(spec, row.run_id, total, _stored(con, row.run_id, 1, ids), of_run=decision.run_id)


@dataclass(frozen=True)
class _NamedBackend:
    """Only a backend's identity (name, model): what a run id needs from the parse fallback."""

    name: str
    model: str

    def generate(self, requests: Any) -> Any:  # pragma: no cover - planning never generates
        raise RuntimeError("a planning stand-in cannot generate")
