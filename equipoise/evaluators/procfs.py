"""One reader of Linux's /proc/self/status, shared by the metrics pass (its memory cap reads the
process's resident memory) and the benchmark scripts (peak and current RSS), so both read the
same figure the same way. Imports nothing heavy: a benchmark's reference process uses it too."""

from __future__ import annotations

from pathlib import Path


def status_kib(field: str) -> int | None:
    """A memory figure of this process from /proc/self/status (``VmRSS``, ``VmHWM``, ...) in KiB;
    None where there is no /proc (not Linux) or no such field. Decoded leniently: the process name
    on the file's first line may hold any bytes."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
