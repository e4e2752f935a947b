"""conformal_* metrics against a plain numpy / hashlib / fractions reference that re-implements the
split, the scores, the integer threshold and the sets row by row; the k-th order statistic against
brute force and against the seeds' np.quantile formula; a coverage check over 200 random splits."""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections import Counter, defaultdict
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

from equipoise.evaluators.metrics import compute, conformal
from equipoise.evaluators.metrics.conformal import _split_hashes_expr, conformal_k
from equipoise.evaluators.metrics.registry import prepare, temp_tables, uses_facts
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.conftest import with_facts
from tests.scores import edit_option_scores

BY = ("model", "config")


# ----------------------------------------------------------------------------------------------------
# reference implementation


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


_MASK = 2**64 - 1


@functools.cache
def _split_hash(seed: int, rep: int, ukey: str) -> int:
    """The documented split stream, written out independently: SplitMix64 seeded with the first 16 hex
    digits of md5('<seed>:<unit key>'), output number rep + 1 (state advanced rep + 1 times by the
    golden-ratio gamma, then the two xor-shift-multiply rounds and a final xor-shift)."""
    state = int(_md5(f"{seed}:{ukey}")[:16], 16)
    state = (state + (rep + 1) * 0x9E3779B97F4A7C15) % 2**64
    z = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
    return z ^ (z >> 31)


def _u(seed: int, item_id: str, option_id: str) -> float:
    return (int(_md5(f"{seed}:aps:{item_id}:{option_id}")[:13], 16) + 0.5) / 2.0**52


@functools.cache
def _read(path: str) -> dict[str, pd.DataFrame]:
    """The store's tables, read once per path (stores are not changed after their fixture builds them)."""
    con = duckdb.connect(path, read_only=True)
    out = {
        name: con.execute(f"SELECT * FROM {name}").df()
        for name in ("items", "options", "runs", "predictions", "option_scores")
    }
    con.close()
    return out


def _tables(path) -> dict[str, pd.DataFrame]:
    return _read(str(path))


def _val(v):
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v


def _records(path) -> list[tuple[dict, dict, list[tuple[str, str]]]]:
    """(prediction row, run + item fields, the item's (label, option_id) pairs) per prediction."""
    return _read_records(str(path))


@functools.cache
def _read_records(path: str) -> list[tuple[dict, dict, list[tuple[str, str]]]]:
    t = _read(path)
    runs = {r["run_id"]: r for r in t["runs"].to_dict("records")}
    items = {(r["dataset_id"], r["config"], r["item_id"]): r for r in t["items"].to_dict("records")}
    opts: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for r in t["options"].sort_values(["item_id", "label"]).to_dict("records"):
        opts[(r["dataset_id"], r["config"], r["item_id"])].append((r["label"], r["option_id"]))
    out = []
    for p in t["predictions"].to_dict("records"):
        run = runs[p["run_id"]]
        key = (run["dataset_id"], run["config"], p["item_id"])
        rec = {**items[key], **run, "run_id": p["run_id"]}
        out.append((p, {k: _val(v) for k, v in rec.items()}, opts[key]))
    return out


def option_units(path, score: str, by, strat, seed: int = 0, randomized: bool = False, cov=None, si=0):
    t = _tables(path)
    lp: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in t["option_scores"][t["option_scores"].sample_index == si].to_dict("records"):
        lp[(r["run_id"], r["item_id"])][r["label"]] = r["logprob"]
    units, counts = [], defaultdict(Counter)
    for p, rec, options in _records(path):
        if p["sample_index"] != si:
            continue
        key = tuple(rec[c] for c in by)
        counts[key]["n_items"] += 1
        scored = lp.get((p["run_id"], p["item_id"]))
        if not scored:
            counts[key]["n_unscored"] += 1
            continue
        labels = list(scored)
        raw = np.array([scored[lab] for lab in labels])
        e = np.exp(raw - raw.max())
        prob = dict(zip(labels, e / e.sum(), strict=True))
        pv = np.array([prob.get(lab, 0.0) for lab, _ in options])
        if score == "lac":
            s = 1.0 - pv
        else:
            s = np.array([1.0 - pv[pv < x].sum() for x in pv])
            if randomized:
                u = np.array([_u(seed, p["item_id"], oid) for _, oid in options])
                s = s - (1.0 - u) * pv
        target = [lab for lab, _ in options].index(rec["target_label"])
        counts[key]["n_target_unscored"] += rec["target_label"] not in prob
        units.append(
            {
                "key": key,
                "stratum": tuple(rec[c] for c in strat),
                "ukey": p["item_id"],
                "run_id": p["run_id"],
                "s": s,
                "target": target,
                "cov": rec[cov] if cov else None,
            }
        )
    return units, counts


