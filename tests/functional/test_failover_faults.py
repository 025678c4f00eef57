"""Failover that fails over: an upstream that answers garbage or nothing is left for a healthy one, one
request cannot take every upstream down, and the one that serves brings its own slots and context."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from benchmarks.doubles.fault_upstream import FaultUpstream, SilentServer, captive_portal
from mellum_proxy.http import POLICIES, RECORDS, SERVICE, UPSTREAMS
from mellum_proxy.observe import Changes
from tests.conftest import ProxyFactory

BODY = {"prompt": "def f(", "suffix": ")"}


def broken_events() -> web.Application:
    """A healthy-looking server whose completions are an event stream of bytes that are no event."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {not json at all\n\n")
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
async def silent_url() -> AsyncIterator[str]:
    async with SilentServer() as url:
        yield url


async def served_by_second(proxy: Any, second_url: str, requests: int = 20) -> float:
    for i in range(requests):
        resp = await proxy.post("/v1/completions", json={**BODY, "prompt": f"def f{i}("})
        assert resp.status == 200, await resp.text()
    served = [r for r in proxy.app[RECORDS] if r.upstream == second_url]
    return len(served) / requests


@pytest.mark.parametrize("first", ["portal", "broken_events"])
async def test_a_garbage_first_upstream_is_failed_over(
    make_proxy: ProxyFactory, aiohttp_server: Any, fake_upstream: Any, first: str
) -> None:
    app = captive_portal() if first == "portal" else broken_events()
    checks, checked = counting_health(app)
    bad = await aiohttp_server(app)
    _second, second_url = await fake_upstream()
    bad_url = str(bad.make_url("")).rstrip("/")
    proxy = await make_proxy(upstream=[bad_url, second_url], tokenizer="chars", reuse=False, health_interval_ms=50)
    assert await served_by_second(proxy, second_url) >= 0.95
    pool = proxy.app[UPSTREAMS]
    if first == "portal":  # it stays out: an HTML page is no health answer either (a server whose events are
        assert not pool.members[0].up  # broken but whose /health is fine may be back in by now: a race)
    seen = checks[0]
    await checked.wait_for(lambda: checks[0] >= seen + 4)  # four more health checks
    if first == "portal":
        assert not pool.members[0].up  # a portal's 200 never brought it back


def counting_health(app: web.Application) -> tuple[list[int], Changes]:
    """Count the `/health` requests `app` is asked (in `checks[0]`), with a signal on each."""
    checks, checked = [0], Changes()

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/health":
            checks[0] += 1
            checked.notify()
        answered: web.StreamResponse = await handler(request)
        return answered

    app.middlewares.append(count)
    return checks, checked


async def test_a_silent_first_upstream_is_failed_over(
    make_proxy: ProxyFactory, fake_upstream: Any, silent_url: str
) -> None:
    _second, second_url = await fake_upstream()
    proxy = await make_proxy(upstream=[silent_url, second_url], tokenizer="chars", reuse=False, timeout_ms=0,
                             upstream_answer_timeout_ms=300)  # fmt: skip
    assert await served_by_second(proxy, second_url) >= 0.95


@pytest.mark.parametrize("fault", ["stall_after_headers", "slow_first", "empty_stream", "done_only"])
async def test_an_answer_that_says_nothing_is_failed_over(
    make_proxy: ProxyFactory, aiohttp_server: Any, fake_upstream: Any, fault: str
) -> None:
    """Headers and then nothing, a first token later than the failover share of the deadline, an empty stream
    or `[DONE]` alone: the primary's failure, counted, and the fallback answers; the record names it."""
    primary = await aiohttp_server(FaultUpstream(fault).app())
    primary_url = str(primary.make_url("")).rstrip("/")
    _second, second_url = await fake_upstream()
    proxy = await make_proxy(upstream=[primary_url, second_url], tokenizer="chars", reuse=False, timeout_ms=1500,
                             health_interval_ms=60_000)  # fmt: skip
    assert await served_by_second(proxy, second_url, requests=6) == 1.0
    pool = proxy.app[UPSTREAMS]
    assert pool.members[0].failed >= 1 and not pool.members[0].up
    assert all(record.outcome == "ok" for record in proxy.app[RECORDS])


