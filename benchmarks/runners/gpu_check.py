"""`make gpu-check` (`python -m benchmarks gpu-check`): on a machine with an NVIDIA GPU, show that the proxy's VRAM
sampler sees a known CUDA allocation. Prints dated readings; exit 0 when the sampler saw the allocation, 1 when it did
not, 2 when there is no NVIDIA driver here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any

from mellum_proxy.console import command
from mellum_proxy.planning.probe import probe
from mellum_proxy.telemetry import GpuSampler, GpuUnavailableError, NvmlBackend

ALLOC_MIB = 1024


def allocate(mib: int) -> tuple[object, str] | None:
    """A CUDA buffer of `mib` MiB through PyTorch or CuPy, whichever is installed."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda"), f"torch {torch.__version__}"
    except ImportError:
        pass
    try:
        import cupy

        return cupy.empty(mib * 1024 * 1024, dtype=cupy.uint8), f"cupy {cupy.__version__}"
    except ImportError:
        return None


async def watch_allocation() -> int:
    sampler = GpuSampler(lambda: NvmlBackend(0, os.getpid()), interval_s=0.05)
    sampler.open()
    before = await sampler.sample_once()
    assert before is not None
    sampler.start_window(0)
    buffer = allocate(ALLOC_MIB)
    if buffer is None:
        print("no PyTorch or CuPy with CUDA here: the allocation check was not run")
        return 0
    _, how = buffer
    during = await sampler.sample_once()
    del buffer
    await asyncio.sleep(0.2)  # let the allocator return the memory before the last reading
    after = await sampler.sample_once()
    window = sampler.end_window(0)
    sampler.close()
    assert during is not None and after is not None and window.peak_mib is not None
    seen = window.peak_mib - before.used_mib
    print(f"allocated {ALLOC_MIB} MiB with {how}")
    print(f"device used MiB: before {before.used_mib:.0f}, during {during.used_mib:.0f}, after {after.used_mib:.0f}")
    print(f"sampler window: start {window.start_mib:.0f}, peak {window.peak_mib:.0f}, end {window.end_mib:.0f}")
    if during.process_bytes is not None:
        print(f"this process's own GPU memory during the allocation: {during.process_bytes / 2**20:.0f} MiB")
    ok = 0.9 * ALLOC_MIB <= seen <= 1.6 * ALLOC_MIB  # the CUDA context adds its own few hundred MiB
    print(f"sampler saw +{seen:.0f} MiB for a {ALLOC_MIB} MiB allocation: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> int:
    print(f"gpu-check {datetime.now(UTC).isoformat(timespec='seconds')}")
    try:
        backend = NvmlBackend(0)
    except GpuUnavailableError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 2
    print(f"GPU 0: {backend.name}")
    backend.close()
    probe(0, interval_ms=500, out=sys.stdout, count=4)
    return asyncio.run(watch_allocation())


def add_commands(commands: Any) -> None:
    about = "on a machine with an NVIDIA GPU: the VRAM sampler sees a known CUDA allocation (exit 0; 1: it did not)"
    command(commands, "gpu-check", about, lambda args: sys.exit(main()))
