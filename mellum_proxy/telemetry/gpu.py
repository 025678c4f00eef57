"""GPU memory through NVML (`nvidia-ml-py`, imported as `pynvml`), sampled in the background.

`GpuSampler` reads the device every `interval_s` (in a worker thread, so a slow driver never
stalls the event loop) and keeps per-request windows: the value at start, at end, and the peak in
between. Without an NVIDIA driver it says once why and every reading is None. An NVML error
mid-run disables the sampler with one warning; it never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("mellum_proxy.gpu")
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuReading:
    used_bytes: int
    total_bytes: int
    process_bytes: int | None = None  # the upstream process's own usage, when its PID is known

    @property
    def used_mib(self) -> float:
        return self.used_bytes / MIB


class GpuBackend(Protocol):
    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


class GpuUnavailableError(RuntimeError):
    """No GPU reading is possible here (no driver, no device, no library); the message says why."""


class NvmlBackend:
    """Device `index` through NVML."""

    def __init__(self, index: int = 0, pid: int | None = None) -> None:
        import pynvml

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailableError(f"NVML unavailable: {exc}") from exc
        try:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.name = str(pynvml.nvmlDeviceGetName(self._handle))
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise GpuUnavailableError(f"NVML has no GPU {index}: {exc}") from exc
        self.index = index
        self.pid = pid

    def read(self) -> GpuReading:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        process = None
        if self.pid is not None:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == self.pid and proc.usedGpuMemory is not None:
                    process = int(proc.usedGpuMemory)
        return GpuReading(int(info.used), int(info.total), process)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


@dataclass(slots=True)
class VramWindow:
    """One request's view of GPU memory: MiB at start, the peak seen, MiB at end."""

    start_mib: float | None
    peak_mib: float | None
    end_mib: float | None = None


class GpuSampler:
    """Background sampler over a `GpuBackend`.

    Args:
        opener: builds the backend (e.g. `lambda: NvmlBackend(0, pid)`); may raise `GpuUnavailableError`.
        interval_s: time between readings.
    """

    def __init__(self, opener: Callable[[], GpuBackend], interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.latest: GpuReading | None = None
        self.peak_mib: float | None = None
        self.source = "none"
        self.reason = "not started"
        self._opener = opener
        self._backend: GpuBackend | None = None
        self._open: dict[int, VramWindow] = {}

    def open(self) -> None:
        """Open the backend, or note once why there is none."""
        try:
            self._backend = self._opener()
        except GpuUnavailableError as exc:
            self.reason = str(exc)
            log.debug("VRAM will not be recorded: %s", self.reason)  # the proxy's ready block says so
            return
        self.source, self.reason = "nvml", ""

    async def sample_once(self) -> GpuReading | None:
        """Take one reading and fold it into the open windows (the loop calls this; so can tests)."""
        if self._backend is None:
            return None
        try:
            reading = await asyncio.to_thread(self._backend.read)
        except Exception as exc:  # any driver error: stop sampling, warn once, keep serving
            log.warning("VRAM sampling disabled after an NVML error: %s", exc)
            self._disable(f"NVML error: {exc}")
            return None
        self.latest = reading
        used = reading.used_mib
        self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
        for window in self._open.values():
            window.peak_mib = used if window.peak_mib is None else max(window.peak_mib, used)
        return reading

    async def run(self) -> None:
        """Sample until cancelled (owned by the app's cleanup context)."""
        while self._backend is not None:
            await self.sample_once()
            await asyncio.sleep(self.interval_s)  # the sampling period itself

    def close(self) -> None:
        if self._backend is not None:
            self._disable("closed")

    def _disable(self, reason: str) -> None:
        backend, self._backend = self._backend, None
        self.source, self.reason = "none", reason
        if backend is not None:
            try:
                backend.close()
            except Exception as exc:  # closing a broken driver must not raise either
                log.debug("NVML shutdown failed: %s", exc)

    def start_window(self, key: int) -> VramWindow:
        now = self.latest.used_mib if self.latest is not None and self._backend is not None else None
        window = VramWindow(start_mib=now, peak_mib=now)
        self._open[key] = window
        return window

    def end_window(self, key: int) -> VramWindow:
        window = self._open.pop(key)
        if self.latest is not None and self._backend is not None:
            window.end_mib = self.latest.used_mib
            window.peak_mib = max(window.peak_mib or 0.0, window.end_mib)
        return window