async def test_an_empty_answer_from_a_lone_upstream_is_its_error(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    server = await aiohttp_server(FaultUpstream("done_only").app())
    proxy = await make_proxy(upstream=str(server.make_url("")), tokenizer="chars", reuse=False)
    resp = await proxy.post("/v1/completions", json=BODY)
    assert resp.status == 502
    assert "without any text" in (await resp.json())["error"]["message"]
    assert proxy.app[RECORDS].last().outcome == "upstream_error"


async def test_a_silent_lone_upstream_is_an_error_not_a_hang(make_proxy: ProxyFactory, silent_url: str) -> None:
    proxy = await make_proxy(upstream=silent_url, tokenizer="chars", timeout_ms=0, upstream_answer_timeout_ms=300)
    resp = await proxy.post("/v1/completions", json=BODY)
    assert resp.status == 504  # the editor is answered, even without a deadline


async def test_one_failing_request_cannot_take_every_upstream_down(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """The primary is down; a request that makes the healthy fallback answer 500 is that request's failure:
    the fallback keeps serving, and the next requests do not go to the dead primary first."""
    first, first_url = await fake_upstream()
    second, second_url = await fake_upstream()
    proxy = await make_proxy(upstream=[first_url, second_url], tokenizer="chars", reuse=False)
    pool = proxy.app[UPSTREAMS]
    first.fail_status = 503
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200  # failed over, first marked down
    assert not pool.members[0].up
    second.fail_status = 500  # one bad request on the one that is up
    assert (await proxy.post("/v1/completions", json=BODY)).status == 502
    assert pool.members[1].up
    second.fail_status = None
    before = len(first.payloads)
    for _ in range(5):
        assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert len(first.payloads) == before  # the dead primary was not asked first


async def test_the_serving_fallback_brings_its_own_slots_and_context(
    make_proxy: ProxyFactory, fake_upstream: Any, aiohttp_server: Any
) -> None:
    """With the primary down at start, the fallback does not run at the primary's unknown concurrency of 1."""
    _fallback, fallback_url = await fake_upstream(slots=4)
    dead = await aiohttp_server(web.Application())
    dead_url = str(dead.make_url("")).rstrip("/")
    await dead.close()  # nothing listens there now
    proxy = await make_proxy(upstream=[dead_url, fallback_url], tokenizer="chars", max_concurrency=0)
    assert proxy.app[UPSTREAMS].client.base_url == fallback_url
    assert proxy.app[POLICIES].admission.limit == 4
    assert proxy.app[SERVICE].budget.counter.method == "chars"


def quoting_server() -> web.Application:
    """A server whose 500 quotes the prompt it was sent (as some do in their error text)."""

    async def completions(request: web.Request) -> web.Response:
        prompt = (await request.json()).get("prompt", "")
        return web.json_response({"error": {"message": f"failed on: {prompt}", "type": "server_error"}}, status=500)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


@pytest.mark.parametrize("log_content", [False, True])
async def test_an_upstream_error_that_quotes_the_code_stays_out_of_the_console_and_status(
    make_proxy: ProxyFactory,
    aiohttp_server: Any,
    fake_upstream: Any,
    caplog: pytest.LogCaptureFixture,
    log_content: bool,
) -> None:
    secret = "def launch_codes(): return 'x9-very-secret'"
    primary = await aiohttp_server(quoting_server())
    _second, second_url = await fake_upstream()
    proxy = await make_proxy(upstream=[str(primary.make_url("")).rstrip("/"), second_url], tokenizer="chars",
                             reuse=False, health_interval_ms=60_000, log_content=log_content)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="mellum_proxy"):
        assert (await proxy.post("/v1/completions", json={"prompt": secret})).status == 200  # failed over
    status = await (await proxy.get("/status")).text()
    shown = caplog.text + status
    assert ("x9-very-secret" in shown) == log_content
    if not log_content:
        assert "HTTP 500 (server_error): a message of" in caplog.text and "sha256" in status


async def test_a_web_servers_error_page_is_named_not_pasted(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(status=501, text="<html><body>" + "Not Implemented " * 200 + "</body></html>",
                            content_type="text/html")  # fmt: skip

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    server = await aiohttp_server(app)
    proxy = await make_proxy(upstream=str(server.make_url("")).rstrip("/"), tokenizer="chars")
    resp = await proxy.post("/v1/completions", json=BODY)
    message = (await resp.json())["error"]["message"]
    assert resp.status == 502 and "answered 501 with an HTML page" in message and "not a model server?" in message
    assert "<html>" not in message
