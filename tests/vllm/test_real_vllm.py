"""The proxy in front of a real vLLM (0.32.0 on the CPU, gemma-3-270m): what the fakes in
`tests/functional/test_servers.py` prove, again against the server itself (`make test-vllm`)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from mellum_proxy.http import POLICIES, PROBES, RECORDS
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.dialects.plugins import FIXTURES, zed
from tests.vllm.conftest import CONTEXT, SERVED, WANTED, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not WANTED, reason="opt in: make test-vllm")]

ARTIFACTS = Path(os.environ.get("MELLUM_PROXY_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
LONG = {"prompt": "def parse(text):\n", "temperature": 0, "max_tokens": 300, "ignore_eos": True, "stream": True}
CODE = "".join(f"def handler_{i}(request):\n    return respond(request, {i})\n\n" for i in range(120))


def keep_figure(name: str, value: float) -> None:
    """A figure of the run, kept in `test-artifacts/vllm.json` (where the real server is timed, not asserted)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "vllm.json"
    figures = orjson.loads(path.read_bytes()) if path.exists() else {}
    path.write_bytes(orjson.dumps(figures | {name: value}))


class Engine:
    """vLLM's own view of what it holds and what it generated, from its `/metrics`."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session

    async def metrics(self) -> dict[str, float]:
        async with self.session.get(self.url + "/metrics") as resp:
            text = await resp.text()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and "{" in line:
                name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
                values[name] = values.get(name, 0.0) + value
        return values

    async def held(self) -> int:
        m = await self.metrics()
        return int(m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"])

    async def generated(self) -> float:
        return (await self.metrics())["vllm:generation_tokens_total"]

    async def until(self, held: int, timeout_s: float) -> None:
        """Poll (vLLM has no event for it) until it holds `held` requests; a hang guard, not a timing."""
        async with asyncio.timeout(timeout_s):
            while await self.held() != held:  # noqa: ASYNC110 (no event upstream)
                await asyncio.sleep(0.02)


async def settled(proxy: Any) -> Any:
    """The proxy once discovery is done (the tokenizer chosen, the context read)."""
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)
    return proxy


@pytest.fixture
async def engine(vllm_server: VllmServer) -> Any:
    async with aiohttp.ClientSession() as session:
        view = Engine(vllm_server.url, session)
        await view.until(0, 30)
        yield view


async def test_discovery_reads_the_kind_the_model_and_its_context(
    make_proxy: ProxyFactory, vllm_server: VllmServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=vllm_server.url)
    found = f"kind vllm, model {SERVED}, {CONTEXT} tokens per request, 4 slots"
    assert any(found in message for message in caplog.messages), caplog.messages
    assert proxy.app[POLICIES].admission.limit == 4
    status = await (await proxy.get("/status")).json()
    found_by = status["discovered"]
    assert found_by["kind"] == "vllm" and found_by["model"] == SERVED and found_by["context_tokens"] == CONTEXT


async def test_the_budget_is_exact_by_vllms_own_tokenize_count(
    make_proxy: ProxyFactory, vllm_server: VllmServer
) -> None:
    proxy = await settled(await make_proxy(upstream=vllm_server.url, tokenizer="upstream", max_context_tokens=300,
                                           max_tokens=16, reuse=False, timeout_ms=0))  # fmt: skip
    resp = await proxy.post("/v1/completions", json={"prompt": CODE + "def handler_last(request):\n    return ",
                                                    "suffix": "\n\nprint(handler_last(None))\n", "max_tokens": 16,
                                                    "temperature": 0})  # fmt: skip
    assert resp.status == 200, await resp.text()
    record = proxy.app[RECORDS].last()
    assert record.truncated and record.tokenizer is not None and record.tokenizer.startswith("upstream")
    assert record.prompt_tokens_after is not None and record.prompt_tokens_after <= 300 - 16
    assert record.prompt_tokens == record.prompt_tokens_after  # what vLLM counted is what the proxy planned


async def test_vllm_refuses_a_suffix_so_the_proxy_renders_the_prompt(
    make_proxy: ProxyFactory, vllm_server: VllmServer
) -> None:
    body = {"model": SERVED, "prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 8, "temperature": 0}
    async with aiohttp.ClientSession() as session, session.post(vllm_server.url + "/v1/completions", json=body) as r:
        assert r.status == 400 and "suffix is only supported" in (await r.json())["error"]["message"]
    proxy = await make_proxy(upstream=vllm_server.url, timeout_ms=0)
    resp = await proxy.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    assert isinstance((await resp.json())["choices"][0]["text"], str)
    zed_body = orjson.loads((FIXTURES / "zed" / "fim-star-coder.json").read_bytes())
    resp = await proxy.post("/v1/completions", json=zed_body)  # Zed's edit prediction, StarCoder's markers
    zed(resp.status, await resp.read())  # reads as Zed's own parser reads it
    assert resp.status == 200 and proxy.app[RECORDS].last().outcome == "ok"


async def test_a_superseded_request_is_aborted_by_vllm(make_proxy: ProxyFactory, engine: Engine) -> None:
    proxy = await make_proxy(upstream=engine.url, timeout_ms=0, max_tokens=512, reuse=False, postprocess=False)
    generated = await engine.generated()
    old = asyncio.ensure_future(proxy.post("/v1/completions", json=LONG, headers={"X-Session-Id": "s"}))
    await engine.until(1, 30)
    new = await proxy.post("/v1/completions", json={**LONG, "max_tokens": 2, "ignore_eos": False},
                           headers={"X-Session-Id": "s"})  # fmt: skip
    assert new.status == 200
    await (await old).read()
    records = proxy.app[RECORDS]
    await records.changes.wait_for(lambda: len(records) == 2, 5)
    assert sorted(str(r.outcome) for r in records) == ["cancelled", "ok"]
    started = time.monotonic()
    await engine.until(0, 10)  # the bound is for a busy machine; the time is kept, not asserted
    keep_figure("superseded_let_go_s", round(time.monotonic() - started, 3))
    settled = await engine.generated()
    await asyncio.sleep(0.5)  # a window in which a request still running would keep generating
    assert await engine.generated() == settled and settled - generated < 300  # far below the 300 asked for


async def test_admission_never_lets_vllm_hold_more_than_the_proxys_limit(
    make_proxy: ProxyFactory, engine: Engine
) -> None:
    """Server-true admission: a cancelled request keeps its slot until vLLM's `/metrics` says it let go."""
    async with aiohttp.ClientSession() as session:
        client = UpstreamClient(session, engine.url)
        assert await client.held() == 0  # the proxy reads vLLM's num_requests_running + num_requests_waiting
    proxy = await make_proxy(upstream=engine.url, timeout_ms=0, max_tokens=512, reuse=False, max_concurrency=1)
    peak, done = 0, asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, await engine.held())
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    asks = []
    for session_id in ("a", "b", "a", "c", "b"):  # each keystroke of a session cancels its previous request
        asks.append(asyncio.ensure_future(proxy.post("/v1/completions", json={**LONG, "max_tokens": 40},
                                                     headers={"X-Session-Id": session_id})))  # fmt: skip
        await asyncio.sleep(0.15)
    for answer in await asyncio.gather(*asks):
        await answer.read()
    await engine.until(0, 60)
    done.set()
    await watcher
    assert peak == 1


