"""One way to start and stop: `serve` and the test fixture (`serve_app`, aiohttp's test server) shut down along
aiohttp's own order, and both give the requests in flight the grace period, then their dialect's last event."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from mellum_proxy.http import RECORDS
from tests.conftest import ProxyFactory
from tests.sse import collect_text, events


async def test_under_the_fixture_a_stream_gets_the_grace_and_its_final_event(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    _, url = await fake_upstream(tokens=100, stall_after=2)  # two tokens, then nothing until the client leaves
    proxy = await make_proxy(upstream=url, tokenizer="chars", timeout_ms=0, reuse=False, shutdown_timeout_s=0.3)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(str(proxy.make_url("/v1/completions")), json={"prompt": "x = ", "stream": True})
        assert isinstance(await anext(events(resp)), dict)  # in flight
        closing = asyncio.create_task(proxy.server.close())  # what the fixture does at the end of every test
        text, seen = await asyncio.wait_for(collect_text(resp), 10)
        await asyncio.wait_for(closing, 10)
    assert text == "t1 " and seen[-1] == "[DONE]"  # the rest of what it had, then its dialect's end
    last = seen[-2]
    assert isinstance(last, dict) and last["choices"][0]["finish_reason"] == "length"
    assert proxy.app[RECORDS].last().outcome == "shutdown"


async def test_under_the_fixture_a_stream_shorter_than_the_grace_finishes(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    _, url = await fake_upstream(tokens=8, token_delay_s=0.05)  # 0.4 s of tokens, well inside a 5 s grace
    proxy = await make_proxy(upstream=url, tokenizer="chars", timeout_ms=0, reuse=False, shutdown_timeout_s=5)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(str(proxy.make_url("/v1/completions")), json={"prompt": "x = ", "stream": True})
        assert isinstance(await anext(events(resp)), dict)  # in flight
        closing = asyncio.create_task(proxy.server.close())
        text, seen = await asyncio.wait_for(collect_text(resp), 10)
        await asyncio.wait_for(closing, 10)
    assert text == "t1 t2 t3 t4 t5 t6 t7 " and seen[-1] == "[DONE]"  # all of it, then its end
    assert proxy.app[RECORDS].last().outcome == "ok"
