"""Process statistics the benchmark scripts report: peak resident memory and CPU time of the
process itself. One copy, imported by ``metrics_bench.py``, ``metrics_rss.py`` and
``import_bench.py`` (each runs as a script, so this folder is on ``sys.path``), so their figures
are measured the same way and can be compared."""

from __future__ import annotations

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
