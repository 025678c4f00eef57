"""A team's setup: the routing key a router hashes, extra upstream headers, and several upstreams in order
with failover, a circuit breaker and return (deterministic fakes; the real router runs in `benchmarks team`)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS, TELEMETRY, UPSTREAMS
from mellum_proxy.telemetry.stats import read_log
from tests.conftest import ProxyFactory

BODY = {"prompt": "def f(", "suffix": ")"}


async def test_the_routing_key_is_the_developer_in_every_session(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    """vllm-router's consistent hashing reads `X-Session-Id` (checked with vllm-router 0.1.17: it logs
    `Extracted hash key: header:x-session-id:...`): one developer's files all land on one worker."""
    fake = FakeUpstream()
    app = fake.app()

    async def chat(request: web.Request) -> web.Response:
        fake.headers.append(dict(request.headers))
        return web.json_response({"choices": [{"message": {"content": "hello"}}]})

    app.router.add_post("/v1/chat/completions", chat)
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    proxy = await make_proxy(upstream=url, developer_id="ada", tokenizer="chars", reuse=False,
                             upstream_header=["x-gateway-inference-objective=critical"])  # fmt: skip
    for session in ("vscode-1", "vscode-2"):
        resp = await proxy.post("/v1/completions", json=BODY, headers={"X-Session-Id": session})
        assert resp.status == 200
    question = {"messages": [{"role": "user", "content": "hi"}]}
    await proxy.post("/v1/chat/completions", json=question, headers={"X-Session-Id": "vscode-1"})
    assert [headers["X-Session-Id"] for headers in fake.headers] == ["ada", "ada", "ada"]
    assert all(headers["x-gateway-inference-objective"] == "critical" for headers in fake.headers)
    status = await (await proxy.get("/status")).json()
    assert status["settings"]["upstream_header"] == ["x-gateway-inference-objective=***"]


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"routing_key": "session"}, ["vscode-1", "vscode-2"]),
        ({"routing_key_header": "x-user-id"}, ["ada", "ada"]),  # production-stack's router
        ({"routing_key": "none"}, [None, None]),
    ],
)
async def test_the_routing_key_follows_the_settings(
    make_proxy: ProxyFactory, fake_upstream: Any, settings: dict[str, Any], expected: list[str | None]
) -> None:
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, developer_id="ada", tokenizer="chars", reuse=False, **settings)
    for session in ("vscode-1", "vscode-2"):
        resp = await proxy.post("/infill", json={"input_prefix": "a"}, headers={"X-Session-Id": session})
        assert resp.status == 200
    header = settings.get("routing_key_header", "X-Session-Id")
    sent = [headers.get(header) for headers in fake.headers]
    if settings.get("routing_key") == "none":
        sent = [headers.get("X-Session-Id") for headers in fake.headers]  # the client's own header is not forwarded
    assert sent == expected


async def test_a_failing_upstream_hands_over_to_the_next_and_is_not_asked_again_until_healthy(
    make_proxy: ProxyFactory, fake_upstream: Any, tmp_path: Any
) -> None:
    router, router_url = await fake_upstream()
    local, local_url = await fake_upstream()
    proxy = await make_proxy(upstream=[router_url, local_url], tokenizer="chars", reuse=False,
                             log=tmp_path / "requests.jsonl")  # fmt: skip
    pool = proxy.app[UPSTREAMS]
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert proxy.app[RECORDS].last().upstream == router_url
    router.fail_status = 502  # the router's worker died
    resp = await proxy.post("/v1/completions", json=BODY)
    assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "t0 t1 t2 t3 "  # no failure seen
    assert proxy.app[RECORDS].last().upstream == local_url
    asked = len(router.payloads)
    for _ in range(3):  # the breaker is open: no request waits on the router
        assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert len(router.payloads) == asked and len(local.payloads) == 4
    status = await (await proxy.get("/status")).json()
    assert [(u["up"], u["serving"]) for u in status["upstreams"]] == [(False, False), (True, True)]
    assert status["upstreams"][0]["failed"] == 1 and status["upstreams"][1]["served"] == 4
    router.fail_status = None
    await pool.check()  # what the health watch does every health_interval_ms: too soon after a failed completion
    assert not pool.members[0].up
    await pool.changes.wait_for(lambda: pool.members[0].up)  # one health period (1 s) after it failed
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert proxy.app[RECORDS].last().upstream == router_url  # back on the first one
    metrics = (await (await proxy.get("/metrics")).read()).decode()
    assert f'mellum_proxy_upstream_requests_total{{result="failed",upstream="{router_url}"}} 1.0' in metrics
    assert f'mellum_proxy_upstream_up{{upstream="{router_url}"}} 1.0' in metrics
    sink = proxy.app[TELEMETRY].log
    assert sink is not None
    await sink.flushed()
    lines = read_log(sink.path)[0]
    assert [line["upstream"] for line in lines] == [router_url] + [local_url] * 4 + [router_url]


