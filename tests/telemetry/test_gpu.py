"""GpuSampler: per-request start/end/peak from a fake backend, failure paths, and the real NVML path."""

from __future__ import annotations

import logging

import pytest

from mellum_proxy.telemetry import GpuSampler, GpuUnavailableError, NvmlBackend
from tests.fakes import FakeGpu


async def test_window_sees_start_peak_and_end() -> None:
    gpu = FakeGpu(used_mib=1000)
    sampler = GpuSampler(lambda: gpu)
    sampler.open()
    await sampler.sample_once()
    window = sampler.start_window(1)
    gpu.used_mib = 5000
    await sampler.sample_once()
    gpu.used_mib = 2000
    await sampler.sample_once()
    closed = sampler.end_window(1)
    assert (closed.start_mib, closed.peak_mib, closed.end_mib) == (1000, 5000, 2000)
    assert window is closed
    assert sampler.peak_mib == 5000
    assert sampler.source == "nvml"


async def test_no_driver_says_why_once_and_records_none(caplog: pytest.LogCaptureFixture) -> None:
    def opener() -> FakeGpu:
        raise GpuUnavailableError("NVML unavailable: NVML Shared Library Not Found")

    sampler = GpuSampler(opener)
    with caplog.at_level(logging.DEBUG, logger="mellum_proxy.gpu"):
        sampler.open()
    assert sampler.source == "none"
    assert "Shared Library Not Found" in sampler.reason
    assert sum("VRAM will not be recorded" in m for m in caplog.messages) == 1
    assert await sampler.sample_once() is None
    sampler.start_window(1)
    closed = sampler.end_window(1)
    assert (closed.start_mib, closed.peak_mib, closed.end_mib) == (None, None, None)


async def test_error_mid_run_disables_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGpu()
    sampler = GpuSampler(lambda: gpu)
    sampler.open()
    await sampler.sample_once()
    sampler.start_window(7)
    gpu.fail = True
    with caplog.at_level(logging.WARNING, logger="mellum_proxy.gpu"):
        assert await sampler.sample_once() is None
        assert await sampler.sample_once() is None
    assert [m for m in caplog.messages if "disabled" in m] == [
        "VRAM sampling disabled after an NVML error: GPU is lost"
    ]
    assert sampler.source == "none"
    assert gpu.closed
    assert sampler.end_window(7).end_mib is None  # the request still ends normally


def test_real_nvml_reads_the_device() -> None:
    try:
        backend = NvmlBackend(0)
    except GpuUnavailableError as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    try:
        reading = backend.read()
        assert 0 < reading.used_bytes <= reading.total_bytes
    finally:
        backend.close()