def sampling_units(path, by, strat, pool: str = "item", cov=None):
    pools: dict[tuple, list] = defaultdict(list)
    for p, rec, options in _records(path):
        ukey = rec["item_id"] if pool == "item" else rec["base_id"]
        key = tuple(rec[c] for c in by)
        uid = (key, tuple(rec[c] for c in strat), p["run_id"], ukey)
        oid = dict(options)
        target = oid[rec["target_label"]]
        chosen = oid.get(p["parsed_label"]) if p["parsed_label"] is not None else None
        pools[uid].append((chosen, target, [o for _, o in options], rec[cov] if cov else None))
    units, counts = [], defaultdict(Counter)
    for (key, stratum, run_id, ukey), rows in pools.items():
        counts[key]["n_pools"] += 1
        targets = {r[1] for r in rows}
        if len(targets) != 1:
            counts[key]["n_target_mismatch"] += 1
            continue
        m = len(rows)  # every sample, unparsed included
        votes = Counter(r[0] for r in rows if r[0] is not None)
        option_ids = sorted({o for r in rows for o in r[2]})
        (target,) = targets
        s = np.array([(m - votes[o]) / m for o in option_ids])  # 1 - f, rounded once
        mv = min(votes, key=lambda o: (-votes[o], o)) if votes else None
        units.append(
            {
                "key": key,
                "stratum": stratum,
                "ukey": ukey,
                "run_id": run_id,
                "s": s,
                "target": option_ids.index(target),
                "m": m,
                "no_option": m - sum(votes.values()),
                "mv_correct": mv == target,
                "hit": any(r[0] == r[1] for r in rows),
                "cov": min(r[3] for r in rows) if cov else None,
            }
        )
    return units, counts


def run_splits(units, alpha=0.1, cal=0.3, repeats=20, seed=0):
    """Per group: for every repeat the calibration scores, k, q_hat and the test units' sets."""
    cal_f = Fraction(str(cal))
    groups: dict[tuple, list] = defaultdict(list)
    for u in units:
        groups[u["key"]].append(u)
    out = {}
    for key, us in groups.items():
        strata = defaultdict(list)
        for u in us:
            strata[u["stratum"]].append(u)
        reps = []
        for rep in range(repeats):
            cal_units, test_units = [], []
            for members in strata.values():
                order = sorted(
                    members,
                    key=lambda u, rep=rep: (_split_hash(seed, rep, u["ukey"]), u["ukey"], u["run_id"]),
                )
                n_cal = math.floor(cal_f * len(order) + Fraction(1, 2))
                cal_units += order[:n_cal]
                test_units += order[n_cal:]
            cal_scores = np.sort([u["s"][u["target"]] for u in cal_units])
            n = len(cal_units)
            k = math.ceil((n + 1) * (1 - Fraction(str(alpha))))
            q = cal_scores[k - 1] if k <= n else None
            sets = []
            for u in test_units:
                size = len(u["s"]) if q is None else int((u["s"] <= q).sum())
                covered = q is None or u["s"][u["target"]] <= q
                sets.append((u, size, covered))
            reps.append({"n": n, "k": k, "q": q, "cal": cal_scores, "sets": sets})
        out[key] = reps
    return out


def summarise(reps) -> dict[str, float]:
    q = [r["q"] for r in reps if r["q"] is not None]
    per = [r for r in reps if r["sets"]]
    size = [np.mean([s for _, s, _ in r["sets"]]) for r in per]
    cov = [np.mean([c for _, _, c in r["sets"]]) for r in per]
    sd = lambda x: float(np.std(x, ddof=1)) if len(x) > 1 else np.nan  # noqa: E731
    return {
        "n_cal": reps[0]["n"],
        "n_test": len(reps[0]["sets"]),
        "k_order": reps[0]["k"],
        "n_full_repeats": sum(r["q"] is None for r in reps),
        "q_hat_mean": float(np.mean(q)) if q else np.nan,
        "q_hat_sd": sd(q),
        "set_size_mean": float(np.mean(size)) if per else np.nan,
        "set_size_sd": sd(size),
        "coverage_mean": float(np.mean(cov)) if per else np.nan,
        "coverage_sd": sd(cov),
        "empty_rate": float(np.mean([np.mean([s == 0 for _, s, _ in r["sets"]]) for r in per]))
        if per
        else np.nan,
    }


def _key(row, by):
    return tuple(_val(row[c]) for c in by)


def _close(got, want, tol=1e-9):
    if want is None or (isinstance(want, float) and np.isnan(want)):
        assert got is None or pd.isna(got)
    else:
        assert got == pytest.approx(want, abs=tol)


# ----------------------------------------------------------------------------------------------------
# stores


def _edge_edits(path) -> None:
    """Unscored items, truncated (unscored) options, unscored targets, exact ties, a fully unscored
    group and a near-certain (all-correct) run, so every edge is exercised against the reference."""
    con = duckdb.connect(str(path))
    num = "CAST(split_part(split_part(item_id, ':', 1), '-', 2) AS INTEGER)"
    runs = dict(con.execute("SELECT model || '/' || config, run_id FROM runs").fetchall())
    # the all-correct run keeps every score: an unscored target there would score 1 and, at a rate above
    # alpha, push q_hat to 1 (full sets), which is right but not the edge that run is for
    keep = f"run_id <> '{runs['model-b/k3_gold']}'"
    edit_option_scores(
        con,
        f"DELETE FROM option_scores WHERE {num} % 29 = 0 AND {keep}",  # items without any score
        f"DELETE FROM option_scores WHERE {num} % 11 = 1 AND label = 'D' AND {keep}",  # top-k cut
        # the target itself unscored
        f"""DELETE FROM option_scores os USING items i
            WHERE i.item_id = os.item_id AND {num.replace("item_id", "os.item_id")} % 13 = 2
              AND os.label = i.target_label AND os.{keep}""",
        f"UPDATE option_scores SET logprob = -1.25 WHERE {num} % 7 = 3 AND label IN ('A', 'B')",
        ("DELETE FROM option_scores WHERE run_id = ?", [runs["model-a/k3_na"]]),  # empty group
        # all-correct run: the target certain, identical scores on every item (ties at q_hat)
        (
            """UPDATE option_scores os
               SET logprob = CASE WHEN os.label = i.target_label THEN 0.0 ELSE -20.0 END
               FROM items i WHERE i.item_id = os.item_id AND os.run_id = ?""",
            [runs["model-b/k3_gold"]],
        ),
    )
    con.execute(
        """UPDATE predictions p SET parsed_label = i.target_label, outcome = 'answered'
           FROM items i WHERE i.item_id = p.item_id AND p.run_id = ?""",
        [runs["model-b/k3_gold"]],
    )
    con.close()


