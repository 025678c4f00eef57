"""Cancellation reaches the real llama.cpp server: the slot goes idle and decoding stops."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest

from mellum_proxy.http import PROBES
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.sse import events

pytestmark = pytest.mark.embedded

LONG = {"prompt": "def parse(text):\n", "temperature": 0, "max_tokens": 400, "ignore_eos": True}


class Upstream:
    """Reads the embedded server's own view: its slots and its Prometheus counters."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def metric(self, name: str) -> float:
        async with self.session.get(self.url + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")

    async def counters(self) -> tuple[float, float]:
        """Tokens predicted and decode steps, so far."""
        return await self.metric("llamacpp:tokens_predicted_total"), await self.metric("llamacpp:n_decode_total")

    async def busy_slots(self) -> int:
        async with self.session.get(self.url + "/slots") as resp:
            return sum(slot["is_processing"] for slot in await resp.json())

    async def idle_within(self, seconds: float) -> None:
        """Poll /slots (the server has no event for this) until no slot is busy; a hang guard, not a timing."""
        async with asyncio.timeout(seconds):
            while await self.busy_slots():  # noqa: ASYNC110 (no event upstream)
                await asyncio.sleep(0.02)

    async def decodes_grow(self, since: float, by: int, timeout_s: float = 10) -> None:
        async with asyncio.timeout(timeout_s):
            while await self.metric("llamacpp:n_decode_total") < since + by:  # noqa: ASYNC110 (no event upstream)
                await asyncio.sleep(0.02)


@pytest.fixture
async def upstream(embedded_server: EmbeddedServer) -> Any:
    async with aiohttp.ClientSession() as session:
        view = Upstream(str(embedded_server.url), session)
        await view.idle_within(5)
        yield view


async def assert_decoding_stopped(upstream: Upstream, predicted_before: float, decodes_before: float) -> None:
    await upstream.idle_within(30)  # a safety net: a request that kept decoding would show in the counts below
    decodes = await upstream.metric("llamacpp:n_decode_total")
    await asyncio.sleep(0.3)  # a window in which a still-running generation would keep decoding
    assert await upstream.metric("llamacpp:n_decode_total") == decodes
    assert decodes - decodes_before < 200  # far below the 400 tokens asked for
    assert await upstream.metric("llamacpp:tokens_predicted_total") - predicted_before < 200


async def test_superseded_stream_stops_the_server(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, upstream: Upstream
) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, max_tokens=512)
    predicted, decodes = await upstream.counters()
    old = await proxy.post("/v1/completions", json={**LONG, "stream": True})
    chunks = 0
    async for _ in events(old):
        chunks += 1
        if chunks == 3:
            break
    newer = await proxy.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 1})
    assert newer.headers["X-Mellum-Outcome"] == "ok"
    rest = [event async for event in events(old)]
    assert rest[-1] == "[DONE]"
    assert (
        isinstance(rest[-2], dict) and rest[-2]["choices"][0]["finish_reason"] == "length"
    )  # a cut completion never says stop
    await assert_decoding_stopped(upstream, predicted, decodes)


async def test_superseded_non_stream_request_stops_the_server(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, upstream: Upstream
) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, max_tokens=512)
    predicted, decodes = await upstream.counters()
    old = asyncio.create_task(proxy.post("/v1/completions", json=LONG))
    await upstream.decodes_grow(decodes, by=5)  # a few tokens generated
    newer = await proxy.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 1})
    assert newer.headers["X-Mellum-Outcome"] == "ok"
    resp = await old
    assert resp.headers["X-Mellum-Outcome"] == "cancelled"
    assert (await resp.json())["choices"][0]["text"]  # what it had so far
    await assert_decoding_stopped(upstream, predicted, decodes)


async def test_timeout_stops_the_server(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, upstream: Upstream
) -> None:
    # The deadline must fall after the first token, however busy the machine: it doubles until it does.
    for timeout_ms in (600, 1200, 2400, 4800, 9600):
        await upstream.idle_within(5)  # the previous try's request has let go of its slot
        proxy = await make_proxy(
            upstream=embedded_server.url, debounce_ms=0, timeout_ms=timeout_ms, max_tokens=512, tokenizer="upstream"
        )
        await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 10)  # nothing else asks the server meanwhile
        predicted, decodes = await upstream.counters()
        resp = await proxy.post("/v1/completions", json=LONG)
        assert resp.headers["X-Mellum-Outcome"] == "timeout"
        body = await resp.json()
        assert body["choices"][0]["finish_reason"] == "length"
        if body["choices"][0]["text"]:
            break
    assert body["choices"][0]["text"], "no token before a 9.6 s deadline"
    await assert_decoding_stopped(upstream, predicted, decodes)


@pytest.mark.slow
async def test_llama_cpp_drops_an_abandoned_plain_request_only_after_a_second_without_any_result(
    embedded_server: EmbeddedServer, upstream: Upstream
) -> None:
    """What the simulator's `HTTP_POLLING_S` models: a non-streamed request's handler looks at its connection only
    after a second in which the server sent no result to anyone. Left unread, the server drops an abandoned one
    then; read every 100 ms (`bench replay` reads `/metrics` so), each answer wakes the handler and it runs on."""
    url = str(embedded_server.url) + "/v1/completions"

    async def abandon(max_tokens: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.3), upstream.session.post(url, json=LONG | {"max_tokens": max_tokens}) as r:
                await r.read()

    before, _ = await upstream.counters()
    await abandon(400)
    await asyncio.sleep(2.5)  # the server left unread: the silence under test, no event to wait for
    await upstream.idle_within(10)
    left_alone = (await upstream.counters())[0] - before
    assert 0 < left_alone < 400

    before, _ = await upstream.counters()
    await abandon(60)
    async with asyncio.timeout(60):
        while await upstream.busy_slots():  # noqa: ASYNC110 (a reader every 100 ms is the case under test)
            await asyncio.sleep(0.1)
    assert (await upstream.counters())[0] - before == 60
