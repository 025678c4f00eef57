"""Graceful shutdown: stop accepting, let in-flight requests finish within the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from mellum_proxy.config import Settings
from mellum_proxy.http.server import serve
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.sse import collect_text, events

pytestmark = pytest.mark.embedded


async def test_in_flight_stream_finishes_after_stop(embedded_server: EmbeddedServer, unused_tcp_port: int) -> None:
    # The grace period is far longer than 40 tokens take on a busy machine: the test is about finishing
    # within it, not about how fast this machine decodes (5 s was not enough once, under load).
    settings = Settings(
        upstream=embedded_server.url,
        listen=f"127.0.0.1:{unused_tcp_port}",
        debounce_ms=0,
        timeout_ms=0,
        shutdown_timeout_s=60,
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(settings, stop))
    url = f"http://{settings.listen}/v1/completions"
    body = {
        "prompt": "def add(a, b):\n",
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
        "ignore_eos": True,
    }
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # the server task needs a moment to bind; connecting is the signal
                with contextlib.suppress(aiohttp.ClientConnectorError):
                    resp = await session.post(url, json=body)
                    break
                await asyncio.sleep(0.05)
            first = await anext(events(resp))  # the request is in flight
            stop.set()
            text, seen = await collect_text(resp)
            assert seen[-1] == "[DONE]"  # finished, not cut off
            assert isinstance(first, dict)
            assert len(text) > 0
            await asyncio.wait_for(server, timeout=settings.shutdown_timeout_s + 5)
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.post(url, json=body)
    finally:
        stop.set()
        await server


async def test_streams_longer_than_the_grace_end_with_their_final_event(
    fake_upstream: Any, unused_tcp_port: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At the end of the grace every open stream gets its dialect's final event and its record says
    `shutdown`; the log is complete, and no task outlives the upstream session (no traceback)."""
    _fake, upstream = await fake_upstream(tokens=100_000, token_delay_s=0.02, slots=64)
    log = tmp_path / "requests.jsonl"
    settings = Settings(upstream=upstream, listen=f"127.0.0.1:{unused_tcp_port}", timeout_ms=0, tokenizer="chars",
                        max_tokens=100_000, max_context_tokens=131_072, shutdown_timeout_s=0.5, log=log,
                        reuse=False)  # fmt: skip
    stop = asyncio.Event()
    server = asyncio.create_task(serve(settings, stop))
    base = f"http://{settings.listen}"
    bodies: dict[str, tuple[dict[str, str], Callable[[bytes], bool], bytes | None]] = {
        "/v1/completions": ({"prompt": "x = "}, lambda last: b'"finish_reason":"length"' in last, b"data: [DONE]"),
        "/infill": ({"input_prefix": "x = ", "input_suffix": ""}, lambda last: b'"stop":true' in last, None),
        "/completion": ({"prompt": "x = "}, lambda last: b'"stop":true' in last, None),
        "/api/generate": ({"prompt": "x = ", "model": "m"}, lambda last: b'"done":true' in last, None),
    }
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_listening(session, base)
            streams = [
                await session.post(base + path, json={**body, "stream": True}, headers={"X-Session-Id": f"{path}{i}"})
                for path, (body, _, _) in bodies.items() for i in range(5)
            ]  # fmt: skip
            for resp in streams:
                await resp.content.readline()  # each has begun
            with caplog.at_level(logging.WARNING):
                stopped = asyncio.get_running_loop().time()
                stop.set()
                raws = await asyncio.gather(*(resp.read() for resp in streams))
                ended = asyncio.get_running_loop().time() - stopped
                await asyncio.wait_for(server, 10)
        assert ended < settings.shutdown_timeout_s + 0.2 + 1.0  # the grace, the accept window, one second
        for (path, (_, final, end)), chunk in zip(
            [(p, b) for p, b in bodies.items() for _ in range(5)], range(len(streams)), strict=True
        ):
            raw = raws[chunk].rstrip(b"\n")
            last = raw.split(b"\n")[-1] if end is None else raw.split(b"\n\n")[-2]
            assert final(last), (path, raw[-300:])
            if end is not None:
                assert raw.endswith(end)
        lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
        assert len(lines) == 20 and {line["outcome"] for line in lines} == {"shutdown"}
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        stop.set()
        await server


async def _wait_listening(session: aiohttp.ClientSession, base: str) -> None:
    for _ in range(200):  # the server task needs a moment to bind; connecting is the signal
        with contextlib.suppress(aiohttp.ClientConnectorError):
            async with session.get(base + "/health") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.05)


async def test_sigterm_during_50_long_streams_ends_each_one_and_exits_cleanly(
    fake_upstream: Any, unused_tcp_port: int, tmp_path: Path
) -> None:
    """`mellum-proxy serve` as a process: SIGTERM while 50 streams in every dialect run past the grace."""
    import signal
    import sys

    _, upstream = await fake_upstream(tokens=100_000, token_delay_s=0.02, slots=64)
    log = tmp_path / "requests.jsonl"
    base = f"http://127.0.0.1:{unused_tcp_port}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mellum_proxy", "serve", "--upstream", upstream, "--listen", base[7:],
        "--timeout-ms", "0", "--tokenizer", "chars", "--max-tokens", "100000", "--max-context-tokens", "131072",
        "--shutdown-timeout-s", "1",
        "--log", str(log), "--no-reuse", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    paths = ["/v1/completions", "/infill", "/completion", "/api/generate"]
    body = {"prompt": "x = ", "input_prefix": "x = ", "model": "m", "stream": True}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await _wait_listening(session, base)
            streams = [
                await session.post(base + paths[i % 4], json=body, headers={"X-Session-Id": str(i)}) for i in range(50)
            ]
            for resp in streams:
                await resp.content.readline()
            process.send_signal(signal.SIGTERM)
            stopped = asyncio.get_running_loop().time()
            raws = await asyncio.gather(*(resp.read() for resp in streams))
            ended = asyncio.get_running_loop().time() - stopped
        output = (await asyncio.wait_for(process.stdout.read(), 30)).decode()  # type: ignore[union-attr]
        assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert ended < 1 + 0.2 + 1.0, ended  # the grace, the accept window, one second
    finals = {"/v1/completions": b"data: [DONE]", "/infill": b'"stop":true', "/completion": b'"stop":true',
              "/api/generate": b'"done":true'}  # fmt: skip
    for i, raw in enumerate(raws):
        assert finals[paths[i % 4]] in raw.rstrip()[-400:], raw[-300:]
    assert "Traceback" not in output and "ERROR" not in output, output[-2000:]
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert len(lines) == 50 and {line["outcome"] for line in lines} == {"shutdown"}
