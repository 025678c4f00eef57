"""What Linux's `/proc` says about a process: its memory, its session, its CPU time. None where there is no
`/proc` (macOS) or the process is gone."""

from __future__ import annotations

import os
from pathlib import Path


def memory_mib(pid: int, field: str = "VmRSS") -> float | None:
    """A memory line of `/proc/PID/status` in MiB: `VmRSS` (resident now) or `VmHWM` (its peak)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _stat(pid: int) -> list[str] | None:
    """`/proc/PID/stat` from its third field on (the command name, which may hold spaces, cut off)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_id(pid: int) -> int | None:
    """The session the process belongs to (field 6)."""
    fields = _stat(pid)
    return int(fields[3]) if fields else None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system, fields 14 and 15) the process has used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None


def pids() -> list[int]:
    """Every process's id."""
    try:
        return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return []