async def test_completions_go_first_on_a_priority_scheduled_vllm_and_chat_takes_its_lane(
    make_proxy: ProxyFactory, engine: Engine
) -> None:
    """vLLM started with `--scheduling-policy priority` takes the proxy's `priority` on each completion (a vLLM
    without it refuses one), and a chat through the proxy is a bulk request that gets its whole answer."""
    proxy = await make_proxy(upstream=engine.url, timeout_ms=0, max_tokens=8, reuse=False, upstream_priority=True)
    resp = await proxy.post("/v1/completions", json={"prompt": "def add(a, b):\n    return", "max_tokens": 8})
    assert resp.status == 200, await resp.text()
    assert proxy.app[RECORDS].last().outcome == "ok"
    chat = {"model": SERVED, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    answer = await proxy.post("/v1/chat/completions", json=chat)
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["choices"][0]["message"]["content"] is not None
    status = await (await proxy.get("/status")).json()
    assert status["lanes"]["bulk"]["wait_ms"]["of"] == 1 and status["lanes"]["bulk"]["inflight"] == 0


def test_profile_and_a_short_replay_run_on_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "mellum_proxy"]
    subprocess.run([*cli, "profile", "--upstream", vllm_server.url, "--out", str(tmp_path / "profile.json")],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    profile = orjson.loads((tmp_path / "profile.json").read_bytes())
    assert profile["kind"] == "vllm" and profile["slots"] == 4 and profile["context_tokens"] == CONTEXT
    assert profile["decode_tps"] > 0 and profile["prefill_tps"] > profile["decode_tps"]
    trace = Path(__file__).resolve().parents[2] / "mellum_proxy" / "bench" / "traces" / "json-crdt-blog-post.json.gz"
    out = tmp_path / "replay"
    subprocess.run([*cli, "bench", "replay", str(trace), "--upstream", vllm_server.url, "--limit-events", "60",
                    "--max-tokens", "16", "--policy", "direct", "--policy", "defaults", "--no-oracle", "--out",
                    str(out)], check=True, capture_output=True, timeout=600)  # fmt: skip
    rows = {line.split("|")[1].strip(): line.split("|") for line in (out / "report.md").read_text().splitlines()
            if line.startswith(("| direct ", "| defaults "))}  # fmt: skip
    assert set(rows) == {"direct", "defaults"}
    assert int(rows["defaults"][3]) <= int(rows["direct"][3])  # upstream requests


async def test_failover_to_the_next_upstream_when_vllm_is_killed(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer
) -> None:
    own = VllmServer()
    own.start()
    try:
        proxy = await make_proxy(upstream=[own.url, embedded_server.url], timeout_ms=0, reuse=False)
        body = {"prompt": "def add(a, b):\n    return ", "max_tokens": 8, "temperature": 0}
        assert (await proxy.post("/v1/completions", json=body)).status == 200
        assert proxy.app[RECORDS].last().upstream == own.url
        assert own.process is not None
        own.kill()
        for _ in range(3):
            resp = await proxy.post("/v1/completions", json=body)
            assert resp.status == 200, await resp.text()
            assert proxy.app[RECORDS].last().upstream == str(embedded_server.url)
    finally:
        own.stop()
