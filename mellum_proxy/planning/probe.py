"""`mellum-proxy probe` (GPU memory over time, like `nvidia-smi --query-gpu=... -l 1`) and
`mellum-proxy baseline` (the tuning guide's four readings around a server's start).

Write down only numbers you actually read: every value here is a reading, labelled with where it came
from; GPU values are None where there is no NVIDIA driver, and host memory is labelled as such.
"""

from __future__ import annotations

import asyncio
import csv
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from mellum_proxy.proc import memory_mib
from mellum_proxy.telemetry.gpu import MIB, GpuBackend, GpuReading, GpuUnavailableError, NvmlBackend
from mellum_proxy.urls import upstream_base_url

PROBE_HEADER = ["timestamp", "index", "memory.used [MiB]", "memory.total [MiB]"]


class TextOut(Protocol):
    """Where the readings are written: a text stream, or several (`mellum-proxy probe --out`)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def probe(
    index: int,
    interval_ms: int,
    out: TextOut,
    count: int | None = None,
    opener: Callable[[], GpuBackend] | None = None,
) -> dict[str, Any]:
    """Print one CSV row per reading until `count` readings or Ctrl-C; return min/max/peak.

    Raises:
        GpuUnavailableError: no NVML here (the message says why).
    """
    backend = (opener or (lambda: NvmlBackend(index)))()
    writer = csv.writer(out)
    writer.writerow(PROBE_HEADER)
    used: list[tuple[str, float]] = []
    try:
        while count is None or len(used) < count:
            reading = backend.read()
            stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
            used.append((stamp, reading.used_mib))
            writer.writerow([stamp, index, f"{reading.used_mib:.0f}", f"{reading.total_bytes / MIB:.0f}"])
            out.flush()
            if count is None or len(used) < count:
                time.sleep(interval_ms / 1000)  # the sampling period of a foreground CLI
    except KeyboardInterrupt:
        pass
    finally:
        backend.close()
    if not used:
        return {"samples": 0}
    values = [value for _, value in used]
    peak_at = max(used, key=lambda item: item[1])[0]
    return {"samples": len(used), "min_mib": min(values), "max_mib": max(values), "peak_at": peak_at}


@dataclass(slots=True)
class Reading:
    phase: str
    at: str
    gpu_used_mib: float | None
    gpu_total_mib: float | None
    process_gpu_mib: float | None
    host_rss_mib: float | None  # host memory of the server process, not GPU memory
    note: str = ""


def host_rss_mib(pid: int | None) -> float | None:
    """Resident host memory of `pid` from /proc (Linux), None elsewhere."""
    return None if pid is None else memory_mib(pid)


class Baseline:
    """Takes the four readings; GPU through NVML when it is there."""

    def __init__(self, gpu: int, pid: int | None, opener: Callable[[], GpuBackend] | None = None) -> None:
        self.pid = pid
        self.gpu_note = ""
        self.backend: GpuBackend | None = None
        try:
            self.backend = (opener or (lambda: NvmlBackend(gpu, pid)))()
        except GpuUnavailableError as exc:
            self.gpu_note = str(exc)
        self.readings: list[Reading] = []

    def read(self, phase: str, note: str = "") -> Reading:
        gpu: GpuReading | None = self.backend.read() if self.backend is not None else None
        reading = Reading(
            phase=phase,
            at=datetime.now(UTC).isoformat(timespec="seconds"),
            gpu_used_mib=gpu.used_mib if gpu else None,
            gpu_total_mib=gpu.total_bytes / MIB if gpu else None,
            process_gpu_mib=gpu.process_bytes / MIB if gpu and gpu.process_bytes is not None else None,
            host_rss_mib=host_rss_mib(self.pid),
            note=note,
        )
        self.readings.append(reading)
        return reading

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()

    def as_json(self) -> bytes:
        return orjson.dumps(
            {"gpu_note": self.gpu_note, "pid": self.pid, "readings": [asdict(r) for r in self.readings]},
            option=orjson.OPT_INDENT_2,
        )

    def table(self) -> str:
        rows = [["phase", "at", "GPU used MiB", "GPU total MiB", "server GPU MiB", "server host RSS MiB", "note"]]
        for r in self.readings:
            rows.append([r.phase, r.at, _num(r.gpu_used_mib), _num(r.gpu_total_mib), _num(r.process_gpu_mib),
                         _num(r.host_rss_mib), r.note])  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        if self.gpu_note:
            lines.append(f"GPU columns are empty: {self.gpu_note}")
        return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


async def wait_healthy(url: str, timeout_s: float) -> None:
    async with aiohttp.ClientSession() as session, asyncio.timeout(timeout_s):
        while True:
            try:
                async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)


async def first_request(url: str) -> float:
    """One short completion; returns its wall time in ms."""
    body = {"prompt": "def main():\n", "max_tokens": 8, "temperature": 0}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as resp:
        await resp.read()
        if resp.status >= 400:
            raise RuntimeError(f"the first request failed with HTTP {resp.status}")
    return (time.monotonic() - started) * 1000


async def baseline(upstream: str, idle_s: float, gpu: int, pid: int | None, embedded_model: Path | None) -> Baseline:
    """The four readings: before the server starts (or now), after load, after idling, after one request."""
    from mellum_proxy.upstream.embedded import EmbeddedServer

    server = None
    if upstream == "embedded":
        pid = pid or os.getpid()  # the embedded server runs in this process
        book = Baseline(gpu, pid)
        book.read("before start")
        server = EmbeddedServer(embedded_model)
        url = await asyncio.to_thread(server.start)
    else:
        url = upstream_base_url(upstream)
        book = Baseline(gpu, pid)
        book.read("before start", note="the server was already running: this is 'now'")
    try:
        await wait_healthy(url, timeout_s=120)
        book.read("after load", note="/health ok")
        await asyncio.sleep(idle_s)  # the idle period being measured
        book.read("after idle", note=f"{idle_s:g} s idle")
        took = await first_request(url)
        book.read("after first request", note=f"8-token completion took {took:.0f} ms")
    finally:
        book.close()
        if server is not None:
            await asyncio.to_thread(server.stop)
    return book
