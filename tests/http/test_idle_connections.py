"""Connections that idle: keep-alive connections left open never take a completion's place, and a chat client
that stops reading is let go with its slot."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.http import CONNECTIONS, POLICIES, TELEMETRY, build_app, connections
from mellum_proxy.http.server import serve_app

COMPLETION = b'{"prompt": "def f(", "max_tokens": 4}'


async def idle_connection(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A keep-alive connection that made one request and waits, open, as an editor or a page left open does."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
    await reader.readexactly(length)
    return reader, writer


async def test_idle_keep_alive_connections_never_take_a_completions_place(fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    app = build_app(Settings(upstream=url, tokenizer="chars"))
    async with serve_app(app) as base:
        guard = app[CONNECTIONS]
        port = int(base.rsplit(":", 1)[1])
        idle = [await idle_connection(port) for _ in range(guard.limit)]
        assert guard.open == guard.limit and guard.idle == guard.limit
        async with aiohttp.ClientSession() as session, asyncio.timeout(3):
            async with session.post(base + "/v1/completions", data=COMPLETION,
                                    headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
                body = await resp.json()
        assert resp.status == 200 and body["choices"][0]["text"]
        assert guard.refused == 0 and guard.evicted >= 1  # an idle one made room
        async with aiohttp.ClientSession() as session, session.get(base + "/status") as resp:
            said = (await resp.json())["connections"]
        assert said["evicted"] >= 1 and said["idle"] >= guard.limit - 3
        for _, writer in idle:
            writer.close()


async def test_an_idle_connection_is_closed_after_the_idle_timeout(fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    app = build_app(Settings(upstream=url, tokenizer="chars", idle_timeout_ms=200))
    async with serve_app(app) as base:
        reader, writer = await idle_connection(int(base.rsplit(":", 1)[1]))
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the proxy, not by the test's bound
        assert app[CONNECTIONS].open == 0
        writer.close()


def endless_chat() -> tuple[web.Application, dict[str, int]]:
    """A chat server whose answers stream until the client leaves."""
    seen = {"chats": 0, "left": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        seen["chats"] += 1
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        try:
            while True:
                await stream.write(b'data: {"choices": [{"delta": {"content": "' + b"x" * 65536 + b'"}}]}\n\n')
        except (ConnectionError, asyncio.CancelledError):
            seen["left"] += 1
            raise

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app, seen


async def test_a_chat_client_that_stops_reading_is_let_go_and_its_slot_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "STALLED_S", 0.3)
    server, _ = endless_chat()
    async with serve_app(server) as upstream:
        app = build_app(Settings(upstream=upstream, tokenizer="chars", max_concurrency=1, completion_reserve=0))
        async with serve_app(app) as base:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
            body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}'
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            await reader.readuntil(b"\r\n\r\n")  # and then reads nothing more
            admission = app[POLICIES].admission
            await admission.changes.wait_for(lambda: admission.bulk_running == 0, 20)  # let go after STALLED_S
            assert [record.outcome for record in app[TELEMETRY].bulk] == ["client_gone"]  # not passed on whole
            writer.close()


@pytest.mark.slow  # seconds of real time
async def test_a_burst_past_the_limit_is_answered_503_at_once_not_left_in_the_kernels_queue(
    aiohttp_server: Any,
) -> None:
    """200 clients at once against a proxy whose limit is 16 (a low file limit's): those over it are accepted and
    answered 503 within a second or two, instead of waiting for their dropped SYNs' retries (1, 3, 7, 15 s)."""
    release = asyncio.Event()

    async def hanging(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"choices": [{"text": "x", "index": 0, "finish_reason": "stop"}]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    fake = web.Application()
    fake.router.add_post("/v1/completions", hanging)
    fake.router.add_get("/health", health)
    upstream = await aiohttp_server(fake)
    app = build_app(Settings(upstream=str(upstream.make_url("")), tokenizer="chars", timeout_ms=0))
    async with serve_app(app) as base:
        app[CONNECTIONS].limit = 16
        port = int(base.rsplit(":", 1)[1])
        request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))  # fmt: skip

        async def client() -> tuple[float, bytes, asyncio.StreamWriter]:
            started = asyncio.get_running_loop().time()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            try:
                line = await asyncio.wait_for(reader.readline(), 5)
            except TimeoutError:
                line = b""  # within the limit: its completion waits on the hanging server
            return asyncio.get_running_loop().time() - started, line, writer

        answers = await asyncio.gather(*(client() for _ in range(200)))
        # a newer keystroke of the same session supersedes an older one (answered at once), so the slots turn over;
        # only those still on the hanging server are left without an answer
        answered = [took for took, line, _ in answers if line.startswith((b"HTTP/1.1 503", b"HTTP/1.1 200"))]
        refused = [line for _, line, _ in answers if line.startswith(b"HTTP/1.1 503")]
        assert len(answered) >= 200 - 16 and len(refused) >= 50, (len(answered), len(refused))
        assert max(answered) < 3.0, max(answered)  # none waited on a retried SYN
        release.set()
        for _, _, writer in answers:
            writer.close()
