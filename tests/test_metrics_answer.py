"""answer_rates against an independent pandas recount over raw rows; CLI metrics formats."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators.metrics import compute
from equipoise.evaluators.synthetic import SyntheticSpec, make_store


@pytest.fixture(scope="module", params=[0, 1])
def store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("ans") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=300, samples=2, seed=request.param, unparsed_rate=0.05))
    return path


def _raw(path):
    con = duckdb.connect(str(path), read_only=True)
    df = con.execute("""SELECT r.model, r.config, p.outcome, p.parsed_label, i.target_label
                        FROM predictions p JOIN runs r USING (run_id)
                        JOIN items i ON i.config = r.config AND i.item_id = p.item_id""").df()
    con.close()
    return df


def test_answer_rates_match_pandas(store):
    raw = _raw(store)
    raw["correct"] = (raw.parsed_label == raw.target_label).fillna(False).astype(bool)
    con = duckdb.connect(str(store), read_only=True)
    got = compute(con, "answer_rates", ["model", "config"]).set_index(["model", "config"])
    con.close()
    for (model, config), g in raw.groupby(["model", "config"]):
        row = got.loc[(model, config)]
        assert row.n == len(g)
        assert row.accuracy == pytest.approx(g.correct.mean(), abs=1e-12)
        answered = g[g.outcome == "answered"]
        want = answered.correct.mean() if len(answered) else np.nan
        assert row.accuracy_when_answered == pytest.approx(want, abs=1e-12, nan_ok=True)
        assert row.coverage == pytest.approx((g.outcome == "answered").mean(), abs=1e-12)
        assert row.abstention_rate == pytest.approx((g.outcome == "abstained").mean(), abs=1e-12)
        assert row.incorrect_selection_rate == pytest.approx(
            ((g.outcome == "answered") & ~g.correct).mean(), abs=1e-12
        )
        assert row.parse_failure_rate == pytest.approx(
            g.outcome.isin(["unparsed", "error"]).mean(), abs=1e-12
        )
        # every sample is exactly one outcome
        assert row.coverage + row.abstention_rate + row.parse_failure_rate == pytest.approx(1.0)


def test_bad_grouping_is_refused(store):
    con = duckdb.connect(str(store), read_only=True)
    with pytest.raises(KeyError, match="cannot group by"):
        compute(con, "answer_rates", ["raw_output; DROP TABLE runs"])
    con.close()


def test_cli_metrics_formats(store):
    r = CliRunner().invoke(
        app,
        ["metrics", "--store", str(store), "--metric", "answer_rates", "--by", "model", "--format", "json"],
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["answer_rates"]
    assert {x["model"] for x in rows} == {"model-a", "model-b"}
    r = CliRunner().invoke(app, ["metrics", "--store", str(store), "--metric", "nope"])
    assert r.exit_code == 2
    r = CliRunner().invoke(
        app, ["metrics", "--store", str(store), "--metric", "answer_rates", "--by", "bogus"]
    )
    assert r.exit_code == 2 and "cannot group by" in " ".join(r.output.split())


def test_cli_memory_limit_gives_the_same_numbers(store):
    """--memory-limit only moves DuckDB's buffers to disk: every number stays the same, and a
    limit DuckDB cannot read is refused in one line before anything runs."""
    names = ["answer_rates", "ece", "conformal_lac", "unc_auroc"]
    args = ["metrics", "--store", str(store), "--format", "json", "--param", "repeats=3"]
    for n in names:
        args += ["--metric", n]
    free = CliRunner().invoke(app, args)
    capped = CliRunner().invoke(app, [*args, "--memory-limit", "256MB"])
    assert free.exit_code == 0 and capped.exit_code == 0, (free.output, capped.output)
    assert json.loads(free.stdout) == json.loads(capped.stdout)
    bad = CliRunner().invoke(app, [*args, "--memory-limit", "lots"])
    assert bad.exit_code == 2 and "memory limit 'lots'" in " ".join(bad.output.split())


def test_cli_metrics_out_writes_one_parquet_per_metric(store, tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(
        app,
        [
            "metrics",
            "--store",
            str(store),
            "--metric",
            "answer_rates",
            "--metric",
            "unc_scores",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    printed = json.loads(
        CliRunner()
        .invoke(app, ["metrics", "--store", str(store), "--metric", "answer_rates", "--format", "json"])
        .stdout
    )["answer_rates"]
    written = pd.read_parquet(out / "answer_rates.parquet")
    assert len(written) == len(printed) and list(written.columns) == list(printed[0])
    assert written["n"].tolist() == [row["n"] for row in printed]
    assert len(pd.read_parquet(out / "unc_scores.parquet")) > 0 and "unc_scores:" in r.output
