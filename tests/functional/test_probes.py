"""The start-up race: an upstream whose port is open while it still loads, then becomes ready."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web

from mellum_proxy.http import POLICIES, PROBES, SERVICE
from mellum_proxy.tuning.sim.responder import routes
from tests.conftest import ProxyFactory


class LoadingServer:
    """llama.cpp while it loads: 503 on everything until `ready()`; then 3 slots and a /tokenize."""

    def __init__(self) -> None:
        self.loading = True

    def app(self) -> web.Application:
        return routes({"GET /health": self._health, "GET /props": self._props, "POST /tokenize": self._tokenize})

    def _unavailable(self) -> web.Response:
        return web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)

    async def _health(self, request: web.Request) -> web.Response:
        return self._unavailable() if self.loading else web.json_response({"status": "ok"})

    async def _props(self, request: web.Request) -> web.Response:
        return self._unavailable() if self.loading else web.json_response({"total_slots": 3})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.loading:
            return self._unavailable()
        content = (await request.json())["content"]
        return web.json_response({"tokens": [{"id": 1, "piece": c} for c in content]})


async def test_slots_and_tokenizer_are_probed_again_once_the_upstream_is_ready(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = LoadingServer()
    url = str((await aiohttp_server(server.app())).make_url("")).rstrip("/")
    caplog.set_level(logging.INFO, logger="mellum_proxy")
    proxy = await make_proxy(upstream=url, max_concurrency=0, tokenizer="auto", debounce_ms=0)
    probes = proxy.app[PROBES]
    assert proxy.app[POLICIES].admission.limit == 1 and proxy.app[SERVICE].budget.counter.method == "chars"
    assert not probes.settled.is_set()
    server.loading = False
    await asyncio.wait_for(probes.settled.wait(), 10)
    assert proxy.app[POLICIES].admission.limit == 3
    assert proxy.app[SERVICE].budget.counter.method == "upstream"
    # Said once it is all true: one block when the upstream is ready, not a line per change meanwhile.
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    ready = [message for message in said if message.startswith("ready in")]
    assert len(ready) == 1 and "3 upstream at once" in ready[0] and "tokenizer upstream (exact)" in ready[0]
    assert not [message for message in said if message.startswith("upstream:")]


async def test_a_ready_upstream_is_settled_without_waiting(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream(slots=2)
    proxy = await make_proxy(upstream=url, max_concurrency=0, tokenizer="chars")
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 5)
    assert proxy.app[POLICIES].admission.limit == 2 and proxy.app[SERVICE].budget.counter.method == "chars"