@pytest.fixture(scope="module", params=[(0, False), (1, True)], ids=["plain", "edges"])
def store(request, tmp_path_factory):
    seed, edges = request.param
    path = tmp_path_factory.mktemp("conf") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=240, samples=1, seed=seed, unparsed_rate=0.05))
    if edges:
        _edge_edits(path)
    return path


@pytest.fixture(scope="module", params=[2, 3])
def sample_store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("confs") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=160, samples=10, seed=request.param, unparsed_rate=0.1))
    if request.param == 3:
        con = duckdb.connect(str(path))
        num = "CAST(split_part(split_part(item_id, ':', 1), '-', 2) AS INTEGER)"
        # some items never parsed (no vote at all), some where exact ties decide the majority vote
        con.execute(f"UPDATE predictions SET parsed_label = NULL, outcome = 'unparsed' WHERE {num} % 17 = 0")
        con.execute(
            f"""UPDATE predictions SET parsed_label = CASE WHEN sample_index < 5 THEN 'C' ELSE 'B' END,
                   outcome = 'answered' WHERE {num} % 19 = 1"""
        )
        con.close()
    return path


def _compute(path, name, by=BY, **params):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return compute(con, name, list(by), params)
    finally:
        con.close()


COLS = (
    "n_cal",
    "n_test",
    "k_order",
    "n_full_repeats",
    "q_hat_mean",
    "q_hat_sd",
    "set_size_mean",
    "set_size_sd",
    "coverage_mean",
    "coverage_sd",
    "empty_rate",
)


# ----------------------------------------------------------------------------------------------------
# the threshold


@pytest.mark.parametrize("alpha", [0.1, 0.05, 0.2, 0.059, 0.172, Fraction(1, 3), "1/7"])
def test_k_is_exact_integer_ceiling(alpha):
    a = Fraction(alpha) if not isinstance(alpha, float) else Fraction(str(alpha))
    for n in range(0, 150):
        want = next(j for j in range(n + 2) if j >= (n + 1) * (1 - a))  # brute force: smallest such j
        assert conformal_k(n, alpha) == want
    for n in [*range(150, 2000), 10**6 - 1, 10**9 + 7]:
        # the defining property of the smallest such j, in exact rationals (a scan is too slow here)
        k = conformal_k(n, alpha)
        assert k >= (n + 1) * (1 - a) > k - 1
    assert conformal_k(99, 0.1) == 90  # (n+1)(1-alpha) = 90 exactly
    assert conformal_k(100, 0.1) == 91


def test_float_alpha_is_read_as_the_fraction_it_stands_for():
    # 1/3 as a float is 0.3333333333333333; read as that decimal, (2 + 1)(1 - alpha) would exceed 2
    assert conformal_k(2, 1 / 3) == conformal_k(2, Fraction(1, 3)) == 2
    assert conformal_k(2, "0.3333333333333333") == 3
    # a float that is not near a simple fraction keeps its decimal value: 1 - alpha = 8765433/10**7
    assert conformal_k(10**7 - 1, 0.1234567) == 8765433
    assert conformal_k(10**7 - 2, 0.1234567) == 8765433
    with pytest.raises(ValueError, match="alpha"):
        conformal_k(10, "ten percent")
    with pytest.raises(ValueError, match="alpha"):
        conformal_k(10, True)


def test_float_ceiling_can_be_wrong():
    # the product in floating point lands just above an integer: ceil gives one too many
    assert math.ceil((999 + 1) * (1 - 0.059)) == 942
    assert conformal_k(999, 0.059) == 941
    assert math.ceil((249 + 1) * (1 - 0.172)) == 208
    assert conformal_k(249, 0.172) == 207


@pytest.mark.parametrize("n", [9, 10, 11, 20, 50, 99, 100, 101, 250, 999])
def test_seed_quantile_formula_is_the_next_order_statistic(n):
    """The seeds' code, np.quantile(s, ceil((n+1)(1-alpha))/n, method='higher'), returns the
    (k+1)-th smallest score (index k), not the k-th (index k-1) that split conformal needs, whenever
    k < n. When k = n (n = 10, alpha = 0.1: k = ceil(9.9) = 10) its level is 1 and both give the
    maximum."""
    s = np.random.default_rng(n).random(n)  # distinct scores: neighbouring order statistics differ
    k = conformal_k(n, 0.1)
    assert k == math.ceil((n + 1) * (1 - 0.1))  # for these n the float ceiling happens to be right
    seeds = np.quantile(s, math.ceil((n + 1) * (1 - 0.1)) / n, method="higher")
    order = np.sort(s)
    if k == n:
        assert seeds == order[k - 1] == order.max()
    else:
        assert k < n
        assert seeds == order[k] and seeds != order[k - 1]


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("confq") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=400, samples=1, seed=7, configs=(("k3_gold", True),)))
    return path


