"""Items per second for each MCQ suite's deterministic transforms on a large source, and byte
identity of two builds, measured in one run.

    python benchmarks/build_bench.py --items 200000

1. makes a ``--items`` source by giving the bundled questions fresh ids (``syn-<n>-<mini id>``), so
   every item is a distinct, valid ``MCQItem`` that the transforms seed by id (not timed);
2. for each suite (medabstain with span context removal, clear, nota, shuffle) times the suite
   recipe alone (pure, seeded transforms producing every config's items) and then the write of
   the Parquet configs, card and manifest (``write_dataset``), reporting source items/s and
   produced rows/s for both;
3. builds one suite twice into two folders and compares every file's bytes.

The issue's target (>= 100k items/s) is for the transforms; the write includes pydantic
serialisation and Parquet encoding of every produced row. Prints a table and writes
benchmarks/results/build.json.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path


def synthetic_source(n: int) -> list:
    from equipoise.builders.sources.mini import mini_items

    base = mini_items()
    out = []
    for i in range(n):
        it = base[i % len(base)]
        new_id = f"syn-{i // len(base):06d}-{it.item_id}"
        out.append(
            it.model_copy(
                update={
                    "item_id": new_id,
                    "base_id": new_id,
                    "source": it.source.model_copy(update={"source_id": new_id, "dataset": "synthetic"}),
                }
            )
        )
    return out


def build_once(suite: str, items: list, out: Path) -> tuple[float, float, int]:
    """(seconds for the recipe, seconds for the write, rows produced)."""
    from equipoise.builders.dataset_writer import ConfigData, DatasetSpec, write_dataset
    from equipoise.builders.suites import MCQ_SUITES, SuiteOptions
    from equipoise.schemas.items import MCQItem

    t0 = time.perf_counter()
    result = MCQ_SUITES[suite](items, SuiteOptions(seed=0))
    t1 = time.perf_counter()
    cfgs = [
        ConfigData(name, MCQItem, rows, result.descriptions.get(name, ""), default=i == 0)
        for i, (name, rows) in enumerate(result.configs.items())
    ]
    spec = DatasetSpec(
        pretty_name=f"bench {suite}",
        license="cc-by-4.0",
        configs=cfgs,
        manifest_extra={"suite": suite, "seed": 0},
        card_body=f"Benchmark build of {suite}.",
        tags=["benchmark"],
    )
    write_dataset(out, spec)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, sum(len(r) for r in result.configs.values())


def identical(a: Path, b: Path) -> tuple[bool, int]:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    other = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    same = files == other and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)
    return same, len(files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--suites", nargs="*", default=["nota", "shuffle", "clear", "medabstain"])
    ap.add_argument("--identity-suite", default="nota", help="suite built twice for the byte comparison")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/build.json"))
    args = ap.parse_args()

    t = time.perf_counter()
    items = synthetic_source(args.items)
    print(f"source: {len(items):,} items made in {time.perf_counter() - t:.1f} s (not timed below)")
    tmp = Path(tempfile.mkdtemp(prefix="eq-build-"))
    rows = []
    for suite in args.suites:
        t_recipe, t_write, produced = build_once(suite, items, tmp / suite)
        rows.append(
            {
                "suite": suite,
                "source_items": len(items),
                "rows_produced": produced,
                "recipe_s": round(t_recipe, 3),
                "recipe_items_per_s": round(len(items) / t_recipe),
                "recipe_rows_per_s": round(produced / t_recipe),
                "write_s": round(t_write, 3),
                "write_rows_per_s": round(produced / t_write),
                "end_to_end_items_per_s": round(len(items) / (t_recipe + t_write)),
            }
        )
        r = rows[-1]
        print(
            f"{suite:11s} rows {produced:>9,}  recipe {r['recipe_s']:7.2f} s "
            f"({r['recipe_items_per_s']:>8,} items/s, {r['recipe_rows_per_s']:>9,} rows/s)  "
            f"write {r['write_s']:7.2f} s ({r['write_rows_per_s']:>8,} rows/s)"
        )
    suite = args.identity_suite
    build_once(suite, items, tmp / "twice-a")
    build_once(suite, items, tmp / "twice-b")
    same, n_files = identical(tmp / "twice-a", tmp / "twice-b")
    print(f"byte identity of two '{suite}' builds: {'identical' if same else 'DIFFERENT'} ({n_files} files)")
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak_gib:.2f} GiB; target >= 100,000 items/s for the transforms")
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        },
        "items": args.items,
        "suites": rows,
        "byte_identical": same,
        "identity_suite": suite,
        "identity_files": n_files,
        "peak_rss_gib": round(peak_gib, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
