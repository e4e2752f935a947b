"""Rows per second into the store: the full `import` path, and the raw insert with and without
the resume bookkeeping (store.insert_table: stage, anti-join, append), measured in one run.

    python benchmarks/import_bench.py --rows 1000000 [--format parquet]

1. builds a synthetic store holding only items and options (no predictions);
2. writes ``--rows`` prediction records as JSONL in the documented import format (not timed), and
   with ``--format parquet`` the same records as one Parquet file (``option_logprobs`` a struct);
3. times ``import_predictions`` end to end (Arrow JSON parsing, the columnar checks, item/label
   checks, one transaction for predictions + option scores; option scores are 4 rows per record);
4. times the store write alone on the same prediction rows as an Arrow table: into the real
   ``predictions`` table through ``store.insert_table`` (schema v2: no index; stage, anti-join,
   append: what makes resume idempotent) vs a plain INSERT into a copy of the table, so the cost
   of the bookkeeping is visible;
5. times the JSONL parse alone (the importer's Arrow read of the file, no store work), so the
   parse / store split of the import is visible.

Each timed step also reports its CPU seconds (user + system, all threads): on a shared machine
wall time swings with other jobs, CPU time much less. Peak RSS is reported twice: for the whole
run (dominated by building the synthetic store, not by the import) and for the import alone
(Linux: the high-water mark is reset just before it through /proc/self/clear_refs; elsewhere the
import figure is the whole-run one). The import's line also says how much CPU time the host
stole and other processes used while it ran (/proc/stat), which tells a slow machine from a
slower import.
Prints a table and writes benchmarks/results/import.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from procstats import cpu_s, machine_cpu_s, machine_delta, peak_mib, reset_peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="file format imported")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/import.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary store and files (printed)")
    args = ap.parse_args()
    from equipoise.builders.prompts import decision_template
    from equipoise.evaluators.importer import import_predictions
    from equipoise.evaluators.store import connect, insert_table, scalar
    from equipoise.evaluators.synthetic import SyntheticSpec, make_store

    n_items = args.rows // 2  # two configs, one sample each
    tmp = Path(tempfile.mkdtemp(prefix="eq-import-"))
    store = tmp / "store.duckdb"
    make_store(store, SyntheticSpec(n_items=n_items, models=(), samples=1, seed=7))
    con = connect(store)
    (did,) = con.execute("SELECT DISTINCT dataset_id FROM datasets").fetchall()[0]
    configs = [r[0] for r in con.execute("SELECT DISTINCT config FROM datasets ORDER BY 1").fetchall()]
    tpl = decision_template("base", "mcq")
    tpl_id, tpl_sha = tpl.id, tpl.sha256  # the hash is computed on access: once, not per record
    rng = np.random.default_rng(0)
    jsonl = tmp / "preds.jsonl"
    t0 = time.perf_counter()
    with jsonl.open("w") as f:
        for cfg in configs:
            letters = rng.choice(list("ABCD"), n_items)
            lp = -rng.gamma(1.0, 1.0, (n_items, 4))
            for i in range(n_items):
                f.write(
                    json.dumps(
                        {
                            "model": "bench-model",
                            "prompt_template_id": tpl_id,
                            "prompt_sha256": tpl_sha,
                            "dataset_id": did,
                            "config": cfg,
                            "item_id": f"it-{i:07d}:{cfg}",
                            "sample_index": 0,
                            "raw_output": f"Answer: {letters[i]}",
                            "parsed_label": str(letters[i]),
                            "option_logprobs": dict(zip("ABCD", lp[i].round(6).tolist(), strict=True)),
                            "n_output_tokens": 3,
                        }
                    )
                    + "\n"
                )
    src = jsonl
    if args.format == "parquet":
        import pyarrow.json
        import pyarrow.parquet as pq

        src = tmp / "preds.parquet"
        pq.write_table(pyarrow.json.read_json(jsonl), src)
    write_s = time.perf_counter() - t0
    rows = 2 * n_items
    setup_peak_mib = peak_mib()
    # where the high-water mark cannot be reset it never falls, so the import's reading below is
    # then already the whole run's so far (setup included), as the docstring says
    reset_peak()
    c0, t0, m0 = cpu_s(), time.perf_counter(), machine_cpu_s()
    res = import_predictions(con, src)
    import_s, import_cpu = time.perf_counter() - t0, cpu_s() - c0
    # what the rest of the machine did during the import: the host's steal, other processes' CPU
    machine = machine_delta(m0, machine_cpu_s(), import_cpu)
    import_peak_mib = peak_mib()
    assert res.added == rows, res
    # raw store write, same rows, with and without the resume bookkeeping
    preds = con.sql("SELECT * FROM predictions").to_arrow_table()
    con.execute("CREATE TABLE predictions_nokey AS SELECT * FROM predictions WHERE false")
    con.execute("DELETE FROM predictions")
    con.register("incoming", preds)
    t0 = time.perf_counter()
    insert_table(con, "predictions", preds)
    keyed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    con.execute("INSERT INTO predictions_nokey SELECT * FROM incoming")
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    insert_table(con, "predictions", preds)  # a resume: all present
    resume_s = time.perf_counter() - t0
    assert scalar(con, "SELECT count(*) FROM predictions") == rows
    con.close()
    # the parse alone: what the importer's columnar path does before any store work
    from equipoise.evaluators.importer import _read_columns

    c0, t0 = cpu_s(), time.perf_counter()
    parsed = _read_columns(src)
    parse_s, parse_cpu = time.perf_counter() - t0, cpu_s() - c0
    assert parsed is not None and parsed[0].num_rows == rows
    del parsed
    run_peak_mib = max(setup_peak_mib, peak_mib())
    out = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "rows": rows,
        "format": args.format,
        "input_mb": src.stat().st_size / 1e6,
        "jsonl_mb": jsonl.stat().st_size / 1e6,
        "jsonl_write_s": write_s,
        "import_s": import_s,
        "import_rows_per_s": rows / import_s,
        "import_cpu_s": import_cpu,
        "parse_s": parse_s,
        "parse_cpu_s": parse_cpu,
        "insert_keyed_s": keyed_s,
        "insert_keyed_rows_per_s": rows / keyed_s,
        "insert_plain_s": plain_s,
        "insert_plain_rows_per_s": rows / plain_s,
        "resume_noop_s": resume_s,
        "peak_rss_mib": run_peak_mib,
        "setup_peak_rss_mib": setup_peak_mib,
        "import_peak_rss_mib": import_peak_mib,
        "loadavg_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "import_machine_steal_s": machine and machine["steal"],
        "import_machine_others_s": machine and machine["others"],
    }
    print(f"{'path':<44} {'seconds':>9} {'rows/s':>12} {'CPU s':>7}")
    label = f"import (parse + validate + insert), {args.format}"
    print(f"{label:<44} {import_s:>9.2f} {rows / import_s:>12,.0f} {import_cpu:>7.2f}")
    label = f"  of which: parse alone (Arrow read), {args.format}"
    print(f"{label:<44} {parse_s:>9.2f} {rows / parse_s:>12,.0f} {parse_cpu:>7.2f}")
    print(f"{'store insert_table (anti-join append)':<44} {keyed_s:>9.2f} {rows / keyed_s:>12,.0f}")
    print(f"{'store insert, no key, plain INSERT':<44} {plain_s:>9.2f} {rows / plain_s:>12,.0f}")
    print(f"{'resume over fully present rows (no-op)':<44} {resume_s:>9.2f} {rows / resume_s:>12,.0f}")
    print(
        f"bookkeeping cost: {keyed_s / plain_s:.2f}x plain insert; peak RSS {run_peak_mib:.0f} MiB "
        f"(import alone {import_peak_mib:.0f} MiB, building the store {setup_peak_mib:.0f} MiB); "
        f"{rows:,} rows, JSONL {out['jsonl_mb']:.0f} MB"
    )
    if machine is not None:
        print(
            f"during the import: steal {machine['steal']:.2f} s, other processes "
            f"{machine['others']:.2f} s (CPU s, all cores)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    if args.keep:
        print(f"kept {tmp}")
    else:  # about 1.5 GB at 1M rows (store, JSONL, Parquet): not left behind in the temp folder
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