@pytest.mark.parametrize("score", ["lac", "aps"])
def test_q_hat_is_kth_order_statistic(big_store, score):
    units, _ = option_units(big_store, score, BY, ())
    n_differ = 0  # calibrations where the seeds' order statistic is a different value from q_hat
    for n in (8, 9, 10, 19, 89, 99, 100, 399):
        got = _compute(
            big_store, f"conformal_{score}", alpha=0.1, cal_fraction=Fraction(n, 400), repeats=2, stratify=()
        )
        ref = run_splits(units, cal=Fraction(n, 400), repeats=2)
        for _, row in got.iterrows():
            reps = ref[_key(row, BY)]
            assert row.n_cal == n
            k = conformal_k(n, 0.1)
            assert row.k_order == k
            if k > n:  # n < 9: full sets, no threshold
                assert row.n_full_repeats == 2 and pd.isna(row.q_hat_mean)
                assert row.set_size_mean == 4 and row.coverage_mean == 1
                continue
            qs = []
            for r in reps:
                brute = sorted(r["cal"].tolist())[k - 1]
                assert r["q"] == brute
                seeds = np.quantile(r["cal"], math.ceil((n + 1) * 0.9) / n, method="higher")
                if k < n:  # the seeds' formula picks the next order statistic ...
                    assert seeds == sorted(r["cal"].tolist())[k]
                    # ... a different value unless the two tie (APS: every target that is the least
                    # likely option scores exactly 1)
                    n_differ += bool(seeds != brute)
                else:
                    assert seeds == brute
                qs.append(brute)
            assert row.q_hat_mean == pytest.approx(np.mean(qs), abs=1e-12)
    assert n_differ >= 5


def test_full_sets_when_k_exceeds_n(tmp_path):
    path = tmp_path / "tiny.duckdb"
    make_store(path, SyntheticSpec(n_items=8, samples=3, seed=4))
    for name in ("conformal_lac", "conformal_aps", "conformal_sampling"):
        got = _compute(path, name, repeats=3)
        # 8 items: n_cal = round(2.4) = 2, k = ceil(3 * 0.9) = 3 > 2
        assert (got.n_cal == 2).all() and (got.k_order == 3).all() and (got.n_full_repeats == 3).all()
        assert got.q_hat_mean.isna().all()
        assert (got.set_size_mean == 4).all() and (got.coverage_mean == 1).all()


# ----------------------------------------------------------------------------------------------------
# the metrics against the reference


@pytest.mark.parametrize(
    ("score", "randomized"), [("lac", False), ("aps", False), ("aps", True)], ids=["lac", "aps", "aps_rand"]
)
@pytest.mark.parametrize(
    ("by", "strat"),
    [(BY, ("target_role",)), (("model",), ("target_role",)), (("model", "specialty"), ("has_gold", "k"))],
    ids=["model_config", "model", "specialty"],
)
def test_option_metrics_match_reference(store, score, randomized, by, strat):
    seed, repeats = 5, 6
    params = {"repeats": repeats, "seed": seed, "stratify": strat}
    if score == "aps":
        params["aps_randomized"] = randomized
    got = _compute(store, f"conformal_{score}", by, **params)
    units, counts = option_units(store, score, by, strat, seed=seed, randomized=randomized)
    ref = run_splits(units, repeats=repeats, seed=seed)
    assert len(got) == len(counts)
    for _, row in got.iterrows():
        key = _key(row, by)
        c = counts[key]
        assert row.n_items == c["n_items"] and row.n_unscored == c["n_unscored"]
        assert row.n_scored == c["n_items"] - c["n_unscored"]
        assert row.n_target_unscored == c["n_target_unscored"]
        if key not in ref:  # a group whose items all lack option scores
            assert row.n_cal == 0 and row.n_test == 0 and pd.isna(row.coverage_mean)
            continue
        want = summarise(ref[key])
        for col in COLS:
            _close(row[col], want[col])


def test_edge_store_exercises_the_edges(store):
    got = _compute(store, "conformal_lac", repeats=2).set_index(list(BY))
    if got.n_unscored.sum() == 0:
        return  # the plain store
    assert got.loc[("model-a", "k3_na")].n_scored == 0
    assert got.n_target_unscored.sum() > 0
    certain = got.loc[("model-b", "k3_gold")]
    # every target scores the same: all tie at q_hat, all covered, singletons
    assert certain.coverage_mean == 1 and certain.set_size_mean == 1


def test_aps_randomization_is_shared_between_calibration_and_test(store):
    """U depends on (seed, item, option) only: the same for every repeat and model, different seeds
    give different sets, and with U = 1 (not randomised) the scores are the plain APS scores."""
    a = _compute(store, "conformal_aps", aps_randomized=True, repeats=3, seed=1)
    b = _compute(store, "conformal_aps", aps_randomized=True, repeats=3, seed=1)
    pd.testing.assert_frame_equal(a, b)
    plain = _compute(store, "conformal_aps", aps_randomized=False, repeats=3, seed=1)
    ok = plain.q_hat_mean.notna()
    assert (a.q_hat_mean[ok] <= plain.q_hat_mean[ok] + 1e-12).all()  # randomising only lowers scores


