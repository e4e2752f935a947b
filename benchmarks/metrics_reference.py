"""A plain pandas / numpy / scikit-learn / scipy / statsmodels reference for every registered metric,
used by ``metrics_bench.py`` as the baseline the DuckDB path is timed against.

It is what a researcher would write without the package: read the six store tables into pandas,
join them with ``merge``, aggregate with ``groupby``, call scikit-learn / scipy / statsmodels for
AUROC, Brier, Fisher, Spearman, McNemar and the combiners. It never touches the package's SQL or
views; the only thing it shares with the package is the definitions, re-implemented here from the
documentation of each metric (most of the logic is adapted from the independent references in
``tests/test_metrics_*.py``, vectorised so that it runs at a million rows). It computes each metric
with its default grouping and default parameters, the way ``equipoise metrics`` does.

Vectorised, not a strawman: per-row Python loops appear only where the definition needs a hash per
key (md5 splits, SHA-256 bootstrap streams), and those hash each distinct key once. The conformal
split hashes (one md5 per unit key, then numpy integer arithmetic per repeat) are computed once and
shared by the four conformal metrics (the DuckDB path recomputes them per metric), which favours the
reference.

Resampling metrics use the same randomness as the package, so the numbers can be compared:

- conformal splits order the units by (h, unit key, run_id), h = SplitMix64 output repeat + 1 seeded
  with the first 16 hex digits of md5('<seed>:<unit key>'), as documented in
  ``equipoise/evaluators/metrics/conformal.py``;
- bootstraps draw from ``numpy.random.default_rng([seed, h])`` with h the first 8 bytes
  (little-endian) of SHA-256 of the group key joined by '\\x1f', replicate indices floor(u * n)
  (paired bootstrap) or multinomial counts over the distinct (samples, correct) item kinds
  (``bootstrap_ci``), as documented in ``equipoise/evaluators/metrics/robustness.py``;
- md5 train / hold-out splits of the uncertainty metrics: md5(key)[:8] / 2**32 < fraction.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from scipy import stats
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import brier_score_loss, roc_auc_score
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

TABLES = ("runs", "items", "options", "predictions", "option_scores")
_EXCLUDED = {"predictions": "EXCLUDE (score_labels, score_logprobs)"}
SELF_EVAL = "self_eval:"
N_BINS = 10
ALPHA_CONF = Fraction(1, 10)
CAL_FRACTION = Fraction(3, 10)
REPEATS = 100  # the package's default (conformal.COMMON_PARAMS); metrics_bench --conformal-repeats sets it
N_BOOT = 2000
CONF_RE = r"(?i)\bconfidence\b[^0-9\n]{0,20}?([0-9]+(?:\.[0-9]+)?)\s*(%?)"
HEDGES = (
    "maybe",
    "perhaps",
    "possibly",
    "probably",
    "likely",
    "unlikely",
    "might",
    "unsure",
    "uncertain",
    "seem",
    "seems",
    "seemingly",
    "apparently",
)
HEDGE_RE = r"(?i)\b(?:" + "|".join([*HEDGES, r"not\s+sure", r"not\s+certain"]) + r")\b"
SCORE_COLUMNS = (
    "sample_consistency",
    "semantic_entropy",
    "pro",
    "option_entropy",
    "label_nll",
    "label_nll_raw",
    "avg_nll",
    "max_nll",
    "g_nll",
    "geo_mean_token_prob",
    "elicited_confidence",
    "elicited_uncertainty",
    "n_output_tokens",
    "n_words",
    "n_questions",
    "n_wait",
    "n_hedges",
)
NOT_UNCERTAINTIES = ("geo_mean_token_prob", "elicited_confidence", "n_words")
FEATURES = ("n_output_tokens", "n_questions", "n_wait")
PAIR_KEY = ["dataset_id", "model", "backend", "prompt_style", "decoding_json", "base_id"]
ITEM = ["dataset_id", "config", "item_id"]
SAMPLE = ["run_id", "item_id", "sample_index"]


# ---------------------------------------------------------------------------------------------
# raw tables and the two joined frames every metric reads
# ---------------------------------------------------------------------------------------------
def read_tables(store: Path) -> dict[str, pd.DataFrame]:
    """The raw store tables as pandas frames (DuckDB is used only as the file reader here)."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        # the long option scores from the store's view of them; the prediction rows without the
        # two list columns that view reads (store schema v3), which nothing here uses
        return {t: con.execute(f"SELECT * {_EXCLUDED.get(t, '')} FROM {t}").df() for t in TABLES}
    finally:
        con.close()


class Data:
    """The raw tables plus the per-sample frame ``sc`` and per-option probability frame ``op``."""

    def __init__(self, t: dict[str, pd.DataFrame]) -> None:
        self.t = t
        runs = t["runs"]
        self.decision_runs = runs[~runs.prompt_style.str.startswith(SELF_EVAL)]
        opts = t["options"]
        p = t["predictions"].merge(self.decision_runs, on="run_id")
        p = p.merge(t["items"], on=ITEM)
        tgt = opts[[*ITEM, "label", "option_id"]].rename(
            columns={"label": "target_label", "option_id": "target_option_id"}
        )
        p = p.merge(tgt, on=[*ITEM, "target_label"])
        parsed = opts[[*ITEM, "label", "option_id", "role", "framing"]].rename(
            columns={
                "label": "parsed_label",
                "option_id": "parsed_option_id",
                "role": "parsed_role",
                "framing": "parsed_framing",
            }
        )
        p = p.merge(parsed, on=[*ITEM, "parsed_label"], how="left")
        p["correct"] = (p.parsed_label == p.target_label).to_numpy(bool)
        self.sc = p
        # softmax over each sample's scored labels, then kept for the labels that are options
        s = t["option_scores"]
        keys = [s[k] for k in SAMPLE]
        g = s.groupby(keys, sort=False)["logprob"]
        e = np.exp(s["logprob"] - g.transform("max"))
        op = s[[*SAMPLE, "label"]].copy()
        op["logprob"] = s["logprob"]
        op["prob"] = e / e.groupby(keys, sort=False).transform("sum")
        op["covered"] = g.transform("size")
        op = op.merge(self.decision_runs[["run_id", "dataset_id", "config"]], on="run_id")
        op = op.merge(t["items"][[*ITEM, "target_label", "n_options"]], on=ITEM)
        op = op.merge(opts[[*ITEM, "label", "option_id", "role"]], on=[*ITEM, "label"])
        op["is_target"] = (op.label == op.target_label).to_numpy(bool)
        self.op = op
        self._cache: dict[str, object] = {}

    def cached(self, key: str, fn: Callable[[], object]) -> object:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]


