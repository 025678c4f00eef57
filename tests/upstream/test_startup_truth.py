"""Start-up tells the truth: an upstream that does not answer is said at once, in words, and again when it
answers; with no --upstream the usual local servers are looked for; a web server is named as no model server."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from benchmarks.doubles.fault_upstream import captive_portal
from mellum_proxy.http import UPSTREAMS
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.health import answer_problem
from mellum_proxy.upstream.local_servers import find_local_server
from tests.conftest import ProxyFactory


async def test_a_lone_upstream_that_does_not_answer_is_said_then_said_back(
    make_proxy: ProxyFactory, fake_upstream: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = await fake_upstream()
    fake.healthy = False  # a llama.cpp still loading: 503
    with caplog.at_level(logging.INFO, logger="mellum_proxy"):
        proxy = await make_proxy(upstream=url, tokenizer="chars", health_interval_ms=50)
        said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
        assert len(said) == 1 and "answered 503" in said[0] and "--upstream" in said[0], said
        pool = proxy.app[UPSTREAMS]
        fake.healthy = True
        await pool.changes.wait_for(lambda: pool.members[0].up, timeout_s=10)
    assert any("answers again" in r.getMessage() for r in caplog.records)
    assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1  # once, not per check


async def test_a_refused_connection_and_a_web_page_are_named(aiohttp_server: Any, unused_tcp_port: int) -> None:
    portal = await aiohttp_server(captive_portal())
    async with aiohttp.ClientSession() as session:
        refused = await answer_problem(UpstreamClient(session, f"http://127.0.0.1:{unused_tcp_port}"))
        page = await answer_problem(UpstreamClient(session, str(portal.make_url("")).rstrip("/")))
    assert refused is not None and "connection refused" in refused
    assert page == "answered 200 with an HTML page: not a model server?"


def model_server(paths: dict[str, Any]) -> web.Application:
    """A server that answers each of `paths` (GET) with its JSON, 404 elsewhere."""
    app = web.Application()
    for path, body in paths.items():

        async def answer(request: web.Request, body: Any = body) -> web.Response:
            return web.json_response(body)

        app.router.add_get(path, answer)
    return app


LLAMACPP = {"/health": {"status": "ok"}, "/props": {"total_slots": 2}, "/v1/models": {"data": [{"id": "mellum-4b"}]}}


async def test_with_no_upstream_the_usual_local_servers_are_looked_for(
    aiohttp_server: Any, unused_tcp_port: int
) -> None:
    port = (await aiohttp_server(model_server(LLAMACPP))).port
    found, said = await find_local_server((("vLLM", unused_tcp_port), ("llama.cpp", port)))
    assert found == f"http://127.0.0.1:{port}" and "llama.cpp" in said and "mellum-4b" in said
    nothing, said = await find_local_server((("vLLM", unused_tcp_port),))
    assert nothing is None and f":{unused_tcp_port} (vLLM)" in said and "--upstream" in said


async def test_a_web_server_that_answers_health_is_passed_over_for_a_model_server(aiohttp_server: Any) -> None:
    """Any web server on port 8000 answers `/health` 200: taken ahead of llama.cpp, it made every completion a 404."""
    web_server = (await aiohttp_server(model_server({"/health": {"status": "ok"}}))).port
    llama = (await aiohttp_server(model_server(LLAMACPP))).port
    found, said = await find_local_server((("vLLM", web_server), ("llama.cpp", llama)))
    assert found == f"http://127.0.0.1:{llama}"
    assert f"passed over http://127.0.0.1:{web_server} (answers, but lists no model" in said