@pytest.mark.parametrize("pool", ["item", "base"])
def test_sampling_matches_reference(sample_store, pool, tmp_path):
    path = sample_store
    if pool == "base":
        # pool pairs of items into one base question, as option-shuffled copies: option identity is
        # the position relative to the target, so the pair agrees on identities and on the target;
        # every 9th pair keeps its own ids and so disagrees on the target (counted, not used)
        path = tmp_path / "base.duckdb"
        con = duckdb.connect(str(sample_store))
        con.execute(f"EXPORT DATABASE '{tmp_path / 'dump'}'")
        con.close()
        con = duckdb.connect(str(path))
        con.execute(f"IMPORT DATABASE '{tmp_path / 'dump'}'")
        num = "CAST(split_part(split_part(item_id, ':', 1), '-', 2) AS INTEGER)"
        con.execute(f"UPDATE items SET base_id = 'b' || ({num} // 2)")
        con.execute(
            f"""UPDATE options o SET option_id = 'rel' || ((ascii(o.label) - ascii(i.target_label) + 4) % 4)
                FROM items i WHERE i.item_id = o.item_id AND i.config = o.config
                  AND ({num.replace("item_id", "i.item_id")} // 2) % 9 <> 0"""
        )
        con.close()
    seed, repeats = 11, 5
    for by, strat in [(BY, ("target_role",)), (("model", "question_type"), ())]:
        got = _compute(path, "conformal_sampling", by, repeats=repeats, seed=seed, stratify=strat, pool=pool)
        units, counts = sampling_units(path, by, strat, pool=pool)
        ref = run_splits(units, repeats=repeats, seed=seed)
        assert len(got) == len(counts)
        if pool == "base":
            assert got.n_target_mismatch.sum() > 0
        for _, row in got.iterrows():
            key = _key(row, by)
            assert row.n_pools == counts[key]["n_pools"]
            assert row.n_target_mismatch == counts[key]["n_target_mismatch"]
            us = [u for u in units if u["key"] == key]
            assert row.n_units == len(us)
            assert row.m_min == min(u["m"] for u in us) and row.m_max == max(u["m"] for u in us)
            assert row.n_samples_no_option == sum(u["no_option"] for u in us)
            _close(row.mv_accuracy, np.mean([u["mv_correct"] for u in us]))
            _close(row.hit_rate, np.mean([u["hit"] for u in us]))
            reps = ref[key]
            _close(
                row.mv_accuracy_test,
                np.mean([np.mean([u["mv_correct"] for u, _, _ in r["sets"]]) for r in reps]),
            )
            _close(row.hit_rate_test, np.mean([np.mean([u["hit"] for u, _, _ in r["sets"]]) for r in reps]))
            want = summarise(reps)
            for col in COLS:
                _close(row[col], want[col])


def test_unparsed_samples_dilute_frequencies(tmp_path):
    """M counts unparsed samples: 10 samples, 3 unparsed and 7 on the target give f = 7/10, and the
    score 1 - f = 3/10 is the double nearest 3/10 (0.3), not 1 - 0.7 = 0.30000000000000004."""
    path = tmp_path / "u.duckdb"
    make_store(path, SyntheticSpec(n_items=40, samples=10, seed=9, configs=(("k3_gold", True),)))
    con = duckdb.connect(str(path))
    con.execute(
        """UPDATE predictions p
           SET parsed_label = CASE WHEN p.sample_index < 3 THEN NULL ELSE i.target_label END,
               outcome = CASE WHEN p.sample_index < 3 THEN 'unparsed' ELSE 'answered' END
           FROM items i WHERE i.item_id = p.item_id"""
    )
    con.close()
    got = _compute(path, "conformal_sampling", repeats=2)
    assert 1 - 0.7 != 0.3  # the two-rounding value the score must not take
    assert got.q_hat_mean.tolist() == [0.3, 0.3] and got.q_hat_sd.tolist() == [0.0, 0.0]
    assert (got.set_size_mean == 1).all() and (got.coverage_mean == 1).all()
    assert (got.mv_accuracy == 1).all() and (got.n_samples_no_option == 120).all()


def _check_coverage_by(path, score: str) -> None:
    seed, repeats, cov = 3, 4, "specialty"
    got = _compute(
        path, "conformal_coverage_by", BY, score=score, coverage_by=cov, repeats=repeats, seed=seed
    )
    if score == "sampling":
        units, _ = sampling_units(path, BY, ("target_role",), cov=cov)
    else:
        units, _ = option_units(path, score, BY, ("target_role",), seed=seed, cov=cov)
    ref = run_splits(units, repeats=repeats, seed=seed)
    want: dict[tuple, list] = defaultdict(list)
    for key, reps in ref.items():
        for rep, r in enumerate(reps):
            for u, size, covered in r["sets"]:
                want[(*key, u["cov"])].append((rep, size, covered))
    assert len(got) == len(want)
    for _, row in got.iterrows():
        rows = want[(*_key(row, BY), row[cov])]
        assert row.n_test_mean == pytest.approx(len(rows) / repeats, abs=1e-12)
        assert row.repeats_with_test == len({r for r, _, _ in rows})
        _close(row.coverage, np.mean([c for _, _, c in rows]))
        _close(row.set_size_mean, np.mean([s for _, s, _ in rows]))


@pytest.mark.parametrize("score", ["lac", "aps"])
def test_coverage_by_matches_reference(store, score):
    _check_coverage_by(store, score)


