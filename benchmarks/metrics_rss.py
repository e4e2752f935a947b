"""Peak memory of each metric alone: which metrics set the DuckDB path's peak RSS.

    python benchmarks/metrics_rss.py --store STORE [--metrics a,b] [--setting threads=1]

``metrics_bench.py`` measures one process that runs every metric in turn, so its peak (VmHWM) is
that of the worst metric on top of everything the earlier ones left behind (per-connection caches,
memory DuckDB's allocator keeps). To see which metric needs the memory, this runs each metric in a
fresh child process, exactly as ``equipoise metrics --out DIR`` would for that metric alone: open
the store read-only, ``registry.prepare(con, materialize=True)``, ``write_result`` to a Parquet file
in a temporary folder. Each child reports VmHWM after the imports, after ``prepare`` and after the
metric, the metric's wall and CPU seconds, and its rows; the table is sorted by peak. The store is
only read (use a copy anyway when other jobs may write it). Linux only (reads /proc/self/status).
``--setting NAME=VALUE`` runs ``SET NAME = VALUE`` on the connection before ``prepare`` (e.g.
``threads=1``), to measure what a DuckDB setting does to memory; ``memory_limit`` is passed to
``connect`` instead, as ``equipoise metrics --memory-limit`` does, so the pass keeps it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from metrics_bench import _selected
from procstats import cpu_s, peak_mib


def child(store: Path, name: str, settings: list[str], outdir: Path) -> dict[str, Any]:
    """One metric in this (fresh) process; the same imports as metrics_bench's DuckDB child."""
    from equipoise.evaluators.metrics.registry import _load_all, prepare, write_result
    from equipoise.evaluators.store import connect, sql_literal

    _load_all()  # every metric module, as metrics_bench's DuckDB child imports before its clock
    # and nothing more: scipy and scikit-learn are not imported by the metrics since stop 27.
    # Importing them here (as this script did until stop 29) added about 80 MiB to the imports and
    # prepare figures and to any metric that stays under the cap, and lowered the cap by about as
    # much (it leaves room for the memory the process already holds)

    out: dict[str, Any] = {"metric": name, "imports_mib": peak_mib()}
    pairs = [s.split("=", 1) for s in settings]
    for key, _ in pairs:
        if not re.fullmatch(r"[a-z_]+", key):
            raise SystemExit(f"--setting: bad name {key!r}")
    # memory_limit goes through connect, as --memory-limit does: a limit SET afterwards would be
    # taken for the connection's default and lowered to the pass cap (registry.cap_pass_memory)
    limit = next((value for key, value in pairs if key == "memory_limit"), None)
    con = connect(store, read_only=True, memory_limit=limit)
    for key, value in pairs:
        if key != "memory_limit":
            con.execute(f"SET {key} = {sql_literal(value)}")
    prepare(con, materialize=True)
    out["prepare_mib"] = peak_mib()
    t0, c0 = time.perf_counter(), cpu_s()
    out["rows"] = write_result(con, name, outdir / f"{name}.parquet")
    out["seconds"], out["cpu_s"] = time.perf_counter() - t0, cpu_s() - c0
    out["peak_mib"] = peak_mib()
    con.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--metrics", help="comma-separated subset (default: every registered metric)")
    ap.add_argument("--setting", action="append", default=[], help="NAME=VALUE, run as SET before prepare")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.store, args.child, args.setting, args.workdir)))
        return 0

    from equipoise.evaluators.metrics.registry import metric_names

    names = _selected(metric_names(), args.metrics)  # the --metrics rule of metrics_bench.py
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="eq-metrics-rss-") as tmp:
        for name in names:
            cmd = [sys.executable, __file__, "--store", str(args.store), "--child", name, "--workdir", tmp]
            cmd += [f"--setting={s}" for s in args.setting]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr.strip()}", file=sys.stderr)
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    store_mib = args.store.stat().st_size / 2**20
    print(f"store {args.store} ({store_mib:,.0f} MiB); settings: {', '.join(args.setting) or 'defaults'}")
    print(f"{'metric':32s} {'imports':>8s} {'prepare':>8s} {'peak':>8s} {'s':>7s} {'cpu s':>7s} {'rows':>9s}")
    for r in sorted(rows, key=lambda r: r["peak_mib"]):
        print(
            f"{r['metric']:32s} {r['imports_mib']:8,.0f} {r['prepare_mib']:8,.0f} {r['peak_mib']:8,.0f} "
            f"{r['seconds']:7.2f} {r['cpu_s']:7.2f} {r['rows']:9,d}"
        )
    print("MiB are VmHWM after the imports, after prepare and after the metric (each metric alone)")
    if args.out:
        info = {"store_mib": store_mib, "settings": args.setting, "rows": rows}
        args.out.write_text(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
