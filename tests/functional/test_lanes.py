"""Lanes: completions keep a slot of their own while chat and agents use the same server.

Against a two-slot server whose chat answers run until the test lets them end, and against the real embedded
llama.cpp (two slots): no completion waits behind a bulk request while the reserve is free, a bulk request
beyond its share waits in the proxy, in order, and every chat still gets its whole answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from mellum_proxy.http import POLICIES, RECORDS, TELEMETRY
from mellum_proxy.telemetry.stats import read_log, stats
from mellum_proxy.tuning.sim.responder import Responder, answering, routes
from mellum_proxy.upstream.client import COMPLETION_PRIORITY, SLO_TTFT_HEADER
from tests.conftest import ProxyFactory
from tests.shapes import openai_shape

CHAT = {"messages": [{"role": "user", "content": "explain this function"}], "stream": True}


class TwoSlots:
    """A server with two slots: chats stream until `chats_end` is set; completions answer at once."""

    def __init__(self) -> None:
        self.chats_end = asyncio.Event()
        self.completions: list[dict[str, Any]] = []
        self.completion_headers: list[dict[str, str]] = []
        self.chats = 0
        self.chat_started = asyncio.Event()

    def app(self) -> web.Application:
        return routes({
            "POST /v1/completions": self._completion, "POST /v1/chat/completions": self._chat,
            "GET /props": answering({"total_slots": 2}), "GET /health": answering({"status": "ok"}),
        })  # fmt: skip

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.completions.append(payload)
        self.completion_headers.append(dict(request.headers))
        answer = Responder(request, payload, f"c{len(self.completions)}", "m")
        await answer.write("t0 ", "t1 ")
        return await answer.finish("length", {"prompt_tokens": 3, "completion_tokens": 2})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.chats += 1
        self.chat_started.set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "Sure"}}]}\n\n')
        await self.chats_end.wait()
        await response.write(b'data: {"choices": [{"delta": {"content": "."}, "finish_reason": "stop"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def test_completions_keep_their_reserve_beside_two_chats(
    make_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    server = TwoSlots()
    upstream = await aiohttp_server(server.app())
    log = tmp_path / "requests.jsonl"
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", reuse=False, log=log)
    admission = proxy.app[POLICIES].admission
    chats = [asyncio.create_task(proxy.post("/v1/chat/completions", json=CHAT)) for _ in range(2)]
    await admission.changes.wait_for(lambda: admission.bulk_running == 1 and admission.bulk_depth == 1, 10)
    await server.chat_started.wait()
    assert server.chats == 1  # the second waits in the proxy, not in the server's queue
    status = await (await proxy.get("/status")).json()
    assert status["lanes"]["bulk"] | {"wait_ms": None} == {"inflight": 1, "queued": 1, "limit": 1, "wait_ms": None}
    for i in range(3):  # a completion every keystroke pause: each takes the reserve at once
        resp = await proxy.post("/v1/completions", json={"prompt": f"def f{i}("})
        assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "t0 t1 "
        assert proxy.app[RECORDS].last().queue_ms == 0.0  # it never waited for a slot
    server.chats_end.set()
    answers = [await chat for chat in chats]
    await proxy.app[RECORDS].changes.wait_for(lambda: len(proxy.app[TELEMETRY].bulk) == 2, 10)
    for answer in answers:
        body = await answer.read()
        assert answer.status == 200 and body.endswith(b"data: [DONE]\n\n") and b'"finish_reason": "stop"' in body
    bulk = list(proxy.app[TELEMETRY].bulk)
    assert [r.lane for r in bulk] == ["bulk", "bulk"] and all(r.outcome == "ok" for r in bulk)
    assert bulk[0].queue_ms is not None and max(r.queue_ms or 0 for r in bulk) > 0  # the second waited its turn
    sink = proxy.app[TELEMETRY].log
    assert sink is not None
    await sink.flushed()
    every, _ = read_log(log, every_lane=True)
    assert stats(every, 0, "lane")["groups"]["bulk"]["requests"] == 2
    assert stats(every, 0, "lane")["groups"]["completion"]["requests"] == 3
    assert len(read_log(log)[0]) == 3  # the tools that judge completions see completions alone
    assert b"explain this function" not in log.read_bytes()  # no text of the chat either


async def test_a_bulk_request_past_its_queue_or_its_wait_is_a_503(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    server = TwoSlots()
    upstream = await aiohttp_server(server.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", max_bulk_queue=1,
                             bulk_wait_ms=200)  # fmt: skip
    admission = proxy.app[POLICIES].admission
    running = asyncio.create_task(proxy.post("/v1/chat/completions", json=CHAT))
    waiting = asyncio.create_task(proxy.post("/v1/chat/completions", json=CHAT))
    await admission.changes.wait_for(lambda: admission.bulk_running == 1 and admission.bulk_depth == 1, 10)
    refused = await proxy.post("/v1/chat/completions", json=CHAT)
    assert refused.status == 503 and openai_shape(await refused.json(), 503)
    timed_out = await waiting
    assert timed_out.status == 503 and "completions" in (await timed_out.json())["error"]["message"]
    server.chats_end.set()
    assert (await running).status == 200
    bulk = proxy.app[TELEMETRY].bulk
    await proxy.app[RECORDS].changes.wait_for(lambda: len(bulk) == 3, 10)
    assert sorted(str(r.outcome) for r in proxy.app[TELEMETRY].bulk) == ["ok", "queue_full", "timeout"]
    metrics = (await (await proxy.get("/metrics")).read()).decode()
    assert 'mellum_proxy_bulk_requests_total{outcome="queue_full"} 1.0' in metrics
    assert 'mellum_proxy_lane_inflight_requests{lane="bulk"} 0.0' in metrics


async def test_completions_go_first_where_the_server_schedules_by_priority_or_slo(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    """vLLM with --scheduling-policy priority (lower first), an llm-d gateway (its SLO ordering)."""
    server = TwoSlots()
    upstream = await aiohttp_server(server.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", upstream_priority=True,
                             slo_header=True, timeout_ms=900)  # fmt: skip
    assert (await proxy.post("/v1/completions", json={"prompt": "x", "priority": 50})).status == 200
    assert server.completions[-1]["priority"] == COMPLETION_PRIORITY  # the client's own is not the proxy's order
    assert server.completion_headers[-1][SLO_TTFT_HEADER] == "900"
    plain = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars")
    assert (await plain.post("/v1/completions", json={"prompt": "x"})).status == 200
    assert "priority" not in server.completions[-1] and SLO_TTFT_HEADER not in server.completion_headers[-1]


@pytest.mark.embedded
async def test_on_the_real_server_no_completion_waits_behind_a_chat_while_the_reserve_is_free(
    make_proxy: ProxyFactory, embedded_server: Any
) -> None:
    """llama.cpp with two slots, two chats streaming through the proxy: one runs, one waits in the proxy, and
    completions meanwhile take the reserved slot without waiting; both chats end with their whole answer."""
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, reuse=False)
    admission = proxy.app[POLICIES].admission
    question = "Count from one to twenty in words."
    chat = {"messages": [{"role": "user", "content": question}], "stream": True, "max_tokens": 48, "temperature": 0}
    client = openai.AsyncOpenAI(base_url=f"http://{proxy.host}:{proxy.port}/v1", api_key="unused", max_retries=0)

    async def openai_chat() -> str:  # the registry's own client reads the chat through the proxy
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0, stream=True
        )
        return "".join([part.choices[0].delta.content or "" async for part in stream if part.choices])

    first = asyncio.create_task(proxy.post("/v1/chat/completions", json=chat))
    await admission.changes.wait_for(lambda: admission.bulk_running == 1, 30)
    second = asyncio.create_task(openai_chat())
    await admission.changes.wait_for(lambda: admission.bulk_running == 1 and admission.bulk_depth == 1, 30)
    body = {"prompt": "def add(a, b):\n    return", "max_tokens": 4, "temperature": 0}
    resp = await proxy.post("/v1/completions", json=body)
    assert resp.status == 200
    record = proxy.app[RECORDS].last()
    assert record.outcome == "ok" and record.queue_ms == 0.0  # no wait behind a bulk request
    answer = await first
    events = [line for line in (await answer.read()).split(b"\n") if line.startswith(b"data: ")]
    assert answer.status == 200 and events[-1] == b"data: [DONE]"
    assert any(b'"finish_reason":"length"' in e or b'"finish_reason":"stop"' in e for e in events)
    assert (await second).strip()  # the openai client's chat got its whole answer, after waiting its turn
    await client.close()
    await proxy.app[RECORDS].changes.wait_for(lambda: len(proxy.app[TELEMETRY].bulk) == 2, 30)
    assert [r.outcome for r in proxy.app[TELEMETRY].bulk] == ["ok", "ok"]
    assert orjson.loads(await (await proxy.get("/status")).read())["lanes"]["bulk"]["wait_ms"]["of"] == 2


async def test_a_chat_client_that_hangs_up_after_done_got_its_whole_answer(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    """A client closes as soon as it reads `[DONE]`, while the server has yet to end its stream: the answer was
    passed on whole, and is recorded `ok` (2 of 49 such chats were `client_gone`)."""
    ended = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "Sure."}, "finish_reason": "stop"}]}\n\n')
        await response.write(b"data: [DO")  # the last event in two reads
        await response.write(b"NE]\n\n")
        await ended.wait()  # the stream's own end comes later
        await response.write_eof()
        return response

    upstream = await aiohttp_server(routes({"POST /v1/chat/completions": chat,
                                            "GET /health": answering({"status": "ok"})}))  # fmt: skip
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars")
    reader, writer = await asyncio.open_connection(proxy.server.host, proxy.server.port)
    body = orjson.dumps(CHAT)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    seen = b""
    async with asyncio.timeout(10):
        while b"[DONE]" not in seen:
            seen += await reader.read(4096)
    writer.transport.abort()  # gone at once, as a client that has what it wanted
    bulk = proxy.app[TELEMETRY].bulk
    await proxy.app[RECORDS].changes.wait_for(lambda: len(bulk) == 1, 10)
    ended.set()
    assert bulk[0].outcome == "ok" and bulk[0].upstream_status == 200