async def test_an_unreachable_upstream_fails_over_at_once_and_the_watch_brings_it_back(
    make_proxy: ProxyFactory, fake_upstream: Any, unused_tcp_port: int
) -> None:
    local, local_url = await fake_upstream()
    dead = f"http://127.0.0.1:{unused_tcp_port}"  # nothing listens: connection refused
    proxy = await make_proxy(upstream=[dead, local_url], tokenizer="chars", reuse=False, health_interval_ms=50)
    pool = proxy.app[UPSTREAMS]
    assert not pool.members[0].up  # found down at start: no request tries it
    assert (await proxy.post("/infill", json={"input_prefix": "a"})).status == 200
    assert proxy.app[RECORDS].last().upstream == local_url
    local.healthy = False  # the health watch takes it out too; with none up, both are tried in order
    await pool.changes.wait_for(lambda: not pool.members[1].up)
    assert (await proxy.post("/infill", json={"input_prefix": "a"})).status == 200  # still answers
    local.healthy = True
    await pool.changes.wait_for(lambda: pool.members[1].up)
    assert pool.serving is pool.members[1]


async def test_a_silent_upstream_is_left_within_the_deadline_and_used_again_once_it_answers(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """Its `/health` is fine, its completions never start: with the default deadline (1.5 s) the request goes on
    to the next upstream in time, and the first one serves again once it answers (it waited 5 s for an answer
    before, past every deadline: every completion ended empty)."""
    first, first_url = await fake_upstream()
    _, second_url = await fake_upstream()
    first.silent = True
    proxy = await make_proxy(upstream=[first_url, second_url], tokenizer="chars", reuse=False, health_interval_ms=50)
    assert Settings().timeout_ms == 1500
    pool = proxy.app[UPSTREAMS]
    served = []
    for _ in range(20):
        resp = await proxy.post("/v1/completions", json=BODY)
        text = (await resp.json())["choices"][0]["text"]
        served.append(proxy.app[RECORDS].last().upstream if text else "nothing")
    assert served.count(second_url) >= 19, served  # 95 %
    assert pool.members[0].strikes >= 1  # each return was one more failure: it waits longer to come back
    first.silent = False
    await pool.changes.wait_for(lambda: pool.members[0].up, timeout_s=10)
    for _ in range(3):  # its strikes are shed on the evidence of several answers, not one
        assert (await proxy.post("/v1/completions", json=BODY)).status == 200
        assert proxy.app[RECORDS].last().upstream == first_url
    assert pool.members[0].strikes == 0


async def test_every_upstream_failing_is_the_clients_error(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    first, first_url = await fake_upstream()
    second, second_url = await fake_upstream()
    first.fail_status = second.fail_status = 500
    proxy = await make_proxy(upstream=[first_url, second_url], tokenizer="chars", reuse=False, health_interval_ms=50)
    resp = await proxy.post("/v1/completions", json=BODY)
    assert resp.status == 502 and "worker failed" in (await resp.json())["error"]["message"]
    pool = proxy.app[UPSTREAMS]
    assert [m.up for m in pool.members] == [False, True]  # one request never takes the last one up down
    first.fail_status = None  # its health check brings the first back, and it serves again
    await pool.changes.wait_for(lambda: pool.members[0].up)
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200


async def test_a_request_error_is_not_failed_over(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    """A 4xx is about the request (a wrong model name): the next upstream would refuse it too."""
    first, first_url = await fake_upstream()
    second, second_url = await fake_upstream()
    first.fail_status = 404
    proxy = await make_proxy(upstream=[first_url, second_url], tokenizer="chars", reuse=False)
    assert (await proxy.post("/v1/completions", json=BODY)).status == 404
    assert second.payloads == [] and proxy.app[UPSTREAMS].members[0].up


async def test_embedded_after_the_upstreams_is_the_last_fallback(tmp_path: Any) -> None:
    from mellum_proxy.assembly import upstream_urls
    from mellum_proxy.config import Settings
    from mellum_proxy.sections import sections

    assert upstream_urls(sections(Settings(embedded=True)).upstream, "http://127.0.0.1:5555") == [
        "http://127.0.0.1:5555"
    ]
    team = Settings(embedded=True, upstream=["http://router:8000"])
    assert upstream_urls(sections(team).upstream, "http://127.0.0.1:5555") == [
        "http://router:8000",
        "http://127.0.0.1:5555",
    ]


async def test_vllm_routers_model_list_names_the_model(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    """vllm-router 0.1.17 answers `/v1/models` with `{"models": [{"name": ...}]}`, not OpenAI's `data`
    (seen running it in front of two llama.cpp workers for `benchmarks team`)."""
    fake = FakeUpstream()
    app = fake.app()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": "gemma-3-270m-q4_k_m", "model": "gemma-3-270m-q4_k_m"}]})

    app.router.add_get("/v1/models", models)
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=False)
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert fake.payloads[-1]["model"] == "gemma-3-270m-q4_k_m"


async def test_a_router_with_one_worker_down_still_serves(
    make_proxy: ProxyFactory, aiohttp_server: Any, fake_upstream: Any
) -> None:
    """vllm-router 0.1.17 answers `/health` 503 `Unhealthy servers: [...]` while one worker is down, and
    goes on serving from the others: the proxy must not leave it for the fallback (seen in `benchmarks team`)."""
    fake = FakeUpstream()
    fake.healthy = False  # /health: 503
    app = fake.app()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": "m"}]})

    app.router.add_get("/v1/models", models)
    router_url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    local, local_url = await fake_upstream()
    proxy = await make_proxy(upstream=[router_url, local_url], tokenizer="chars", reuse=False)
    pool = proxy.app[UPSTREAMS]
    await pool.check()
    assert pool.members[0].up
    assert (await proxy.post("/v1/completions", json=BODY)).status == 200
    assert proxy.app[RECORDS].last().upstream == router_url and local.payloads == []