def _groups(df: pd.DataFrame, by: Sequence[str]) -> Iterator[tuple[dict, pd.DataFrame]]:
    """(key dict, group) for every group of ``by`` (NULL keys kept)."""
    if not by:
        yield {}, df
        return
    for key, g in df.groupby(list(by), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield dict(zip(by, key, strict=True)), g


def _mean(x: pd.Series | np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else math.nan


def _md5_unit(keys: Sequence[str]) -> np.ndarray:
    """md5(key)[:8] / 2**32 for each key (a uniform in [0, 1) per key)."""
    return np.array([int(hashlib.md5(k.encode()).hexdigest()[:8], 16) / 2**32 for k in keys])


# ---------------------------------------------------------------------------------------------
# answer rates
# ---------------------------------------------------------------------------------------------
def answer_rates(d: Data) -> pd.DataFrame:
    sc = d.sc
    x = pd.DataFrame(
        {
            "model": sc.model,
            "correct": sc.correct.astype(float),
            "answered": (sc.outcome == "answered").astype(float),
            "abstained": (sc.outcome == "abstained").astype(float),
            "wrong_answer": ((sc.outcome == "answered") & ~sc.correct).astype(float),
            "failed": sc.outcome.isin(["unparsed", "error"]).astype(float),
        }
    )
    x["correct_if_answered"] = x.correct.where(x.answered == 1)
    g = x.groupby("model", dropna=False)
    return pd.DataFrame(
        {
            "n": g.size(),
            "accuracy": g.correct.mean(),
            "accuracy_when_answered": g.correct_if_answered.mean(),
            "coverage": g.answered.mean(),
            "abstention_rate": g.abstained.mean(),
            "incorrect_selection_rate": g.wrong_answer.mean(),
            "parse_failure_rate": g.failed.mean(),
        }
    ).reset_index()


# ---------------------------------------------------------------------------------------------
# calibration and selective prediction (confidence = probability of the chosen option)
# ---------------------------------------------------------------------------------------------
def _cal_samples(d: Data) -> pd.DataFrame:
    def build() -> pd.DataFrame:
        chosen = d.op[[*SAMPLE, "label", "prob"]].rename(columns={"label": "parsed_label"})
        cs = d.sc[[*SAMPLE, "model", "parsed_label", "parsed_option_id", "correct", "n_options"]].merge(
            chosen, on=[*SAMPLE, "parsed_label"], how="left"
        )
        c = cs["prob"]
        bad = c.isna() | (c < 0) | (c > 1)
        cs["status"] = np.where(
            cs.parsed_option_id.isna(), "unparsed", np.where(bad, "no_confidence", "used")
        )
        cs["conf"] = c.where(cs.status == "used")
        return cs

    return d.cached("cal_samples", build)  # type: ignore[return-value]


def _counts(g: pd.DataFrame) -> dict[str, int]:
    used = int((g.status == "used").sum())
    return {
        "n_total": len(g),
        "n": used,
        "n_excluded": len(g) - used,
        "n_unparsed": int((g.status == "unparsed").sum()),
        "n_no_confidence": int((g.status == "no_confidence").sum()),
    }


def _used(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    u = g[g.status == "used"]
    return u.correct.to_numpy(float), u.conf.to_numpy(float)


def auroc(d: Data) -> pd.DataFrame:
    rows = []
    for key, g in _groups(_cal_samples(d), ["model"]):
        y, c = _used(g)
        two = 0 < y.sum() < len(y)
        rows.append(
            {
                **key,
                **_counts(g),
                "n_correct": int(y.sum()),
                "n_incorrect": int(len(y) - y.sum()),
                "auroc": roc_auc_score(y, c) if two else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _bins(c: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.arange(1, N_BINS) / N_BINS, c, side="right")


def ece(d: Data) -> pd.DataFrame:
    rows = []
    for key, g in _groups(_cal_samples(d), ["model"]):
        y, c = _used(g)
        b = _bins(c)
        per = (
            pd.DataFrame({"b": b, "y": y, "c": c})
            .groupby("b")
            .agg(n=("y", "size"), acc=("y", "mean"), conf=("c", "mean"))
        )
        gap = (per.acc - per.conf).abs()
        rows.append(
            {
                **key,
                **_counts(g),
                "n_nonempty_bins": len(per),
                "accuracy": y.mean() if len(y) else math.nan,
                "mean_confidence": c.mean() if len(c) else math.nan,
                "ece": float((per.n * gap).sum() / len(y)) if len(y) else math.nan,
                "mce": float(gap.max()) if len(y) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def reliability(d: Data) -> pd.DataFrame:
    rows = []
    for key, g in _groups(_cal_samples(d), ["model"]):
        y, c = _used(g)
        b = _bins(c)
        for k in range(N_BINS):
            m = b == k
            acc = y[m].mean() if m.any() else math.nan
            conf = c[m].mean() if m.any() else math.nan
            rows.append(
                {
                    **key,
                    "bin": k,
                    "lower": k / N_BINS,
                    "upper": (k + 1) / N_BINS,
                    "n": int(m.sum()),
                    "mean_confidence": conf,
                    "accuracy": acc,
                    "gap": acc - conf,
                    "n_group": len(y),
                    "n_excluded": len(g) - len(y),
                }
            )
    return pd.DataFrame(rows)


def brier(d: Data) -> pd.DataFrame:
    rows = []
    for key, g in _groups(_cal_samples(d), ["model"]):
        y, c = _used(g)
        rows.append(
            {
                **key,
                **_counts(g),
                "accuracy": y.mean() if len(y) else math.nan,
                "mean_confidence": c.mean() if len(c) else math.nan,
                "brier": brier_score_loss(y, c, pos_label=1) if len(y) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def brier_multiclass(d: Data) -> pd.DataFrame:
    op = d.op
    sq = pd.DataFrame({k: op[k] for k in SAMPLE})
    sq["sq"] = (op.prob - op.is_target.astype(float)) ** 2
    per = sq.groupby(SAMPLE, sort=False).agg(n_scored=("sq", "size"), bs=("sq", "sum")).reset_index()
    cs = _cal_samples(d).merge(per, on=SAMPLE, how="left")
    cs["full"] = (cs.n_scored == cs.n_options).to_numpy(bool)
    rows = []
    for key, g in _groups(cs, ["model"]):
        full = g[g.full]
        rows.append(
            {
                **key,
                "n_total": len(g),
                "n": len(full),
                "n_excluded": len(g) - len(full),
                "n_partial": int((~g.full & (g.n_scored > 0)).sum()),
                "n_unscored": int(g.n_scored.isna().sum()),
                "n_used_unparsed": int(full.parsed_option_id.isna().sum()),
                "coverage": len(full) / len(g),
                "brier_multiclass": full.bs.mean() if len(full) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _sorted_blocks(y: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by confidence (highest first): errors in that order, and per row the end position
    (1-based) of its tie block; plus the block end positions."""
    order = np.argsort(-c, kind="stable")
    cs, err = c[order], 1.0 - y[order]
    ends = np.flatnonzero(np.r_[cs[1:] != cs[:-1], True])
    return cs, err, ends


def risk_coverage(d: Data) -> pd.DataFrame:
    parts = []
    for key, g in _groups(_cal_samples(d), ["model"]):
        y, c = _used(g)
        if not len(y):
            continue
        cs, err, ends = _sorted_blocks(y, c)
        k = ends + 1
        cum = np.cumsum(err)[ends]
        part = pd.DataFrame(
            {
                "threshold": cs[ends],
                "n_at_threshold": np.diff(np.r_[0, k]),
                "n_accepted": k,
                "errors": cum.astype(np.int64),
                "n": len(y),
                "coverage": k / len(y),
                "risk": cum / k,
                "n_excluded": len(g) - len(y),
            }
        )
        for col, v in reversed(key.items()):
            part.insert(0, col, v)
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _aurc_row(key: dict, g: pd.DataFrame) -> dict:
    y, c = _used(g)
    row = {**key, **_counts(g)}
    n = len(y)
    e = int(n - y.sum())
    row.update(n_errors=e, error_rate=e / n if n else math.nan)
    if not n:
        return {
            **row,
            "aurc": math.nan,
            "aurc_random": math.nan,
            "aurc_oracle": math.nan,
            "e_aurc": math.nan,
            "prr": math.nan,
        }
    _, err, ends = _sorted_blocks(y, c)
    # per row: the expectation of risk at its position over random orders inside its tie block
    k_end = ends + 1
    k_start = np.r_[0, k_end[:-1]]
    cum = np.cumsum(err)
    e_end = cum[ends]
    e_start = np.r_[0, e_end[:-1]]
    sizes = k_end - k_start
    blk_k0 = np.repeat(k_start, sizes)
    blk_e0 = np.repeat(e_start, sizes)
    blk_nb = np.repeat(sizes, sizes)
    blk_eb = np.repeat(e_end - e_start, sizes)
    pos = np.arange(1, n + 1)
    risk = (blk_e0 + (pos - blk_k0) * blk_eb / blk_nb) / pos
    n_c = n - e
    oracle = np.where(pos > n_c, (pos - n_c) / pos, 0.0)
    aurc, orc = risk.mean(), oracle.mean()
    rnd = e / n
    prr = (rnd - aurc) / (rnd - orc) if 0 < e < n else math.nan
    return {**row, "aurc": aurc, "aurc_random": rnd, "aurc_oracle": orc, "e_aurc": aurc - orc, "prr": prr}


def _aurc_all(d: Data) -> pd.DataFrame:
    return pd.DataFrame([_aurc_row(k, g) for k, g in _groups(_cal_samples(d), ["model"])])


def aurc(d: Data) -> pd.DataFrame:
    return _aurc_all(d).drop(columns="prr")


def prr(d: Data) -> pd.DataFrame:
    return _aurc_all(d).drop(columns="e_aurc")


# ---------------------------------------------------------------------------------------------
# CLEAR: chance baseline, humility deficit, IDK shift
# ---------------------------------------------------------------------------------------------
def chance_baseline(d: Data) -> pd.DataFrame:
    sc = d.sc
    x = sc[(sc.task == "mcq") & (sc.suite == "clear")]
    if x.empty:
        return pd.DataFrame()
    x = pd.DataFrame(
        {
            "model": x.model,
            "prompt_style": x.prompt_style,
            "variant": x.variant,
            "inv": 1.0 / x.n_options,
            "correct": x.correct.astype(float),
            "n_options": x.n_options,
            "unparsed": x.parsed_role.isna().astype(float),
        }
    )
    g = x.groupby(["model", "prompt_style", "variant"], dropna=False)
    out = pd.DataFrame(
        {
            "n": g.size(),
            "chance_accuracy": g.inv.mean(),
            "accuracy": g.correct.mean(),
            "min_options": g.n_options.min(),
            "max_options": g.n_options.max(),
            "unparsed_rate": g.unparsed.mean(),
        }
    )
    out["accuracy_above_chance"] = out.accuracy - out.chance_accuracy
    return out.reset_index()


def _clear_rows(d: Data) -> pd.DataFrame:
    def build() -> pd.DataFrame:
        sc = d.sc
        x = sc[(sc.task == "mcq") & (sc.suite == "clear")].copy()
        parts = x.variant.str.extract(r"^k(\d+)_(.+)$")
        x["clr_k"], x["clr_task"] = parts[0], parts[1]
        x["t"] = x.correct.astype(float)
        x["dis"] = (x.parsed_role == "distractor").astype(float)
        x["unp"] = x.parsed_role.isna().astype(float)
        for fr in ("NA", "IDK", "INA"):
            x[f"sel_{fr}"] = ((x.parsed_role == "abstain") & (x.parsed_framing == fr)).astype(float)
        return x

    return d.cached("clear_rows", build)  # type: ignore[return-value]


def _reported(x: pd.DataFrame, tasks: list[str], values: dict[str, str]) -> pd.DataFrame:
    """Per (run, item) means over its samples, with the pairing key and the output keys."""
    x = x[x.clr_task.isin(tasks)]
    keys = ["run_id", "item_id", *PAIR_KEY, "clr_k", "clr_task"]
    return x.groupby(keys, dropna=False).agg(**{k: (v, "mean") for k, v in values.items()}).reset_index()


def _partner(x: pd.DataFrame, task: str, values: dict[str, str]) -> pd.DataFrame:
    x = x[x.clr_task == task]
    return x.groupby([*PAIR_KEY, "clr_k"]).agg(**{k: (v, "mean") for k, v in values.items()}).reset_index()


def humility_deficit(d: Data) -> pd.DataFrame:
    x = _clear_rows(d)
    a = _reported(x, ["na", "idk", "ina"], {"p_target": "t", "p_dis": "dis", "p_unp": "unp"})
    if a.empty:
        return pd.DataFrame()
    g = _partner(x, "gold", {"g_target": "t", "g_unp": "unp"})
    p = a.merge(g, on=[*PAIR_KEY, "clr_k"], how="left")
    p["k"] = p.clr_k.astype(int)
    p["framing"] = p.clr_task.str.upper()
    rows = []
    for key, grp in _groups(p, ["model", "prompt_style", "k", "framing"]):
        ok = grp[grp.g_target.notna()]
        rows.append(
            {
                **key,
                "n_pairs": len(ok),
                "n_unpaired": len(grp) - len(ok),
                "accuracy": _mean(ok.g_target),
                "abstention_rate": _mean(ok.p_target),
                "humility_deficit": _mean(ok.g_target) - _mean(ok.p_target),
                "incorrect_selection_rate": _mean(ok.p_dis),
                "unparsed_rate_gold": _mean(ok.g_unp),
                "unparsed_rate_abstain": _mean(ok.p_unp),
            }
        )
    return pd.DataFrame(rows)


def idk_shift(d: Data) -> pd.DataFrame:
    x = _clear_rows(d)
    x = x.assign(sel_second=np.where(x.clr_task == "na_idk", x.sel_IDK, x.sel_INA))
    a = _reported(
        x, ["na_idk", "na_ina"], {"dis": "dis", "na": "sel_NA", "second": "sel_second", "unp": "unp"}
    )
    if a.empty:
        return pd.DataFrame()
    b = _partner(
        x, "na", {"b_dis": "dis", "b_na": "sel_NA", "b_IDK": "sel_IDK", "b_INA": "sel_INA", "b_unp": "unp"}
    )
    p = a.merge(b, on=[*PAIR_KEY, "clr_k"], how="left")
    p["added_framing"] = p.clr_task.str[3:].str.upper()
    p["b_second"] = np.where(p.added_framing == "IDK", p.b_IDK, p.b_INA)
    p["k"] = p.clr_k.astype(int)
    rows = []
    for key, grp in _groups(p, ["model", "prompt_style", "k", "added_framing"]):
        ok = grp[grp.b_na.notna()]
        row = {**key, "n_pairs": len(ok), "n_unpaired": len(grp) - len(ok)}
        for name, short in (("distractor", "dis"), ("na", "na"), ("second", "second"), ("unparsed", "unp")):
            before, after = _mean(ok[f"b_{short}"]), _mean(ok[short])
            row[f"p_{name}_before"] = before
            row[f"p_{name}_after"] = after
            row[f"delta_{name}"] = after - before
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# conformal prediction
# ---------------------------------------------------------------------------------------------
def _split_hashes(d: Data, ukeys: np.ndarray, seed: int = 0) -> pd.DataFrame:
    """Split hashes of every distinct unit key (rows) in every repeat (columns): SplitMix64 output
    rep + 1 seeded with the first 16 hex digits of md5('<seed>:<key>'), in numpy uint64 arithmetic
    (wraps mod 2**64). md5 runs once per key, shared by every conformal metric of the run."""
    cache: dict = d.cached("split_hashes", dict)  # type: ignore[assignment]
    new = [k for k in pd.unique(ukeys).tolist() if k not in cache.get("index", {})]
    if new:
        digests = [int(hashlib.md5(f"{seed}:{k}".encode()).hexdigest()[:16], 16) for k in new]
        steps = np.arange(1, REPEATS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = np.array(digests, dtype=np.uint64)[:, None] + steps[None, :]
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = pd.DataFrame(z ^ (z >> np.uint64(31)), index=new)
        cache["table"] = pd.concat([cache["table"], h]) if "table" in cache else h
        cache["index"] = set(cache["table"].index)
    return cache["table"]


def _conformal(
    d: Data, units: pd.DataFrame, opt: pd.DataFrame, by: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Repeated stratified split conformal over ``units`` (columns gid, sid, run_id, ukey, uid) and
    ``opt`` (uid, s, is_target). Returns (per-group summary, per (rep, test unit) sets)."""
    hashes = _split_hashes(d, units.ukey.to_numpy()).reindex(units.ukey).to_numpy()
    tgt_s = opt[opt.is_target].set_index("uid")["s"].reindex(units.uid).to_numpy()
    o_uid, o_s, o_t = opt.uid.to_numpy(), opt.s.to_numpy(), opt.is_target.to_numpy(bool)
    n_units = len(units)
    n_opt = np.bincount(o_uid, minlength=n_units)
    gids = units.gid.to_numpy()
    sids = units.sid.to_numpy()
    run_code = pd.factorize(units.run_id, sort=True)[0]  # string order of run_id, as integers
    ukey_code = pd.factorize(units.ukey, sort=True)[0]
    # stratum sizes and the calibration count of each stratum (the same in every repeat)
    stratum = pd.factorize(pd.MultiIndex.from_arrays([gids, sids]))[0]
    size = np.bincount(stratum)[stratum]
    n_cal_stratum = (2 * CAL_FRACTION.numerator * size + CAL_FRACTION.denominator) // (
        2 * CAL_FRACTION.denominator
    )
    thr_rows, rep_rows, sets = [], [], []
    for rep in range(REPEATS):
        order = np.lexsort((run_code, ukey_code, hashes[:, rep], stratum))  # stratum, hash, key, run_id
        st = stratum[order]
        first = np.r_[0, np.flatnonzero(st[1:] != st[:-1]) + 1]
        rank = np.arange(n_units) - np.repeat(first, np.diff(np.r_[first, n_units]))
        is_cal = np.zeros(n_units, dtype=bool)
        is_cal[order] = rank < n_cal_stratum[order]
        q = {}
        for gid in np.unique(gids):
            m = gids == gid
            cal = np.sort(tgt_s[m & is_cal])
            n = len(cal)
            k = ((n + 1) * (ALPHA_CONF.denominator - ALPHA_CONF.numerator) + ALPHA_CONF.denominator - 1) // (
                ALPHA_CONF.denominator
            )
            q[gid] = cal[k - 1] if k <= n else math.nan
            thr_rows.append({"gid": gid, "rep": rep, "n_cal": n, "k_order": k, "q_hat": q[gid]})
        q_unit = pd.Series(q).reindex(gids).to_numpy()
        qo = q_unit[o_uid]
        in_set = np.isnan(qo) | (o_s <= qo)
        set_size = np.bincount(o_uid, weights=in_set, minlength=n_units)
        covered = np.bincount(o_uid, weights=in_set & o_t, minlength=n_units) > 0
        set_size = np.where(np.isnan(q_unit), n_opt, set_size)
        test = ~is_cal
        s = pd.DataFrame(
            {
                "gid": gids[test],
                "uid": np.flatnonzero(test),
                "set_size": set_size[test],
                "covered": covered[test],
            }
        )
        s["rep"] = rep
        sets.append(s)
        r = s.groupby("gid").agg(
            n_test=("uid", "size"),
            set_size=("set_size", "mean"),
            coverage=("covered", "mean"),
            empty=("set_size", lambda x: (x == 0).mean()),
        )
        r["rep"] = rep
        rep_rows.append(r.reset_index())
    thr = (
        pd.DataFrame(thr_rows)
        .groupby("gid")
        .agg(
            n_cal=("n_cal", "max"),
            k_order=("k_order", "max"),
            n_full_repeats=("q_hat", lambda x: int(x.isna().sum())),
            q_hat_mean=("q_hat", "mean"),
            q_hat_sd=("q_hat", lambda x: x.dropna().std(ddof=1) if x.notna().sum() > 1 else math.nan),
        )
    )
    reps = (
        pd.concat(rep_rows, ignore_index=True)
        .groupby("gid")
        .agg(
            n_test=("n_test", "max"),
            set_size_mean=("set_size", "mean"),
            set_size_sd=("set_size", lambda x: x.std(ddof=1) if len(x) > 1 else math.nan),
            coverage_mean=("coverage", "mean"),
            coverage_sd=("coverage", lambda x: x.std(ddof=1) if len(x) > 1 else math.nan),
            empty_rate=("empty", "mean"),
        )
    )
    summary = thr.join(reps, how="left")
    summary["repeats"] = REPEATS
    summary["alpha"] = float(ALPHA_CONF)
    return summary.reset_index(), pd.concat(sets, ignore_index=True)


def _gid(df: pd.DataFrame, by: list[str]) -> np.ndarray:
    return df.groupby(by, dropna=False, sort=True).ngroup().to_numpy()


def _option_units(d: Data, score: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(base rows with gid, units, unit x option scores) for LAC / APS on sample 0."""
    by = ["model", "config"]
    op0 = d.op[d.op.sample_index == 0]
    b = d.sc[d.sc.sample_index == 0]
    probed = op0[["run_id", "item_id"]].drop_duplicates().assign(has_probs=True)
    b = b.merge(probed, on=["run_id", "item_id"], how="left")
    b["has_probs"] = b.has_probs.fillna(False).astype(bool)
    b["gid"] = _gid(b, by)
    b["sid"] = _gid(b, ["target_role"])
    units = b[b.has_probs].reset_index(drop=True)
    units["uid"] = np.arange(len(units))
    units["ukey"] = units.item_id
    o = units[["uid", *ITEM, "run_id", "target_label"]].merge(d.t["options"][[*ITEM, "label"]], on=ITEM)
    o = o.merge(op0[["run_id", "item_id", "label", "prob"]], on=["run_id", "item_id", "label"], how="left")
    o["unscored"] = o.prob.isna()
    o["p"] = o.prob.fillna(0.0)
    o["is_target"] = (o.label == o.target_label).to_numpy(bool)
    if score == "lac":
        o["s"] = 1.0 - o.p
    else:  # APS: 1 - mass of the options strictly less likely than this one
        o = o.sort_values(["uid", "p"], kind="stable")
        below = o.groupby("uid", sort=False)["p"].cumsum() - o.p
        o["below"] = below.groupby([o.uid, o.p], sort=False).transform("min").clip(lower=0.0)
        o["s"] = 1.0 - o.below
        o = o.sort_index()
    return b, units, o


def _option_summary(d: Data, score: str) -> pd.DataFrame:
    by = ["model", "config"]
    b, units, o = _option_units(d, score)
    summary, _ = _conformal(d, units, o, by)
    groups = b.groupby("gid").agg(
        **{c: (c, "first") for c in by},
        n_items=("item_id", "size"),
        n_unscored=("has_probs", lambda x: int((~x).sum())),
    )
    tu = o[o.is_target].merge(units[["uid", "gid"]], on="uid").groupby("gid").unscored.sum()
    groups["n_scored"] = groups.n_items - groups.n_unscored
    groups["n_target_unscored"] = tu.reindex(groups.index).fillna(0).astype(int)
    out = groups.join(summary.set_index("gid"), how="left")
    return out.reset_index(drop=True)


def conformal_lac(d: Data) -> pd.DataFrame:
    return _option_summary(d, "lac")


def conformal_aps(d: Data) -> pd.DataFrame:
    return _option_summary(d, "aps")


def conformal_coverage_by(d: Data) -> pd.DataFrame:
    by = ["model", "config"]
    b, units, o = _option_units(d, "lac")
    _, sets = _conformal(d, units, o, by)
    sets = sets.merge(units[["uid", "specialty"]], on="uid")
    sets["empty"] = sets.set_size == 0
    out = sets.groupby(["gid", "specialty"], dropna=False).agg(
        n_test=("uid", "size"),
        repeats_with_test=("rep", "nunique"),
        coverage=("covered", "mean"),
        set_size_mean=("set_size", "mean"),
        empty_rate=("empty", "mean"),
    )
    out["n_test_mean"] = out.n_test / REPEATS
    keys = b.groupby("gid")[by].first()
    return out.reset_index().merge(keys, left_on="gid", right_index=True).drop(columns=["gid", "n_test"])


def conformal_sampling(d: Data) -> pd.DataFrame:
    by = ["model", "config"]
    cols = dict.fromkeys([*by, "target_role", "run_id", *ITEM, "parsed_option_id", "target_option_id"])
    s = d.sc[list(cols)].copy()
    s["gid"] = _gid(s, by)
    s["sid"] = _gid(s, ["target_role"])
    s["ukey"] = s.item_id
    s["hit"] = (s.parsed_option_id == s.target_option_id).to_numpy(bool)
    pk = ["gid", "sid", "run_id", "ukey"]
    pools = (
        s.groupby(pk, sort=False)
        .agg(
            m=("hit", "size"),
            m_option=("parsed_option_id", "count"),
            n_targets=("target_option_id", "nunique"),
            target_option_id=("target_option_id", "min"),
            hit=("hit", "max"),
            dataset_id=("dataset_id", "first"),
            config_=("config", "first"),
        )
        .reset_index()
    )
    units = pools[pools.n_targets == 1].reset_index(drop=True)
    units["uid"] = np.arange(len(units))
    votes = (
        s[s.parsed_option_id.notna()]
        .groupby([*pk, "parsed_option_id"], sort=False)
        .size()
        .rename("c")
        .reset_index()
    )
    votes = votes.rename(columns={"parsed_option_id": "option_id"})
    po = units[[*pk, "uid", "dataset_id", "config_", "m", "target_option_id"]].rename(
        columns={"config_": "config"}
    )
    po = po.merge(
        d.t["options"][[*ITEM[:2], "item_id", "option_id"]],
        left_on=["dataset_id", "config", "ukey"],
        right_on=ITEM,
    )
    po = po.merge(votes, on=[*pk, "option_id"], how="left")
    po["c"] = po.c.fillna(0).astype(np.int64)
    po["s"] = (po.m - po.c) / po.m
    po["is_target"] = (po.option_id == po.target_option_id).to_numpy(bool)
    # majority vote: most chosen option, ties to the smallest option_id; no vote = wrong
    v = votes.merge(units[[*pk, "uid", "target_option_id"]], on=pk)
    v = v.sort_values(["uid", "c", "option_id"], ascending=[True, False, True]).drop_duplicates("uid")
    units["mv_correct"] = False
    units.loc[v.uid[v.option_id == v.target_option_id].to_numpy(), "mv_correct"] = True
    summary, sets = _conformal(d, units, po[["uid", "s", "is_target"]], by)
    te = (
        sets.merge(units[["uid", "mv_correct", "hit"]], on="uid")
        .groupby(["gid", "rep"])
        .agg(mv=("mv_correct", "mean"), hit=("hit", "mean"))
    )
    te = te.groupby("gid").agg(mv_accuracy_test=("mv", "mean"), hit_rate_test=("hit", "mean"))
    units["no_option"] = units.m - units.m_option
    allst = units.groupby("gid").agg(
        n_units=("uid", "size"),
        m_min=("m", "min"),
        m_max=("m", "max"),
        m_mean=("m", "mean"),
        n_samples_no_option=("no_option", "sum"),
        mv_accuracy=("mv_correct", "mean"),
        hit_rate=("hit", "mean"),
    )
    pc = pools.groupby("gid").agg(
        n_pools=("m", "size"), n_target_mismatch=("n_targets", lambda x: int((x != 1).sum()))
    )
    keys = s.groupby("gid")[by].first()
    out = keys.join(pc).join(allst).join(summary.set_index("gid")).join(te)
    return out.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# determinability (ClinDet)
# ---------------------------------------------------------------------------------------------
def _decisions(d: Data) -> pd.DataFrame:
    sc = d.sc
    return sc[sc.task == "determinability"]


def determinability_accuracy(d: Data) -> pd.DataFrame:
    x = _decisions(d)
    if x.empty:
        return pd.DataFrame()
    role = x.parsed_role
    det = x.condition.isin(["complete", "incomplete_determinable"])
    und = x.condition == "incomplete_undeterminable"
    y = pd.DataFrame(
        {
            "model": x.model,
            "prompt_style": x.prompt_style,
            "condition": x.condition,
            "correct": x.correct.astype(float),
            "premature": role.isin(["gold", "distractor"]).astype(float).where(und),
            "abstain": (role == "abstain").astype(float).where(det),
            "wrong": (role == "distractor").astype(float).where(det),
            "unparsed": role.isna().astype(float),
        }
    )
    g = y.groupby(["model", "prompt_style", "condition"], dropna=False)
    return pd.DataFrame(
        {
            "n": g.size(),
            "n_correct": g.correct.sum().astype(np.int64),
            "accuracy": g.correct.mean(),
            "premature_judgment_rate": g.premature.mean(),
            "excessive_abstention_rate": g.abstain.mean(),
            "wrong_decision_rate": g.wrong.mean(),
            "unparsed_rate": g.unparsed.mean(),
        }
    ).reset_index()


def determinability_fisher(d: Data) -> pd.DataFrame:
    x = _decisions(d)
    rows = []
    for key, g in _groups(x, ["model", "prompt_style"]):
        comp = g[g.condition == "complete"]
        n_ref, a_ref = len(comp), int(comp.correct.sum())
        for cond in ("incomplete_determinable", "incomplete_undeterminable"):
            c = g[g.condition == cond]
            n, a = len(c), int(c.correct.sum())
            if n and n_ref:
                res = stats.fisher_exact([[a, n - a], [a_ref, n_ref - a_ref]])
                odds, p = float(res.statistic), float(res.pvalue)
            else:
                odds = p = math.nan
            acc = a / n if n else math.nan
            acc_ref = a_ref / n_ref if n_ref else math.nan
            rows.append(
                {
                    **key,
                    "condition": cond,
                    "n": n,
                    "n_correct": a,
                    "n_complete": n_ref,
                    "n_correct_complete": a_ref,
                    "accuracy": acc,
                    "accuracy_complete": acc_ref,
                    "accuracy_difference": acc - acc_ref,
                    "odds_ratio": odds,
                    "p_value": p,
                    "significant": (p <= 0.05) if not math.isnan(p) else None,
                }
            )
    return pd.DataFrame(rows)


def determinability_tradeoff(d: Data) -> pd.DataFrame:
    x = _decisions(d)
    pts = []
    for _, g in _groups(x, ["model", "prompt_style"]):
        det = g[g.condition == "incomplete_determinable"].correct
        und = g[g.condition == "incomplete_undeterminable"].correct
        pts.append((det.mean() if len(det) else math.nan, und.mean() if len(und) else math.nan))
    p = np.array(pts, dtype=float).reshape(-1, 2)
    ok = ~np.isnan(p).any(axis=1)
    xs, ys = p[ok, 0], p[ok, 1]
    if len(xs) >= 3 and np.ptp(xs) > 0 and np.ptp(ys) > 0:
        res = stats.spearmanr(xs, ys)
        rho, pv = float(res.statistic), float(res.pvalue)
    else:
        rho = pv = math.nan
    return pd.DataFrame(
        {
            "points_by": ["model, prompt_style"],
            "n_points": [int(ok.sum())],
            "n_groups_dropped": [int((~ok).sum())],
            "spearman_rho": [rho],
            "p_value": [pv],
            "significant": [None if math.isnan(pv) else bool(pv <= 0.05)],
        }
    )


def self_eval_filtered_accuracy(d: Data) -> pd.DataFrame:
    x = _decisions(d)
    if x.empty:
        return pd.DataFrame()
    runs = d.t["runs"]
    se = runs[runs.prompt_style.str.startswith(SELF_EVAL)]
    v = d.t["predictions"][["run_id", "item_id", "sample_index", "parsed_label"]].merge(se, on="run_id")
    v["prompt_style"] = v.prompt_style.str.slice(len(SELF_EVAL))
    link = ["model", "backend", "dataset_id", "config", "prompt_style", "item_id", "sample_index"]
    v["is_c"] = v.parsed_label == "Correct"
    v["is_i"] = v.parsed_label == "Incorrect"
    v = v.groupby(link).agg(nv=("is_c", "size"), nc=("is_c", "sum"), ni=("is_i", "sum")).reset_index()
    j = x[[*link, "condition", "correct"]].merge(v, on=link, how="left")
    j[["nv", "nc", "ni"]] = j[["nv", "nc", "ni"]].fillna(0)
    j["y"] = j.correct.astype(float)
    j["nv_y"] = j.nv * j.y
    j["nc_y"] = j.nc * j.y
    g = j.groupby(["model", "prompt_style", "condition"], dropna=False)
    out = pd.DataFrame(
        {
            "n": g.size(),
            "accuracy": g.y.mean(),
            "n_self_evaluated": g.nv.sum().astype(np.int64),
            "n_judged_correct": g.nc.sum().astype(np.int64),
            "n_verdict_unparsed": (g.nv.sum() - g.nc.sum() - g.ni.sum()).astype(np.int64),
        }
    )
    nv, nc = g.nv.sum(), g.nc.sum()
    out["judged_correct_rate"] = nc / nv.where(nv > 0)
    out["accuracy_self_evaluated"] = g.nv_y.sum() / nv.where(nv > 0)
    out["filtered_accuracy"] = g.nc_y.sum() / nc.where(nc > 0)
    return out.reset_index()


# ---------------------------------------------------------------------------------------------
# robustness: flips, McNemar, bootstraps
# ---------------------------------------------------------------------------------------------
def _pairs(d: Data) -> tuple[pd.DataFrame, pd.DataFrame]:
    def build() -> tuple[pd.DataFrame, pd.DataFrame]:
        sc = d.sc
        s = sc[(sc.sample_index == 0) & sc.variant.isin(["original", "plus_nota"])]
        chosen = d.op[[*SAMPLE, "label", "prob"]].rename(columns={"label": "parsed_label"})
        s = s[
            [
                *PAIR_KEY,
                "run_id",
                "item_id",
                "sample_index",
                "variant",
                "parsed_label",
                "parsed_role",
                "correct",
            ]
        ]
        s = s.merge(chosen, on=[*SAMPLE, "parsed_label"], how="left")
        s["u"] = 1.0 - s.prob
        b, q = s[s.variant == "original"], s[s.variant == "plus_nota"]
        pairs = b.merge(q, on=PAIR_KEY, suffixes=("", "_q"))
        hit = b.merge(q[PAIR_KEY].drop_duplicates(), on=PAIR_KEY, how="left", indicator=True)
        return pairs, b[(hit["_merge"] == "left_only").to_numpy()]

    return d.cached("pairs", build)  # type: ignore[return-value]


CATEGORIES = (
    ("stable_correct", "initially_correct"),
    ("correct_to_wrong", "initially_correct"),
    ("wrong_to_correct", "initially_wrong"),
    ("stable_wrong", "initially_wrong"),
)


def flip_analysis(d: Data) -> pd.DataFrame:
    pairs, _ = _pairs(d)
    bc, qc = pairs.correct.to_numpy(bool), pairs.correct_q.to_numpy(bool)
    pairs = pairs.assign(
        cat=np.select(
            [bc & qc, bc, qc], ["stable_correct", "correct_to_wrong", "wrong_to_correct"], "stable_wrong"
        )
    )
    rows = []
    for key, g in _groups(pairs, ["model", "prompt_style"]):
        for cat, pool in CATEGORIES:
            sub = g[g.cat == cat]
            pool_rows = g[g.correct] if pool == "initially_correct" else g[~g.correct]
            mu, mp = _mean(sub.u), _mean(pool_rows.u)
            rows.append(
                {
                    **key,
                    "category": cat,
                    "n_pairs": len(g),
                    "n": len(sub),
                    "pool": pool,
                    "n_pool": len(pool_rows),
                    "n_with_uncertainty": int(sub.u.notna().sum()),
                    "mean_uncertainty": mu,
                    "pool_mean_uncertainty": mp,
                    "share": len(sub) / len(g) if len(g) else math.nan,
                    "relative_uncertainty": (mu - mp) / mp if mp else math.nan,
                }
            )
    return pd.DataFrame(rows)


def mcnemar(d: Data) -> pd.DataFrame:
    pairs, unpaired = _pairs(d)
    keys = ["model", "prompt_style"]
    allk = pd.concat([pairs[keys], unpaired[keys]]).drop_duplicates()
    rows = []
    for _, kr in allk.sort_values(keys).iterrows():
        key = {k: kr[k] for k in keys}
        g = pairs[(pairs.model == kr.model) & (pairs.prompt_style == kr.prompt_style)]
        un = unpaired[(unpaired.model == kr.model) & (unpaired.prompt_style == kr.prompt_style)]
        bc, qc = g.correct.to_numpy(bool), g.correct_q.to_numpy(bool)
        a, b, c, e = (
            int((bc & qc).sum()),
            int((bc & ~qc).sum()),
            int((~bc & qc).sum()),
            int((~bc & ~qc).sum()),
        )
        exact = b + c < 25
        res = sm_mcnemar([[a, b], [c, e]], exact=exact, correction=True)
        rows.append(
            {
                **key,
                "n_pairs": len(g),
                "n_stable_correct": a,
                "n_correct_to_wrong": b,
                "n_wrong_to_correct": c,
                "n_stable_wrong": e,
                "accuracy_base": bc.mean() if len(g) else math.nan,
                "accuracy_perturbed": qc.mean() if len(g) else math.nan,
                "accuracy_change": qc.mean() - bc.mean() if len(g) else math.nan,
                "n_unparsed_base": int(g.parsed_role.isna().sum()),
                "n_unparsed_perturbed": int(g.parsed_role_q.isna().sum()),
                "n_base_unpaired": len(un),
                "n_discordant": b + c,
                "method": "exact" if exact else "chi2",
                "statistic": float(res.statistic),
                "p_value": float(res.pvalue),
                "significant": bool(res.pvalue <= 0.05),
            }
        )
    return pd.DataFrame(rows)


def _rng(seed: int, key: Sequence[object]) -> np.random.Generator:
    def part(v: object) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return str(int(v))
        return str(v)

    h = int.from_bytes(hashlib.sha256("\x1f".join(part(v) for v in key).encode()).digest()[:8], "little")
    return np.random.default_rng([seed, h])


def _boot(n: int, rng: np.random.Generator, stat: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """N_BOOT replicate statistics; indices floor(u * n) drawn 100 replicates at a time (the same
    stream as one big draw: rng.random fills row-major)."""
    out = []
    done = 0
    while done < N_BOOT:
        b = min(100, N_BOOT - done)
        out.append(stat(np.floor(rng.random((b, n)) * n).astype(np.int64)))
        done += b
    return np.concatenate(out)


def paired_bootstrap_uncertainty(d: Data) -> pd.DataFrame:
    pairs, _ = _pairs(d)
    rows = []
    for key, g in _groups(pairs, ["model", "prompt_style"]):
        ok = g[g.u.notna() & g.u_q.notna()].sort_values(["run_id", "item_id", "run_id_q", "item_id_q"])
        x = (ok.u_q - ok.u).to_numpy(float)
        row = {**key, "n_pairs": len(g), "n_missing": len(g) - len(ok), "n_used": len(x)}
        if len(x):
            reps = _boot(len(x), _rng(0, list(key.values())), lambda idx, x=x: x[idx].mean(axis=1))
            lo, hi = np.percentile(reps, [2.5, 97.5])
            p = min(1.0, 2.0 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
            row.update(mean_diff=x.mean(), ci_low=lo, ci_high=hi, p_value=p, significant=p <= 0.05)
        else:
            row.update(
                mean_diff=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, significant=None
            )
        rows.append({**row, "n_boot": N_BOOT, "seed": 0, "alpha": 0.05})
    return pd.DataFrame(rows)


def bootstrap_ci(d: Data) -> pd.DataFrame:
    sc = d.sc
    per = (
        pd.DataFrame(
            {"model": sc.model, "run_id": sc.run_id, "item_id": sc.item_id, "c": sc.correct.astype(np.int64)}
        )
        .groupby(["model", "run_id", "item_id"], sort=True)
        .agg(m=("c", "size"), c=("c", "sum"))
        .reset_index()
    )
    rows = []
    for key, g in _groups(per, ["model"]):
        c, m = g.c.to_numpy(float), g.m.to_numpy(float)
        # the documented stream: multinomial counts of items over the distinct (m, c) kinds
        kinds = g.groupby(["m", "c"], sort=True).size()
        counts = _rng(0, list(key.values())).multinomial(len(g), kinds.to_numpy() / len(g), size=N_BOOT)
        reps = (counts @ kinds.index.get_level_values("c").to_numpy(float)) / (
            counts @ kinds.index.get_level_values("m").to_numpy(float)
        )
        lo, hi = np.percentile(reps, [2.5, 97.5])
        rows.append(
            {
                **key,
                "n": int(m.sum()),
                "n_items": len(g),
                "accuracy": c.sum() / m.sum(),
                "ci_low": lo,
                "ci_high": hi,
                "n_boot": N_BOOT,
                "seed": 0,
                "alpha": 0.05,
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# uncertainty scores
# ---------------------------------------------------------------------------------------------
def _greedy(decoding: str) -> bool | None:
    try:
        t = json.loads(decoding).get("temperature")
    except (ValueError, AttributeError):
        return None
    try:
        return float(t if t is not None else 0) == 0
    except (TypeError, ValueError):
        return True


def _elicited(text: pd.Series) -> pd.Series:
    def last(hits: list[tuple[str, str]]) -> float:
        if not hits:
            return math.nan
        num, pct = float(hits[-1][0]), hits[-1][1]
        v = num / 100 if pct == "%" or num > 1 else num
        return v if 0 <= v <= 1 else math.nan

    return text.str.findall(CONF_RE).map(last)


def _unc_scores(d: Data) -> pd.DataFrame:
    def build() -> pd.DataFrame:
        s = d.sc
        keys = ["run_id", "item_id"]
        cl = pd.DataFrame(
            {"run_id": s.run_id, "item_id": s.item_id, "cluster": s.parsed_option_id.fillna("(no answer)")}
        )
        pool = (
            pd.DataFrame({"run_id": s.run_id, "item_id": s.item_id, "y": s.correct.astype(float)})
            .groupby(keys)
            .agg(n_samples=("y", "size"), sample_accuracy=("y", "mean"))
        )
        nc = cl.groupby([*keys, "cluster"]).size().rename("n_c").reset_index()
        nc = nc.merge(pool.n_samples.reset_index(), on=keys)
        f = nc.n_c / nc.n_samples
        nc["plogp"] = f * np.log(f)
        cons = nc.groupby(keys).agg(n_clusters=("n_c", "size"), n_max=("n_c", "max"), plogp=("plogp", "sum"))
        cons["sample_consistency"] = 1 - cons.n_max / pool.n_samples.reindex(cons.index)
        cons["semantic_entropy"] = 0.0 - cons.plogp
        seq = (
            s[s.token_logprob_sum.notna()]
            .groupby([*keys, "raw_output"])
            .token_logprob_sum.mean()
            .rename("lp")
            .reset_index()
        )
        seq["dd"] = seq.lp - seq.groupby(keys).lp.transform("max")
        seq["e"] = np.exp(seq.dd)
        seq["ed"] = seq.e * seq.dd
        pro = seq.groupby(keys).agg(n_pro_sequences=("e", "size"), se=("e", "sum"), sed=("ed", "sum"))
        pro["pro"] = np.log(pro.se) - pro.sed / pro.se
        op0 = d.op[d.op.sample_index == 0]
        plp = np.where(op0.prob > 0, op0.prob * np.log(op0.prob.where(op0.prob > 0, 1.0)), 0.0)
        ent = (
            pd.DataFrame({"run_id": op0.run_id, "item_id": op0.item_id, "plp": plp})
            .groupby(keys)
            .agg(n_scored_options=("plp", "size"), s=("plp", "sum"))
        )
        ent["option_entropy"] = 0.0 - ent.s
        s0 = s[s.sample_index == 0]
        ch = s0[["run_id", "item_id", "parsed_label"]].merge(
            op0[["run_id", "item_id", "label", "prob", "logprob"]].rename(columns={"label": "parsed_label"}),
            on=["run_id", "item_id", "parsed_label"],
        )
        ch["label_nll"] = np.where(ch.prob > 0, -np.log(ch.prob.where(ch.prob > 0, 1.0)), np.inf)
        ch["label_nll_raw"] = -ch.logprob
        out = s0[
            [
                "model",
                "run_id",
                "item_id",
                "base_id",
                "outcome",
                "correct",
                "n_options",
                "decoding_json",
                "raw_output",
            ]
        ]
        out = out.assign(
            avg_nll=-s0.token_logprob_mean,
            max_nll=-s0.token_logprob_min,
            g_nll=-s0.token_logprob_sum,
            geo_mean_token_prob=np.exp(s0.token_logprob_mean),
            n_output_tokens=s0.n_output_tokens,
        )
        out = out.merge(pool.reset_index(), on=keys).merge(
            cons[["n_clusters", "sample_consistency", "semantic_entropy"]].reset_index(), on=keys
        )
        out = out.merge(pro[["n_pro_sequences", "pro"]].reset_index(), on=keys, how="left")
        out = out.merge(ent[["n_scored_options", "option_entropy"]].reset_index(), on=keys, how="left")
        out = out.merge(ch[[*keys, "label_nll", "label_nll_raw"]], on=keys, how="left")
        greedy = {dj: _greedy(dj) for dj in out.decoding_json.unique()}
        out["sample0_greedy"] = out.decoding_json.map(greedy)
        text = out.raw_output
        out["elicited_confidence"] = _elicited(text)
        out["elicited_uncertainty"] = 1 - out.elicited_confidence
        out["n_words"] = text.str.count(r"\S+")
        out["n_questions"] = text.str.count(r"\?+")
        out["n_wait"] = text.str.count(r"(?i)\bwait\b")
        out["n_hedges"] = text.str.count(HEDGE_RE)
        return out.drop(columns=["decoding_json", "raw_output"])

    return d.cached("unc_scores", build)  # type: ignore[return-value]


def unc_scores(d: Data) -> pd.DataFrame:
    return _unc_scores(d)


def unc_summary(d: Data) -> pd.DataFrame:
    sc = _unc_scores(d)
    long = sc.melt(id_vars=["model"], value_vars=list(SCORE_COLUMNS), var_name="score", value_name="value")
    long["value"] = long.value.astype(float)
    g = long.groupby(["model", "score"], dropna=False)
    return pd.DataFrame(
        {"n_items": g.size(), "n_scored": g.value.count(), "mean": g.value.mean()}
    ).reset_index()


def unc_auroc(d: Data) -> pd.DataFrame:
    """AUROC of each uncertainty score for detecting incorrect sample-0 answers (scikit-learn)."""
    sc = _unc_scores(d)
    cols = [c for c in SCORE_COLUMNS if c not in NOT_UNCERTAINTIES]
    rows = []
    for model, g in sc.groupby("model", dropna=False):
        y = ~g.correct.to_numpy(bool)
        for col in cols:
            u = g[col].to_numpy(dtype=float)
            ok = ~np.isnan(u)
            yy = y[ok]
            two = 0 < yy.sum() < len(yy)
            rows.append(
                {
                    "model": model,
                    "score": col,
                    "n_items": len(g),
                    "n": int(ok.sum()),
                    "n_undefined": int((~ok).sum()),
                    "n_incorrect": int(yy.sum()),
                    "auroc": roc_auc_score(yy, u[ok]) if two else math.nan,
                }
            )
    return pd.DataFrame(rows)


def _unc_bounds(d: Data) -> tuple[list[str], np.ndarray, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The uncertainty columns, whether each unc_scores row is held out (md5 of item_id below 0.3),
    and per model (rows) x score (columns): the held-out count, minimum and 99th percentile
    (numpy's linear interpolation, which pandas' groupby quantile uses), NaN-free values only."""

    def build() -> tuple[list[str], np.ndarray, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        sc = _unc_scores(d)
        cols = [c for c in SCORE_COLUMNS if c not in NOT_UNCERTAINTIES]
        items = pd.unique(sc.item_id)
        in_h = pd.Series(_md5_unit(items) < 0.3, index=items).reindex(sc.item_id).to_numpy()
        models = pd.Index(pd.unique(sc.model), name="model")
        held = sc.loc[in_h, ["model", *cols]].astype({c: float for c in cols})
        g = held.groupby("model", dropna=False)[cols]
        n = g.count().reindex(models, fill_value=0)
        return cols, in_h, n, g.min().reindex(models), g.quantile(0.99).reindex(models)

    return d.cached("unc_bounds", build)  # type: ignore[return-value]


def unc_normalization_bounds(d: Data) -> pd.DataFrame:
    cols, _, n, lo, hi = _unc_bounds(d)
    return pd.DataFrame(
        {
            "model": np.repeat(n.index.to_numpy(), len(cols)),
            "score": np.tile(np.array(cols, dtype=object), len(n)),
            "n_holdout": n.to_numpy().ravel(),
            "lower": lo.to_numpy().ravel(),
            "upper": hi.to_numpy().ravel(),
        }
    )


def unc_normalized(d: Data) -> pd.DataFrame:
    """One row per item not held out, the min-max normalised value of every score as a column."""
    sc = _unc_scores(d)
    cols, in_h, _, lo, hi = _unc_bounds(d)
    kept = sc.loc[~in_h]
    x = kept[cols].to_numpy(dtype=float)
    low, high = lo.reindex(kept.model).to_numpy(), hi.reindex(kept.model).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.where(high > low, np.clip((x - low) / (high - low), 0, 1), np.where(x <= low, 0.0, 1.0))
    norm[np.isnan(x) | np.isnan(high)] = np.nan
    out = kept[["model", "run_id", "item_id"]].reset_index(drop=True)
    out["in_holdout"] = False
    return pd.concat([out, pd.DataFrame(norm, columns=cols)], axis=1)


def unc_combiners(d: Data) -> pd.DataFrame:
    sc = _unc_scores(d)
    feats = list(FEATURES)
    x = sc[["model", "run_id", "item_id", "correct", *feats]].copy()
    x[feats] = x[feats].astype(float)
    x["incorrect"] = ~x.correct.astype(bool)
    x["is_train"] = _md5_unit(x.item_id.tolist()) < 0.4
    x["complete"] = x[feats].notna().all(axis=1)
    rows = []
    for model, grp in x.groupby("model", dropna=False):
        g = grp[grp.complete].sort_values(["run_id", "item_id"])
        tr = g.is_train.to_numpy(bool)
        raw = g[feats].to_numpy(float)
        lo, hi = raw[tr].min(axis=0), raw[tr].max(axis=0)
        xs = np.where(hi > lo, (raw - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
        y = g.incorrect.to_numpy(int)
        row: dict[str, object] = {
            "model": model,
            "n_rows": len(grp),
            "n_missing_features": int((~grp.complete).sum()),
            "n_train": int(tr.sum()),
            "n_train_incorrect": int(y[tr].sum()),
            "n_test": int((~tr).sum()),
            "n_test_incorrect": int(y[~tr].sum()),
        }
        preds = {"linear_sum": xs.sum(axis=1)}
        # a tight tol: the metric is the exact optimum, and the default tol=1e-4 stops ~1e-4 short of it
        lr = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(xs[tr], y[tr])
        preds["logistic"] = lr.predict_proba(xs)[:, 1]
        row.update({f"logistic_{f}": float(c) for f, c in zip(feats, lr.coef_[0], strict=True)})
        row["logistic_bias"] = float(lr.intercept_[0])
        rg = Ridge(alpha=1.0).fit(xs[tr], y[tr].astype(float))
        preds["ridge"] = rg.predict(xs)
        row.update({f"ridge_{f}": float(c) for f, c in zip(feats, rg.coef_, strict=True)})
        row["ridge_bias"] = float(rg.intercept_)
        for name, u in preds.items():
            yt = y[~tr]
            row[f"auroc_{name}"] = roc_auc_score(yt, u[~tr]) if 0 < yt.sum() < len(yt) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# registry of the reference: metric -> (function, row key columns for comparing outputs)
# ---------------------------------------------------------------------------------------------
REFERENCE: dict[str, tuple[Callable[[Data], pd.DataFrame], tuple[str, ...]]] = {
    "answer_rates": (answer_rates, ("model",)),
    "aurc": (aurc, ("model",)),
    "auroc": (auroc, ("model",)),
    "bootstrap_ci": (bootstrap_ci, ("model",)),
    "brier": (brier, ("model",)),
    "brier_multiclass": (brier_multiclass, ("model",)),
    "chance_baseline": (chance_baseline, ("model", "prompt_style", "variant")),
    "conformal_aps": (conformal_aps, ("model", "config")),
    "conformal_coverage_by": (conformal_coverage_by, ("model", "config", "specialty")),
    "conformal_lac": (conformal_lac, ("model", "config")),
    "conformal_sampling": (conformal_sampling, ("model", "config")),
    "determinability_accuracy": (determinability_accuracy, ("model", "prompt_style", "condition")),
    "determinability_fisher": (determinability_fisher, ("model", "prompt_style", "condition")),
    "determinability_tradeoff": (determinability_tradeoff, ("points_by",)),
    "ece": (ece, ("model",)),
    "flip_analysis": (flip_analysis, ("model", "prompt_style", "category")),
    "humility_deficit": (humility_deficit, ("model", "prompt_style", "k", "framing")),
    "idk_shift": (idk_shift, ("model", "prompt_style", "k", "added_framing")),
    "mcnemar": (mcnemar, ("model", "prompt_style")),
    "paired_bootstrap_uncertainty": (paired_bootstrap_uncertainty, ("model", "prompt_style")),
    "prr": (prr, ("model",)),
    "reliability": (reliability, ("model", "bin")),
    "risk_coverage": (risk_coverage, ("model", "n_accepted")),
    "self_eval_filtered_accuracy": (self_eval_filtered_accuracy, ("model", "prompt_style", "condition")),
    "unc_auroc": (unc_auroc, ("model", "score")),
    "unc_combiners": (unc_combiners, ("model",)),
    "unc_normalization_bounds": (unc_normalization_bounds, ("model", "score")),
    "unc_normalized": (unc_normalized, ("model", "run_id", "item_id")),
    "unc_scores": (unc_scores, ("model", "run_id", "item_id")),
    "unc_summary": (unc_summary, ("model", "score")),
}


def compare(got: pd.DataFrame, want: pd.DataFrame, keys: Sequence[str], atol: float = 1e-6) -> dict:
    """Cell-by-cell agreement of two outputs matched on ``keys``: numbers within ``atol`` (plus 1e-9
    relative), NaN = NaN, other values equal as text. Rows on one side only and reference columns
    missing from ``got`` count as mismatches."""
    keys = list(keys)
    out = {
        "rows_duckdb": len(got),
        "rows_reference": len(want),
        "columns": 0,
        "cells": 0,
        "mismatches": 0,
        "examples": [],
    }
    if got.empty and want.empty:
        return out
    if got.empty or want.empty:
        out["mismatches"] = max(len(got), len(want))
        out["examples"].append("one side is empty")
        return out
    g, w = got.copy(), want.copy()
    for k in keys:
        g[k], w[k] = _key_text(g[k]), _key_text(w[k])
    cols = [c for c in w.columns if c not in keys]
    absent = [c for c in cols if c not in g.columns]
    cols = [c for c in cols if c in g.columns]
    m = g[[*keys, *cols]].merge(
        w[[*keys, *cols]], on=keys, how="outer", suffixes=("_d", "_r"), indicator=True
    )
    one_side = int((m["_merge"] != "both").sum())
    both = m[m["_merge"] == "both"]
    bad = one_side + len(absent) * len(both)
    if one_side:
        out["examples"].append(f"{one_side} rows on one side only")
    if absent:
        out["examples"].append(f"columns missing from the DuckDB output: {absent}")
    for c in cols:
        a, b = _as_float(both[f"{c}_d"]), _as_float(both[f"{c}_r"])
        if a is not None and b is not None:
            with np.errstate(invalid="ignore"):
                ok = np.isclose(a, b, rtol=1e-9, atol=atol, equal_nan=True)
        else:
            ok = (_key_text(both[f"{c}_d"]) == _key_text(both[f"{c}_r"])).to_numpy()
        n_bad = int((~ok).sum())
        if n_bad:
            i = int(np.flatnonzero(~ok)[0])
            a_i, b_i = both[f"{c}_d"].iloc[i], both[f"{c}_r"].iloc[i]
            out["examples"].append(f"{c}: {n_bad} cells, e.g. duckdb {a_i!r} vs reference {b_i!r}")
        bad += n_bad
    out.update(columns=len(cols), cells=len(cols) * len(both), mismatches=bad)
    return out


def _key_text(s: pd.Series) -> pd.Series:
    """Values as text for matching: NULL/NaN as '', integral numbers without a decimal point."""

    def one(v: object) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return str(int(v))
        return str(v)

    if s.dtype == object or str(s.dtype) in ("string", "category"):
        uniq = pd.unique(s)
        if len(uniq) < len(s) // 4:
            return s.map({u: one(u) for u in uniq if not (isinstance(u, float) and math.isnan(u))}).fillna("")
    return pd.Series([one(v) for v in s.tolist()], index=s.index)


def _as_float(s: pd.Series) -> np.ndarray | None:
    """A numeric / boolean column as floats (NULL -> NaN); None for text."""
    if pd.api.types.is_bool_dtype(s.dtype) or pd.api.types.is_numeric_dtype(s.dtype):
        return s.to_numpy(dtype=float, na_value=np.nan)
    vals = s.tolist()
    out = np.empty(len(vals))
    for i, v in enumerate(vals):
        if v is None or v is pd.NA:
            out[i] = np.nan
        elif isinstance(v, (bool, np.bool_, int, float, np.integer, np.floating)):
            out[i] = float(v)
        else:
            return None
    return out
