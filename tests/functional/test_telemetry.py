"""Telemetry after real requests through the embedded llama.cpp server: log, /metrics, /status, VRAM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mellum_proxy.http import POLICIES, RECORDS, TELEMETRY
from mellum_proxy.telemetry.stats import read_log
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.fakes import FakeGpu
from tests.sse import collect_text

pytestmark = pytest.mark.embedded

SECRET = "def secret_function_name(x):\n"


async def test_log_metrics_and_status_after_real_requests(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    gpu = FakeGpu(used_mib=1000)
    proxy = await make_proxy(
        upstream=embedded_server.url,
        debounce_ms=0,
        timeout_ms=0,
        log=log,
        gpu_opener=lambda: gpu,
        vram_interval_ms=60_000,
    )
    sampler = proxy.app[TELEMETRY].gpu
    assert sampler is not None
    await sampler.sample_once()

    stream = await proxy.post("/v1/completions", json={"prompt": SECRET, "max_tokens": 16, "temperature": 0,
                                                       "stream": True}, headers={"X-Session-Id": "ed-1"})  # fmt: skip
    gpu.used_mib = 3000  # the server's KV cache grows ...
    await sampler.sample_once()
    gpu.used_mib = 1500  # ... and is freed
    await sampler.sample_once()
    await collect_text(stream)
    plain = await proxy.post("/v1/completions", json={"prompt": SECRET, "max_tokens": 8, "temperature": 0})
    await plain.json()
    await proxy.app[RECORDS].changes.wait_for(lambda: len(proxy.app[RECORDS]) == 2)
    admission = proxy.app[POLICIES].admission  # a completion a rule ended holds its slot until the server
    await admission.changes.wait_for(lambda: admission.running == 0)  # has let go of it

    status = await (await proxy.get("/status")).json()
    assert [r["outcome"] for r in status["recent"]] == ["ok", "ok"]
    assert status["upstream"]["max_concurrency"] == 2  # read from llama.cpp /props
    assert status["vram"]["source"] == "nvml" and status["vram"]["peak_mib"] == 3000
    assert status["settings"]["debounce_ms"] == 0

    metrics = await (await proxy.get("/metrics")).text()
    assert 'mellum_proxy_requests_total{outcome="ok"} 2.0' in metrics
    assert 'mellum_proxy_requests_total{outcome="debounced"} 0.0' in metrics
    assert "mellum_proxy_time_to_first_token_seconds_count 2.0" in metrics
    assert "mellum_proxy_inflight_requests 0.0" in metrics
    assert sample(metrics, "mellum_proxy_gpu_memory_used_bytes") == 1500 * 1024 * 1024

    await proxy.close()  # shutdown flushes the log
    raw = log.read_bytes()
    assert b"secret_function_name" not in raw  # no source text without --log-content
    first, second = read_log(log)[0]  # the request lines (a suggestion's `acceptance` line is apart)
    assert first["session"] == "ed-1" and first["dialect"] == "openai" and first["outcome"] == "ok"
    assert 0 < first["ttft_ms"] < first["total_ms"]
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] == 16
    assert first["prompt_chars"] == len(SECRET) and len(first["prompt_sha256"]) == 16
    assert first["prompt_sha256"] == second["prompt_sha256"]  # same prompt, same digest
    assert (first["vram_used_mib_start"], first["vram_peak_mib"], first["vram_used_mib_end"]) == (1000, 3000, 1500)
    assert first["vram_source"] == "nvml"
    assert first["queue_depth"] == 0 and first["inflight"] == 0


async def test_log_content_only_when_asked(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    proxy = await make_proxy(
        upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, log=log, log_content=True, gpu_opener=_unavailable
    )
    await (await proxy.post("/v1/completions", json={"prompt": SECRET, "max_tokens": 4})).json()
    await proxy.close()
    (record,) = read_log(log)[0]
    assert record["prompt"] == SECRET and record["completion"]
    assert record["vram_source"] == "none" and record["vram_peak_mib"] is None  # no GPU: null, not a failure


async def test_no_gpu_means_null_vram_and_nan_gauges(make_proxy: ProxyFactory, embedded_server: EmbeddedServer) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, timeout_ms=0, gpu_opener=_unavailable)
    metrics = await (await proxy.get("/metrics")).text()
    assert "mellum_proxy_gpu_memory_used_bytes NaN" in metrics
    status = await (await proxy.get("/status")).json()
    assert status["vram"]["source"] == "none" and "no GPU in this test" in status["vram"]["reason"]


def sample(exposition: str, name: str) -> float:
    return next(float(line.split()[1]) for line in exposition.splitlines() if line.startswith(name + " "))


def _unavailable() -> Any:
    from mellum_proxy.telemetry import GpuUnavailableError

    raise GpuUnavailableError("no GPU in this test")


async def test_baseline_against_the_real_server(embedded_server: EmbeddedServer, tmp_path: Path) -> None:
    from mellum_proxy.planning.probe import baseline

    book = await baseline(str(embedded_server.url), idle_s=0, gpu=0, pid=None, embedded_model=None)
    assert [r.phase for r in book.readings] == ["before start", "after load", "after idle", "after first request"]
    assert "already running" in book.readings[0].note
    assert "completion took" in book.readings[3].note
    table = book.table()
    assert "after first request" in table
    assert orjson.loads(book.as_json())["readings"][3]["phase"] == "after first request"
