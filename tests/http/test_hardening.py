"""Defects a black-box fault campaign found, each kept fixed by a test: bytes that are not UTF-8 in
headers, deeply nested pass-through fields, `Host` and token checks, credentials in the upstream
URL, upstream error texts that quote source, and requests on the wire at SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS, TELEMETRY
from mellum_proxy.http.server import serve, serve_app
from mellum_proxy.telemetry.stats import read_log
from tests.conftest import ProxyFactory
from tests.shapes import SHAPES, ollama_shape, openai_shape


async def raw_request(port: int, head: bytes, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (a client library would refuse these headers)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


async def test_header_bytes_that_are_not_utf8_are_served_logged_and_shown(
    make_proxy: ProxyFactory, fake_upstream: Any, tmp_path: Path
) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars", log=tmp_path / "log.jsonl")
    body = orjson.dumps({"prompt": "def f(", "suffix": ")"})
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"X-Session-Id: ed\xff\xfeitor\r\nX-File-Path: src/caf\xe9.py\r\n"
    )
    status, answer = await raw_request(proxy.server.port, head, body)  # type: ignore[arg-type]
    assert status == 200 and orjson.loads(answer)["choices"][0]["text"]
    sink = proxy.app[TELEMETRY].log
    assert sink is not None
    await sink.flushed()
    line = read_log(sink.path)[0][-1]
    assert line["session"] == "ed\ufffd\ufffditor" and line["outcome"] == "ok"
    for _ in range(3):
        assert (await proxy.get("/status")).status == 200  # the record with that session is shown too


@pytest.mark.parametrize("depth", [65, 300, 1000])
async def test_a_pass_through_field_nested_too_deep_is_a_400_naming_it(
    make_proxy: ProxyFactory, fake_upstream: Any, depth: int
) -> None:
    """Parsing allows 1,024 levels, orjson writes 254: without the check, the request was a 500. (Ollama's
    dialect passes no unknown field on.)"""
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    nested = b"[" * depth + b"1" + b"]" * depth
    for path, start in (("/v1/completions", b'{"prompt": "x"'), ("/infill", b'{"input_prefix": "x"')):
        resp = await proxy.post(path, data=start + b', "logit_bias": ' + nested + b"}")
        error = await resp.json()
        assert resp.status == 400 and SHAPES[path](error, 400), (path, error)
        assert "logit_bias" in str(error)
    assert fake.payloads == []
    ok = {"prompt": "x", "logit_bias": [[[1]]]}
    assert (await proxy.post("/v1/completions", json=ok)).status == 200


async def test_status_and_metrics_answer_only_this_machines_names(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    for path in ("/status", "/metrics"):
        refused = await proxy.get(path, headers={"Host": "attacker.example:8011"})
        assert refused.status == 403 and openai_shape(await refused.json(), 403)
        for host in ("localhost:8011", "127.0.0.1:8011", "[::1]:8011"):
            assert (await proxy.get(path, headers={"Host": host})).status == 200, (path, host)
    completion = await proxy.post("/v1/completions", json={"prompt": "x"}, headers={"Host": "attacker.example"})
    assert completion.status == 403  # DNS rebinding: a page would read the editor's completions through reuse


async def test_an_auth_token_is_required_on_every_endpoint(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars", auth_token="s3cret-token")
    wrong = {"Authorization": "Bearer not-the-token"}
    for headers in ({}, wrong):
        resp = await proxy.post("/api/generate", json={"prompt": "x", "model": "m"}, headers=headers)
        assert resp.status == 401 and ollama_shape(await resp.json(), 401)
        assert proxy.app[RECORDS].last().outcome == "bad_request"
        for path in ("/health", "/status", "/metrics", "/v1/models"):
            assert (await proxy.get(path, headers=headers)).status == 401, path
    assert fake.payloads == []
    good = {"Authorization": "Bearer s3cret-token"}
    assert (await proxy.post("/v1/completions", json={"prompt": "x"}, headers=good)).status == 200
    shown = await (await proxy.get("/status", headers=good)).text()
    assert "s3cret-token" not in shown


async def test_credentials_in_the_upstream_url_are_never_shown(
    make_proxy: ProxyFactory, fake_upstream: Any, unused_tcp_port: int
) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url.replace("http://", "http://user:pa55word@"), tokenizer="chars")
    for path in ("/status", "/health"):
        text = await (await proxy.get(path)).text()
        assert "pa55word" not in text and "***@" in text, path
    dead = await make_proxy(upstream=f"http://user:pa55word@127.0.0.1:{unused_tcp_port}", tokenizer="chars")
    resp = await dead.post("/v1/completions", json={"prompt": "x"})
    assert resp.status == 502 and "pa55word" not in await resp.text()


async def test_an_upstream_error_quoting_source_is_cut_and_kept_off_the_log(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "def private_algorithm():  # SOURCE " * 200

    async def quoting(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": f"cannot tokenize: {secret}", "type": "x"}}, status=400)

    app = web.Application()
    for path in ("/v1/completions", "/tokenize"):
        app.router.add_post(path, quoting)
    upstream = await aiohttp_server(app)
    with caplog.at_level(logging.DEBUG, "mellum_proxy"):
        proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="upstream")
        resp = await proxy.post("/v1/completions", json={"prompt": secret})
        message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and len(message) <= 303
    assert "SOURCE" not in caplog.text  # the tokenizer's failure is logged by its type, not its words


async def test_serve_warns_when_listening_beyond_loopback(
    fake_upstream: Any, unused_tcp_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = await fake_upstream()
    stop = asyncio.Event()
    stop.set()  # serve binds, prints, and shuts down
    await serve(Settings(upstream=url, listen=f"0.0.0.0:{unused_tcp_port}", tokenizer="chars"), stop)
    err = capsys.readouterr().err
    assert "WARNING" in err and "--auth-token" in err


async def test_requests_on_the_wire_at_sigterm_are_answered_and_logged(unused_tcp_port: int, tmp_path: Path) -> None:
    fake = FakeUpstream(tokens=3)
    async with serve_app(fake.app()) as url:
        log = tmp_path / "log.jsonl"
        settings = Settings(upstream=url, listen=f"127.0.0.1:{unused_tcp_port}", tokenizer="chars", log=log)
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, stop))
        try:
            for _ in range(200):  # the server task needs a moment to bind; connecting is the signal
                with contextlib.suppress(ConnectionRefusedError):
                    _, probe = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
                    probe.close()
                    break
                await asyncio.sleep(0.02)
            body = orjson.dumps({"prompt": "def f("})
            head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            # Connected and sent without yielding to the loop: the proxy has not even accepted the
            # connection when the signal comes (what a loaded proxy sees of a request sent just before).
            client = socket.create_connection(("127.0.0.1", unused_tcp_port))
            client.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            stop.set()
            client.setblocking(False)
            answer = b""
            async with asyncio.timeout(30):  # a cut-off request would hang here, not fail
                while chunk := await asyncio.get_running_loop().sock_recv(client, 65536):
                    answer += chunk
            client.close()
            await server
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await server
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert [line["outcome"] for line in read_log(log)[0]] == ["ok"]


async def test_a_defect_after_the_first_event_ends_the_stream_and_is_recorded(
    make_proxy: ProxyFactory, aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception nobody expected, once the editor has its first event: the stream ends in Ollama's own
    way (an error line, then `done: true`), never with a second HTTP response inside the body."""
    from benchmarks.doubles.fault_upstream import FaultUpstream
    from mellum_proxy.dialects.ollama import OllamaEncoder

    calls = {"n": 0}
    partial = OllamaEncoder.partial

    def broken(self: OllamaEncoder, completion: Any, chunk: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("a defect")
        return partial(self, completion, chunk)

    monkeypatch.setattr(OllamaEncoder, "partial", broken)
    fake = FaultUpstream()
    upstream = await aiohttp_server(fake.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars")
    fake.after_first = gate = asyncio.Event()
    async with proxy.post("/api/generate", json={"prompt": "x", "model": "m"}) as resp:
        first = await resp.content.readline()
        gate.set()
        lines = [orjson.loads(line) for line in (first + await resp.read()).splitlines()]
    assert resp.status == 200 and lines[0]["response"] == "t0 ", lines
    assert "error" in lines[-2] and lines[-1]["done"] is True
    assert proxy.app[RECORDS].last().outcome == "internal_error"
    assert "a defect" in caplog.text  # logged with its traceback


async def test_slow_clients_and_too_many_connections_are_cut_off(fake_upstream: Any) -> None:
    """Slowloris: connections that never finish their headers are closed after the header deadline, and
    beyond the connection limit new ones are answered 503 and closed at once, so the proxy keeps accepting and
    serving."""
    from mellum_proxy.http import CONNECTIONS, build_app

    _, url = await fake_upstream()
    app = build_app(Settings(upstream=url, tokenizer="chars"))
    async with serve_app(app) as base:
        guard = app[CONNECTIONS]
        guard.limit, guard.header_s = 20, 0.3
        port = int(base.rsplit(":", 1)[1])
        slow = []
        for _ in range(30):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and nothing more
            slow.append((reader, writer))
        closed = await asyncio.gather(*(asyncio.wait_for(reader.read(), 5) for reader, _ in slow))
        busy = [answer for answer in closed if answer]  # 10 over the limit: answered 503 at once, then closed
        assert len(busy) == 10 and all(answer.startswith(b"HTTP/1.1 503 ") for answer in busy)
        assert all(orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "overloaded" for answer in busy)
        assert closed.count(b"") == 20  # closed at the header deadline
        assert (guard.refused, guard.too_slow, guard.open) == (10, 20, 0)
        status, _body = await raw_request(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                         b"Content-Type: application/json\r\n", b'{"prompt": "x"}')  # fmt: skip
        assert status == 200
        for _, writer in slow:
            writer.close()


async def test_a_body_that_trickles_is_answered_408(fake_upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from mellum_proxy.http import bodies, build_app

    monkeypatch.setattr(bodies, "BODY_READ_S", 0.3)
    _, url = await fake_upstream()
    async with serve_app(build_app(Settings(upstream=url, tokenizer="chars"))) as base:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\"")  # fmt: skip
        answer = await asyncio.wait_for(reader.readuntil(b"}}"), 5)  # the status line, headers and error body
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer


def endless_upstream(finish_then_hang: bool) -> web.Application:
    """A server that never ends its stream: one that sends its finish reason and then neither `[DONE]` nor
    the end of the body, or one that ignores `max_tokens` and sends 64 KB of text an event, for ever."""

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def event(text: str, finish: str | None) -> bytes:
            choice = {"text": text, "index": 0, "finish_reason": finish}
            return b"data: " + orjson.dumps({"id": "x", "object": "text_completion", "choices": [choice]}) + b"\n\n"

        if finish_then_hang:
            for piece in ("a", "b", "c"):
                await response.write(event(piece, None))
            await response.write(event("", "stop"))
        else:
            while True:
                await response.write(event("x" * 65536, None))
                await asyncio.sleep(0)
        await asyncio.Event().wait()  # the connection stays open
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.mark.parametrize("finish_then_hang", [True, False], ids=["finish-without-done", "endless"])
async def test_a_stream_that_never_ends_is_answered_at_once(
    make_proxy: ProxyFactory, aiohttp_server: Any, finish_then_hang: bool
) -> None:
    server = await aiohttp_server(endless_upstream(finish_then_hang))
    proxy = await make_proxy(upstream=str(server.make_url("")), tokenizer="chars", timeout_ms=0, reuse=False)
    resp = await asyncio.wait_for(proxy.post("/v1/completions", json={"prompt": "x = "}), 10)
    choice = (await resp.json())["choices"][0]
    if finish_then_hang:
        assert choice == {"text": "abc", "index": 0, "logprobs": None, "finish_reason": "stop"}
    else:
        assert choice["finish_reason"] == "length" and 0 < len(choice["text"]) <= 1 << 20


@pytest.mark.slow
async def test_a_low_file_limit_refuses_early_instead_of_failing_accepts(
    fake_upstream: Any, unused_tcp_port: int, tmp_path: Path
) -> None:
    """`ulimit -n 128` and 150 editors at once: the connection guard and the upstream pool share the file limit,
    so no accept fails ("out of system resource" was logged 16,039 times in 30 s); over the limit is a 503."""
    import resource
    import subprocess
    import sys

    _fake, url = await fake_upstream(tokens=2, first_token_delay_s=0.2, slots=None)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    command = [sys.executable, "-m", "mellum_proxy", "serve", "--upstream", url, "--listen",
               f"127.0.0.1:{unused_tcp_port}", "--tokenizer", "chars", "--log", "off", "--max-concurrency", "64",
               "--max-queue", "256", "--timeout-ms", "5000"]  # fmt: skip
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(  # noqa: ASYNC220
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=low_limit
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # blocks until the proxy says it listens
            if "listening on" in line:
                break
        base = f"http://127.0.0.1:{unused_tcp_port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:

            async def one(i: int) -> int:
                try:
                    async with session.post(base + "/v1/completions", json={"prompt": f"x{i}"},
                                            headers={"X-Session-Id": f"s{i}"}) as resp:  # fmt: skip
                        await resp.read()
                        return resp.status
                except aiohttp.ClientError:
                    return 0

            statuses = await asyncio.gather(*(one(i) for i in range(150)))
            assert 200 in statuses and set(statuses) <= {200, 503}, sorted(set(statuses))  # served, or refused early
            assert await one(999) == 200  # and it goes on serving
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert "out of system resource" not in output and "Traceback" not in output, output[-2000:]
