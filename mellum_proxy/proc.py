"""What Linux's `/proc` says about a process: its memory, threads, open files, session and CPU time (None where
there is no `/proc`, as on macOS, or the process is gone); and this process's threads, pinned apart."""

from __future__ import annotations

import os
from pathlib import Path


def _status(pid: int, field: str) -> int | None:
    """The number on a line of `/proc/PID/status` (`VmRSS:  1234 kB`, `Threads:  7`)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_mib(pid: int, field: str = "VmRSS") -> float | None:
    """A memory line of `/proc/PID/status` in MiB: `VmRSS` (resident now) or `VmHWM` (its peak)."""
    kib = _status(pid, field)
    return None if kib is None else kib / 1024


def threads(pid: int) -> int | None:
    """How many threads the process runs."""
    return _status(pid, "Threads")


def open_files(pid: int) -> int | None:
    """How many file descriptors the process holds open."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
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


def thread_ids() -> set[int]:
    """The ids of this process's threads now (empty where there is no `/proc`)."""
    try:
        return {int(entry.name) for entry in Path("/proc/self/task").iterdir()}
    except OSError:
        return set()


def pin_apart(kept: set[int], cores: int) -> tuple[set[int], set[int]]:
    """Threads `kept` on `cores` CPUs of their own (the last this process may use), every other thread of this
    process on the rest; threads made later take their maker's. (kept's CPUs, the rest's).

    Raises `ValueError` where this process may use fewer than two CPUs or cannot pin (no `sched_setaffinity`)."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("pinning threads to cores needs Linux (sched_setaffinity)")
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise ValueError(f"pinning needs two CPUs or more; this process may use {len(allowed)}")
    split = len(allowed) - max(1, min(cores, len(allowed) - 1))
    theirs, ours = set(allowed[split:]), set(allowed[:split])
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, theirs if tid in kept else ours)
        except ProcessLookupError:  # a thread that ended since it was listed
            continue
    return theirs, ours