def test_coverage_by_sampling_matches_reference(sample_store):
    _check_coverage_by(sample_store, "sampling")


@pytest.mark.parametrize(("sd", "pad"), [(0, 0), (0.5, -3), (1, 1)], ids=["empty", "narrow", "tight"])
def test_cutoff_window_misses_fall_back_to_the_same_splits(
    store, sample_store, big_store, monkeypatch, sd, pad
):
    """The hash window searched for a stratum's cutoff is only a guess about where the n_cal-th
    smallest key lies: where it misses, the SQL widens it (lo = 0 or no upper bound). An empty window
    (lo = hi: the counts below both ends are equal, so one of the two checks fails in every stratum
    and repeat) and narrow ones take that path; the splits must still be the reference's. The same
    knobs size the band floor of q_hat's heaps, whose misses (rebuilt from every unit) this also
    exercises."""
    default = _compute(big_store, "conformal_lac", repeats=7, seed=4)
    monkeypatch.setattr(conformal, "WINDOW_SD", sd)
    monkeypatch.setattr(conformal, "WINDOW_PAD", pad)
    pd.testing.assert_frame_equal(_compute(big_store, "conformal_lac", repeats=7, seed=4), default)
    test_option_metrics_match_reference(store, "lac", False, BY, ("target_role",))
    _check_coverage_by(store, "aps")
    _check_coverage_by(sample_store, "sampling")


# ----------------------------------------------------------------------------------------------------
# validity: coverage >= 1 - alpha on exchangeable data


@pytest.fixture(scope="module")
def coverage_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("confc") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=300, samples=8, seed=21))
    return path


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("conformal_lac", {}),
        ("conformal_aps", {}),
        ("conformal_aps", {"aps_randomized": True}),
        ("conformal_sampling", {}),
    ],
    ids=["lac", "aps", "aps_rand", "sampling"],
)
def test_mean_coverage_over_200_splits(coverage_store, name, params):
    repeats = 200
    got = _compute(coverage_store, name, repeats=repeats, seed=123, **params)
    assert len(got) == 4 and (got.n_full_repeats == 0).all()
    se = got.coverage_sd / math.sqrt(repeats)
    assert (got.coverage_mean >= 0.9 - 3 * se).all(), got[["coverage_mean", "coverage_sd"]]
    # and not trivially: sets are not always the full option set
    assert (got.set_size_mean < 4).any()


# ----------------------------------------------------------------------------------------------------
# parameters


def test_bad_parameters_are_refused(store):
    with pytest.raises(ValueError, match="alpha"):
        _compute(store, "conformal_lac", alpha=1.5)
    with pytest.raises(ValueError, match="cal_fraction"):
        _compute(store, "conformal_lac", cal_fraction=0)
    with pytest.raises(ValueError, match="stratify"):
        _compute(store, "conformal_lac", stratify=("raw_output; DROP TABLE runs",))
    with pytest.raises(ValueError, match="repeats"):
        _compute(store, "conformal_aps", repeats=0)
    with pytest.raises(ValueError, match="seed"):
        _compute(store, "conformal_aps", seed="1; DROP TABLE runs")
    with pytest.raises(ValueError, match="pool"):
        _compute(store, "conformal_sampling", pool="run")
    with pytest.raises(ValueError, match="score"):
        _compute(store, "conformal_coverage_by", score="raps")
    with pytest.raises(ValueError, match="grouping"):
        _compute(store, "conformal_coverage_by", ("model", "specialty"), coverage_by="specialty")
    with pytest.raises(KeyError, match="cannot group by"):
        _compute(store, "conformal_lac", ("bogus",))


def test_grouping_by_nothing_and_any_stratum(store):
    whole = _compute(store, "conformal_lac", (), repeats=2)
    assert len(whole) == 1 and whole.n_items.iloc[0] == 4 * 240
    by_k = _compute(store, "conformal_lac", ("k", "framing"), repeats=2)
    assert by_k.n_items.sum() == 4 * 240


# ----------------------------------------------------------------------------------------------------
# how the split is computed (the definition is the SplitMix64 order; these pin the stream itself)


def test_split_hashes_follow_the_documented_stream():
    """The SQL list of split hashes of a unit key is SplitMix64 seeded from md5('<seed>:<key>'), element
    r = output r + 1, for any seed and key (also keys whose products overflow 64 bits: all of them)."""
    keys = [f"it-{i:07d}:k3_gold" for i in range(60)] + ["", "ü:é", "base-17"]
    con = duckdb.connect()
    sql = (
        f"SELECT seed, ukey, {_split_hashes_expr(25)} AS hs FROM (SELECT seed, ukey, "
        "('0x' || substr(md5(seed::VARCHAR || ':' || ukey), 1, 16))::UBIGINT AS kb "
        "FROM unnest(?) t(ukey), (VALUES (0), (17)) s(seed))"
    )
    rows = con.execute(sql, [keys]).fetchall()
    con.close()
    assert len(rows) == 2 * len(keys)
    for seed, ukey, hs in rows:
        assert hs == [_split_hash(seed, rep, ukey) for rep in range(25)]
    # the stream is not degenerate: distinct keys and repeats give distinct hashes
    assert len({h for _, _, hs in rows for h in hs}) == 25 * 2 * len(keys)


