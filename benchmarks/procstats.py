"""Process statistics the benchmark scripts report: peak resident memory and CPU time of the
process itself, and what the rest of the machine did meanwhile (``machine_cpu_s``). One copy,
imported by ``metrics_bench.py``, ``metrics_rss.py`` and ``import_bench.py`` (each runs as a
script, so this folder is on ``sys.path``), so their figures are measured the same way and can be
compared."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from equipoise.evaluators.procfs import status_kib


def peak_mib() -> float:
    """Peak RSS of this process so far in MiB: VmHWM where /proc exists (it can be reset, see
    ``reset_peak``), else ru_maxrss (KiB on Linux, bytes on macOS)."""
    hwm = status_kib("VmHWM")  # the package's reader, the one its memory cap uses
    if hwm is not None:
        return hwm / 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def reset_peak() -> bool:
    """Reset the RSS high-water mark (Linux >= 4.0), so the next peak is the next step's own;
    False where it cannot be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def cpu_s() -> float:
    """User + system CPU seconds of this process, all threads (less sensitive to other jobs than
    wall time: DuckDB's worker threads wait, not work, while another process holds a core)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children so far (all their threads):
    a child's whole run, its start and imports included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# the fields of /proc/stat's "cpu" line, in order (Linux >= 2.6.11); guest time is already in user
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_s() -> dict[str, float] | None:
    """The machine's CPU seconds so far, summed over its cores, from /proc/stat: ``busy`` (user,
    nice, system, irq, softirq: work done by any process), ``steal`` (time the hypervisor gave this
    VM's virtual cores to someone else) and ``idle``. None where /proc/stat is missing.

    Why: a run that takes twice its usual wall time with the same CPU time was either waiting for
    cores that another process held (``busy`` minus its own CPU time) or for cores that the host
    took away (``steal``); the difference of two readings around a run says which."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    tick = os.sysconf("SC_CLK_TCK")
    ticks = dict(zip(_STAT_FIELDS, (int(v) / tick for v in first[1:]), strict=False))
    busy = sum(ticks.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    return {"busy": busy, "steal": ticks.get("steal", 0.0), "idle": ticks.get("idle", 0.0)}


def machine_delta(
    before: dict[str, float] | None, after: dict[str, float] | None, own_cpu_s: float
) -> dict[str, float] | None:
    """``after`` minus ``before`` (two ``machine_cpu_s`` readings), field by field, plus ``others``:
    the busy time less ``own_cpu_s``, the CPU time of the work timed between the readings (at
    least 0: /proc/stat counts in ticks). None if either reading is."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in before}
    delta["others"] = max(0.0, delta["busy"] - own_cpu_s)
    return delta
