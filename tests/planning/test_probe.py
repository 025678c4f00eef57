"""`mellum-proxy probe`: CSV like nvidia-smi's, and min/max/peak at the end."""

from __future__ import annotations

import io

import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning.probe import PROBE_HEADER, probe
from tests.fakes import FakeGpu


def test_probe_rows_and_summary() -> None:
    gpu = FakeGpu(used_mib=100)
    levels = iter([100, 800, 300])
    original = gpu.read

    def read() -> object:
        gpu.used_mib = next(levels)
        return original()

    gpu.read = read  # type: ignore[method-assign]
    out = io.StringIO()
    summary = probe(0, interval_ms=10, out=out, count=3, opener=lambda: gpu)
    lines = out.getvalue().splitlines()
    assert lines[0] == ",".join(PROBE_HEADER)
    assert [line.split(",")[2] for line in lines[1:]] == ["100", "800", "300"]
    assert (summary["min_mib"], summary["max_mib"], summary["samples"]) == (100, 800, 3)
    assert summary["peak_at"] == lines[2].split(",")[0]
    assert gpu.closed


def test_probe_without_nvml_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from mellum_proxy.telemetry import GpuUnavailableError, NvmlBackend

    try:
        NvmlBackend(0).close()
        pytest.skip("an NVIDIA driver is present")
    except GpuUnavailableError:
        pass
    with pytest.raises(SystemExit) as info:
        main(["probe", "--count", "1"])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