@pytest.mark.parametrize("score", ["lac", "aps"])
def test_same_unit_key_in_several_runs_is_ordered_by_run_id(store, score):
    """Grouped by nothing, the runs of both models hold the same item ids: their split hashes tie and
    run_id decides, also where the calibration cutoff falls between two runs of one item."""
    seed, repeats = 8, 6
    got = _compute(store, f"conformal_{score}", (), repeats=repeats, seed=seed)
    units, _ = option_units(store, score, (), ("target_role",), seed=seed)
    assert len({(u["ukey"], u["stratum"]) for u in units}) < len(units)  # shared keys do occur
    want = summarise(run_splits(units, repeats=repeats, seed=seed)[()])
    assert len(got) == 1
    for col in COLS:
        _close(got.iloc[0][col], want[col])


@pytest.mark.parametrize("name", ["conformal_lac", "conformal_aps", "conformal_sampling"])
def test_reruns_give_identical_doubles(store, name):
    """Means and sds over repeats are summed in repeat order (not in a parallel hash aggregate's order),
    so the same store and parameters give the same bits every time."""
    frames = [_compute(store, name, repeats=40, seed=2) for _ in range(3)]
    for frame in frames[1:]:
        pd.testing.assert_frame_equal(frame, frames[0], check_exact=True)


def test_split_hashes_shared_by_a_materialized_pass_give_the_same_frames(store):
    """A read-only pass with materialized base relations reads the split hashes from a TEMP table of
    every key of `scored`, shared by the conformal metrics; the frames equal the inline query's."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        for name, params in (
            ("conformal_lac", {"seed": 3, "repeats": 7}),
            ("conformal_aps", {"seed": 3, "repeats": 7}),
            ("conformal_sampling", {"seed": 3, "repeats": 7, "pool": "base"}),
            ("conformal_coverage_by", {"seed": 3, "repeats": 7}),
        ):
            shared = compute(con, name, list(BY), params)
            inline = _compute(store, name, BY, **params)
            pd.testing.assert_frame_equal(shared, inline, check_exact=True)
        tables = {
            r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()
        }
        assert {"_conf_split_keys_item_id_3_7", "_conf_split_keys_base_id_3_7"} <= tables
    finally:
        con.close()


def test_more_than_64_repeats_use_several_mask_words(store, sample_store):
    """70 repeats need two 64-bit mask words per unit (repeats 64..69 in the second): the metrics still
    match the reference, through the inline mask and through the connection's shared mask table."""
    seed, repeats = 9, 70
    got = _compute(store, "conformal_lac", repeats=repeats, seed=seed)
    units, counts = option_units(store, "lac", BY, ("target_role",), seed=seed)
    ref = run_splits(units, repeats=repeats, seed=seed)
    assert len(got) == len(counts)
    for _, row in got.iterrows():
        key = _key(row, BY)
        if key not in ref:
            assert row.n_cal == 0 and pd.isna(row.coverage_mean)
            continue
        want = summarise(ref[key])
        for col in COLS:
            _close(row[col], want[col])
    units, _ = sampling_units(sample_store, BY, ("target_role",), pool="item")
    ref = run_splits(units, repeats=repeats, seed=seed)
    got = _compute(sample_store, "conformal_sampling", repeats=repeats, seed=seed)
    for _, row in got.iterrows():
        want = summarise(ref[_key(row, BY)])
        for col in COLS:
            _close(row[col], want[col])
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        for name in ("conformal_lac", "conformal_coverage_by"):
            shared = compute(con, name, list(BY), {"seed": seed, "repeats": repeats})
            pd.testing.assert_frame_equal(
                shared, _compute(store, name, BY, seed=seed, repeats=repeats), check_exact=True
            )
    finally:
        con.close()


def test_mask_table_name_changes_exactly_when_its_query_does(big_store):
    """The shared mask table is named by its parameters, not by a hash of its query (so a lookup
    does not render it): two parameter sets get one name exactly when they render the same query.
    alpha changes the thresholds but not the split, so it must share the mask."""
    from equipoise.evaluators.metrics.registry import REGISTRY

    base = dict(REGISTRY["conformal_lac"].params)
    variants = [
        ({}, ("model", "config")),
        ({"alpha": 0.2}, ("model", "config")),
        ({"seed": 1}, ("model", "config")),
        ({"repeats": 7}, ("model", "config")),
        ({"cal_fraction": 0.5}, ("model", "config")),
        ({"stratify": ["has_gold"]}, ("model", "config")),
        ({"sample_index": 1}, ("model", "config")),
        ({}, ("model",)),
    ]
    con = duckdb.connect(str(big_store), read_only=True)
    try:
        prepare(con, materialize=True)
        seen = []
        for change, by in variants:
            values = conformal._common(list(by), {**base, **change})
            seen.append((conformal._mask_table_name(con, values), conformal._option_mask_query(con, values)))
    finally:
        con.close()
    for (name_a, query_a), (name_b, query_b) in itertools.combinations(seen, 2):
        assert (name_a == name_b) == (query_a == query_b)
    assert seen[0][0] == seen[1][0]  # alpha: the same mask
    assert len({name for name, _ in seen}) == len(variants) - 1


