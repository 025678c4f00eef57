"""Where a candidate's memory is read: NVML (the device, sampled while it runs) or, with no NVIDIA driver, the
server's own host memory (its processes' resident set, the kernel's peak): labelled as such, never as GPU memory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from mellum_proxy.proc import memory_mib, session_id
from mellum_proxy.proc import pids as proc_pids
from mellum_proxy.telemetry.gpu import MIB, GpuBackend, GpuUnavailableError, NvmlBackend

SAMPLE_S = 0.1


def session_memory_mib(sid: int, field: str = "VmRSS") -> float | None:
    """The sum of `field` (`VmRSS` now, `VmHWM` the peak) over the processes of the server's session."""
    readings = [memory_mib(pid, field) for pid in proc_pids() if session_id(pid) == sid]
    known = [mib for mib in readings if mib is not None]
    return sum(known) if known else None


class MemoryWatch:
    """One candidate's memory: `reading(phase)` now, `peak_mib()` since `watch` began (what the server added)."""

    def __init__(self, gpu: int, opener: Callable[[], GpuBackend] | None = None) -> None:
        self.note = ""
        self.backend: GpuBackend | None = None
        try:
            self.backend = (opener or (lambda: NvmlBackend(gpu)))()
        except GpuUnavailableError as exc:
            self.note = f"{exc}: the server's host memory (resident set) instead"
        self.source = "nvml" if self.backend is not None else "host_rss"
        self.before_mib = self.backend.read().used_mib if self.backend is not None else 0.0
        self.total_mib = self.backend.read().total_bytes / MIB if self.backend is not None else None
        self._peak = self.before_mib
        self._sampler: asyncio.Task[None] | None = None

    def used_mib(self, sid: int | None) -> float | None:
        """What the server uses now: the device less what was used before it started, or its resident set."""
        if self.backend is not None:
            return self.backend.read().used_mib - self.before_mib
        return session_memory_mib(sid) if sid is not None else None

    def watch(self) -> None:
        if self.backend is not None:
            self._sampler = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        assert self.backend is not None
        while True:  # NVML keeps no peak: the device is read every SAMPLE_S
            self._peak = max(self._peak, self.backend.read().used_mib)
            await asyncio.sleep(SAMPLE_S)

    async def peak_mib(self, sid: int) -> float | None:
        """The peak the server added (read before it stops: a process's peak leaves with it)."""
        if self.backend is None:
            return session_memory_mib(sid, "VmHWM")
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        self._peak = max(self._peak, self.backend.read().used_mib)
        return self._peak - self.before_mib

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
