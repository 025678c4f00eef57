"""Servers that restart or change: a restart on the same port costs no completion, and a server that comes back
with another model or context is discovered again without restarting the proxy, said once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.http import PROBES, UPSTREAMS
from tests.conftest import ProxyFactory

BODY = {"prompt": "def f(", "suffix": ")", "max_tokens": 4}


@asynccontextmanager
async def serving(fake: FakeUpstream, port: int) -> AsyncIterator[str]:
    """`fake` on `port` until the block ends; then it is stopped (its connections closed)."""
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def completion_text(proxy: Any) -> tuple[int, str]:
    resp = await proxy.post("/v1/completions", json=BODY)
    body = await resp.json()
    return resp.status, body["choices"][0]["text"] if resp.status == 200 else str(body)


async def test_the_upstream_restarted_on_its_port_answers_the_next_completion(
    make_proxy: ProxyFactory, unused_tcp_port: int
) -> None:
    async with serving(FakeUpstream(model="m"), unused_tcp_port) as url:
        proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=False)
        assert await completion_text(proxy) == (200, "t0 t1 t2 t3 ")
    async with serving(FakeUpstream(model="m"), unused_tcp_port):
        assert await completion_text(proxy) == (200, "t0 t1 t2 t3 ")


async def test_a_server_back_with_another_model_and_context_is_discovered_again_and_said_once(
    make_proxy: ProxyFactory, unused_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(FakeUpstream(model="mellum-4b", context=4096), unused_tcp_port) as url:
        proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=False, health_interval_ms=50)
        discovery = proxy.app[PROBES]
        assert discovery.view.model == "mellum-4b" and discovery.view.server_context_tokens == 4096
    pool = proxy.app[UPSTREAMS]
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        async with serving(FakeUpstream(model="mellum2", context=1024, slots=3), unused_tcp_port):
            assert (await completion_text(proxy))[0] == 200
            await pool.changes.wait_for(lambda: discovery.view.model == "mellum2", timeout_s=10)
            view = discovery.view
            assert (view.server_context_tokens, view.slots) == (1024, 3)
            assert view.context_tokens <= 1024
            assert (await completion_text(proxy))[0] == 200
    said = [r.getMessage() for r in caplog.records if "mellum2" in r.getMessage()]
    assert len(said) == 1, said