@pytest.mark.parametrize("cov", ["specialty", "k", "has_gold", "difficulty"])
def test_coverage_by_integer_codes_give_the_inline_frames(store, cov):
    """A materialized pass gives coverage_by's units the integer code of the reported column
    (``conformal.COV_KEYS``) and decodes it in the summary: the frame (values, NULLs, dtypes and
    row order) equals the inline query's, which carries the column itself, for string, integer and
    boolean columns."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        params = {"seed": 5, "repeats": 6, "coverage_by": cov}
        shared = compute(con, "conformal_coverage_by", list(BY), params)
        inline = _compute(store, "conformal_coverage_by", BY, **params)
        assert len(shared) > 0
        pd.testing.assert_frame_equal(shared, inline, check_exact=True)
    finally:
        con.close()


def test_coverage_by_codes_are_per_column_and_sample(store):
    """The integer codes of coverage_by's column are a TEMP table of the connection
    (``conformal._cov_keys_table``), named by the column and the sample: one connection reporting
    by several columns and samples in turn (each column's codes computed once, then read) gives the
    inline frame every time, and each column and sample has its own table."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        runs = [("specialty", 0), ("difficulty", 0), ("specialty", 1), ("k", 0), ("specialty", 0)]
        for cov, sample in runs:
            params = {"seed": 5, "repeats": 6, "coverage_by": cov, "sample_index": sample}
            shared = compute(con, "conformal_coverage_by", list(BY), params)
            inline = _compute(store, "conformal_coverage_by", BY, **params)
            assert len(shared) > 0 or sample > 0  # a later sample may have no option scores
            pd.testing.assert_frame_equal(shared, inline, check_exact=True)
        tables = {t for t in temp_tables(con) if t.startswith("_conf_cov_keys_")}
        assert len(tables) == len(set(runs))
    finally:
        con.close()


def test_lac_from_coverage_by_sums_over_the_facts_equals_the_views(store, tmp_path, request):
    """Over the store's facts, conformal_lac after coverage_by reads its thresholds and test sums
    from the connection's tables and counts n_target_unscored from the flags of the shared mask
    table (no score lists joined): every frame equals the plain views', the edge store's unscored
    targets included."""
    facts_path = with_facts(store, tmp_path / "f.duckdb")
    con = duckdb.connect(str(facts_path), read_only=True)
    try:
        prepare(con, materialize=True)
        assert uses_facts(con)
        for name in ("conformal_aps", "conformal_coverage_by", "conformal_lac"):
            shared = compute(con, name, list(BY), {"seed": 4, "repeats": 9})
            inline = _compute(store, name, BY, seed=4, repeats=9)
            assert len(shared) > 0
            pd.testing.assert_frame_equal(shared, inline, check_exact=True)
        assert any(t.startswith("_conf_trep_") for t in temp_tables(con))  # LAC read the kept sums
        edges = request.node.callspec.params["store"][1]
        assert (shared["n_target_unscored"].sum() > 0) == edges
    finally:
        con.close()


def test_unreferenced_ctes_are_dropped_and_the_rest_kept_verbatim():
    """``conformal._referenced_ctes`` keeps the CTEs the final statement reaches (through other CTEs),
    in order and with their comments, and reads names and parentheses from code only: a name in a
    comment or string literal is no reference, a parenthesis there does not end a CTE."""
    sql = (
        "WITH a AS (SELECT 1 AS x),\n"
        "-- b: never read (\n"
        "b AS (SELECT x FROM a WHERE 'c)' <> 'd'),\n"
        "-- c reads a\n"
        "c AS MATERIALIZED (SELECT x + 1 AS x FROM a),\n"
        "d AS (SELECT 'b' AS s, x FROM c)\n"
        "SELECT s, x FROM d -- not b\n"
    )
    got = conformal._referenced_ctes(sql)
    assert got == (
        "WITH a AS (SELECT 1 AS x),\n"
        "-- c reads a\n"
        "c AS MATERIALIZED (SELECT x + 1 AS x FROM a),\n"
        "d AS (SELECT 'b' AS s, x FROM c)\n"
        "SELECT s, x FROM d -- not b\n"
    )
    con = duckdb.connect()
    assert con.execute(got).fetchall() == con.execute(sql).fetchall() == [("b", 2)]
    assert conformal._referenced_ctes("SELECT 1") == "SELECT 1"
    # names in any case; nothing referenced leaves the bare statement
    upper = "WITH A AS (SELECT 1 AS x),\nb AS (SELECT 2 AS x)\nSELECT x FROM a"
    assert conformal._referenced_ctes(upper) == "WITH A AS (SELECT 1 AS x)\nSELECT x FROM a"
    assert conformal._referenced_ctes("WITH a AS (SELECT 1 AS x)\nSELECT 2 AS y") == "SELECT 2 AS y"
    # what the scan cannot read with certainty is returned as it is: a head with a column list, a
    # block comment, a quoted identifier, a head-like line in the final statement
    for odd in (
        "WITH a AS (SELECT 1 AS x),\nb(y) AS (SELECT x FROM a),\nc AS (SELECT 3 AS z)\nSELECT y FROM b",
        "WITH a AS (SELECT 1 AS x /* ) */),\nb AS (SELECT 2 AS x)\nSELECT x FROM a",
        'WITH a AS (SELECT 1 AS ")"),\nb AS (SELECT 2 AS x)\nSELECT * FROM a',
        "WITH a AS (SELECT 1 AS x),\nb AS (SELECT 2 AS x)\n"
        "SELECT sum(x) OVER w FROM a WINDOW\nw AS (ORDER BY x)",
    ):
        assert conformal._referenced_ctes(odd) == odd
        assert con.execute(odd).fetchall()  # valid SQL, unchanged
