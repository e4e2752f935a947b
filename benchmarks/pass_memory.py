"""What a memory limit costs a metrics pass: one full pass per run, configurations alternated.

    python benchmarks/pass_memory.py --store STORE [--pairs 6] [--config default --config 2GiB]
                                     [--jemalloc-stats] [--out FILE]

Why: ``registry.cap_pass_memory`` lowers DuckDB's memory_limit for a pass so that its peak RSS
stays below the store file's size (issue 13's target), and at 1M predictions that cap costs a
sixth to a fifth of the pass's wall time (benchmarks/RESULTS.md, stops 28 and 29). The cost is
mostly in the kernel, not in the queries' own work: as traced at stop 29, each time the buffer pool
evicts to stay under the limit, DuckDB 2.0 returns freed memory to the system (an allocator flush),
and the next allocations fault those pages in again. Wall time on a shared machine moves by a
quarter between identical runs, so one run of each setting says nothing; this script runs the
settings in turn, so that a drift of the machine's speed hits all of them alike (A B, then B A, and
so on: neither always goes first), and counts what the kernel did in each run.

A configuration is ``LIMIT`` or ``LIMIT;NAME=VALUE;...``: ``default`` for the pass's own cap, or a
DuckDB size (``2GiB``, ``333MiB``) passed to ``store.connect(memory_limit=)`` as ``equipoise metrics
--memory-limit`` does (the cap then leaves it alone); each ``NAME=VALUE`` is run as ``SET NAME =
VALUE`` after ``prepare`` (e.g. ``block_allocator_memory=256MiB``). A configuration may end in
``|VAR=VALUE&VAR=VALUE...``: environment variables of its child process only, for what DuckDB or
the C library read at start (``default|DUCKDB_JE_MALLOC_CONF=thp:always``,
``default|LD_PRELOAD=/path/shim.so``), or ``default|PYTHONPATH=/other/checkout`` to time another
version of the code against this one (benchmarks/RESULTS.md, stop 30); a SET value cannot hold
``|`` and a variable's value cannot hold ``&`` (either is refused as malformed). Each run is a fresh child
process doing what ``equipoise metrics --out DIR --no-cache`` does (no results cache: every metric
is computed), with the imports of metrics_bench.py's DuckDB child: open the store read-only,
``registry.prepare(materialize=True)``, then every registered metric written by
``pass_runner.run_pass`` in its default lanes. Timed from the open to
the end of the pass; reported per run: wall, user and system CPU (getrusage), minor page faults,
peak RSS (VmHWM, the process's whole life), and the bytes the process read and wrote (rchar /
wchar of /proc/self/io: the store's blocks read again after an eviction and spilled TEMP data are
counted, the page cache included). With ``--jemalloc-stats`` the child also prints DuckDB's jemalloc
statistics at exit (``stats_print:true`` added to ``DUCKDB_JE_MALLOC_CONF``, which DuckDB's bundled
allocator reads at start; a value already set, e.g. ``dirty_decay_ms:-1``, is kept) and the table adds
its dirty-page purges over the process's life: madvise calls and MiB purged (pages of this system's
page size). The load average before and after the runs is printed and kept in ``--out``. The store
is only read. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procstats import peak_mib

JEMALLOC_CONF = "stats_print:true,stats_print_opts:gblxea"  # only the merged arena totals
# the "dirty:" row of jemalloc's merged arena statistics: decay time, npages, sweeps, madvises, purged
_DIRTY = re.compile(r"^\s*dirty:\s+\S+\s+\d+\s+(\d+)\s+(\d+)\s+(\d+)\s*$", re.MULTILINE)


def _assignments(text: str, items: list[str], name_pattern: str, form: str) -> list[tuple[str, str]]:
    """``items`` of configuration ``text`` as (name, value) pairs split at the first ``=``; an item
    without one, or whose name does not match ``name_pattern``, is refused (``form`` says what was
    expected)."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(name_pattern, name):
            raise SystemExit(f"--config {text!r}: {item!r} is not {form}")
        pairs.append((name, value))
    return pairs


def parse_env(text: str) -> dict[str, str]:
    """The environment part of a configuration (after ``|``): ``VAR=VALUE&...`` -> {VAR: VALUE}."""
    if "|" not in text:
        return {}
    items = text.split("|", 1)[1].split("&")
    return dict(_assignments(text, items, r"[A-Za-z_][A-Za-z0-9_]*", "VAR=VALUE"))


def parse_config(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """``LIMIT[;NAME=VALUE...][|VAR=VALUE&...]`` -> (memory limit or None for the pass's own cap,
    SET pairs); the environment part is ``parse_env``'s."""
    limit, *sets = [part.strip() for part in text.split("|", 1)[0].split(";")]
    pairs = [(n.strip(), v.strip()) for n, v in _assignments(text, sets, r"\s*[a-z_]+\s*", "NAME=VALUE")]
    if not limit:
        raise SystemExit(f"--config {text!r}: no limit (use 'default' for the pass's own cap)")
    return (None if limit == "default" else limit), pairs


def _io() -> tuple[int, int]:
    """(rchar, wchar) of this process: bytes read and written through system calls."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def child(store: Path, config: str, outdir: Path) -> dict[str, Any]:
    """One full pass in this (fresh) process, measured; the imports of metrics_bench's DuckDB child."""
    import resource

    from equipoise.evaluators.metrics.pass_runner import run_pass
    from equipoise.evaluators.metrics.registry import metric_names, prepare
    from equipoise.evaluators.store import connect, sql_literal

    names = metric_names()  # imports every metric module before the clock starts
    limit, sets = parse_config(config)
    io0, r0, t0 = _io(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    con = connect(store, read_only=True, memory_limit=limit)
    prepare(con, materialize=True)
    for name, value in sets:
        con.execute(f"SET {name} = {sql_literal(value)}")
    cap = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    run_pass(con, {n: outdir / f"{n}.parquet" for n in names})
    con.close()
    wall, r1, io1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF), _io()
    return {
        "config": config,
        "env": {name: os.environ.get(name) for name in parse_env(config)},  # as this child saw them
        "memory_limit": cap,
        "wall_s": wall,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "peak_mib": peak_mib(),
        "read_mib": (io1[0] - io0[0]) / 2**20,
        "written_mib": (io1[1] - io0[1]) / 2**20,
    }


def run_one(store: Path, config: str, jemalloc: bool) -> dict[str, Any]:
    """``child`` in a fresh process; with ``jemalloc``, plus the purge counters it prints at exit."""
    env = {**os.environ, **parse_env(config)}
    if jemalloc:  # added to what the caller set, so that e.g. a decay setting can be measured too
        env["DUCKDB_JE_MALLOC_CONF"] = ",".join(
            filter(None, [env.get("DUCKDB_JE_MALLOC_CONF"), JEMALLOC_CONF])
        )
    with tempfile.TemporaryDirectory(prefix="eq-pass-memory-") as tmp:
        cmd = [sys.executable, __file__, "--store", str(store), "--child", config, "--workdir", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a pass with --config {config!r} failed:\n{done.stderr.strip()[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if jemalloc:
        found = _DIRTY.search(done.stderr)
        row["madvise"], row["purged_mib"] = (
            (int(found.group(2)), int(found.group(3)) * os.sysconf("SC_PAGE_SIZE") / 2**20)
            if found
            else (None, None)
        )
    return row


def _loadavg() -> str:
    """The load average over 1, 5 and 15 minutes (``os.getloadavg``, as metrics_bench.py records it)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="a store with current facts (read only)")
    ap.add_argument("--pairs", type=int, default=6, help="rounds: each runs every configuration once")
    ap.add_argument(
        "--config",
        action="append",
        help="LIMIT[;NAME=VALUE...][|VAR=VALUE&...], repeatable (default: default, 2GiB)",
    )
    ap.add_argument("--jemalloc-stats", action="store_true", help="count jemalloc's purges too")
    ap.add_argument("--out", type=Path, help="also write every run as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.store, args.child, args.workdir)))
        return 0
    if args.pairs < 1:
        raise SystemExit("--pairs must be at least 1")
    configs = args.config or ["default", "2GiB"]
    if len(set(configs)) < len(configs):
        raise SystemExit("--config: each configuration once (rounds already repeat them)")
    for c in configs:
        parse_config(c)  # refuse a malformed one before any run
        parse_env(c)
    store_mib = args.store.stat().st_size / 2**20
    load_before = _loadavg()
    print(f"store {args.store} ({store_mib:,.0f} MiB); {args.pairs} rounds of {', '.join(configs)}")
    print(f"load average before: {load_before}")
    w = max(6, *(len(c) for c in configs))
    head = f"{'round':>5s} {'config':{w}s} {'limit':>10s} {'wall s':>7s} {'user s':>7s} {'sys s':>6s}"
    head += f" {'minflt':>8s} {'peak MiB':>8s} {'read MiB':>8s} {'wrote MiB':>9s}"
    print(head + (f" {'madvise':>8s} {'purged MiB':>10s}" if args.jemalloc_stats else ""))
    runs: list[dict[str, Any]] = []
    for rnd in range(1, args.pairs + 1):
        for config in configs if rnd % 2 else configs[::-1]:  # A B, B A, ...: no order always first
            r = run_one(args.store, config, args.jemalloc_stats)
            r["round"] = rnd
            runs.append(r)
            line = f"{rnd:5d} {config:{w}s} {r['memory_limit']:>10s} {r['wall_s']:7.2f} {r['user_s']:7.2f}"
            line += f" {r['sys_s']:6.2f} {r['minflt']:8d} {r['peak_mib']:8.0f} {r['read_mib']:8.0f}"
            line += f" {r['written_mib']:9.0f}"
            if args.jemalloc_stats:
                m, p = r.get("madvise"), r.get("purged_mib")
                line += f" {m if m is not None else '-':>8} {f'{p:,.0f}' if p is not None else '-':>10s}"
            print(line, flush=True)
    load_after = _loadavg()
    print(f"load average after: {load_after}")
    if args.out:  # before the summary: every run is kept whatever happens below
        info = {
            "store_mib": store_mib,
            "configs": configs,
            "loadavg": [load_before, load_after],
            "runs": runs,
        }
        args.out.write_text(json.dumps(info, indent=2))
    print("means over the rounds (peak: lowest-highest); won: rounds with a lower wall than the first config")
    first = [r for r in runs if r["config"] == configs[0]]
    for config in configs:
        own = [r for r in runs if r["config"] == config]
        peaks = [r["peak_mib"] for r in own]
        line = f"  {config:{w}s} wall {_mean(own, 'wall_s'):.2f} s, user {_mean(own, 'user_s'):.2f} s, "
        line += f"sys {_mean(own, 'sys_s'):.2f} s, minflt {_mean(own, 'minflt'):,.0f}, "
        line += f"peak {min(peaks):,.0f}-{max(peaks):,.0f} MiB"
        if config != configs[0]:
            won = sum(a["wall_s"] < b["wall_s"] for a, b in zip(own, first, strict=True))
            line += f", won {won} of {len(own)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
