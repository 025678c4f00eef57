"""The upstream client's connection handling and the relay's pass-through, against real servers."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from mellum_proxy.dialects.openai import DONE, sse, text_completion
from mellum_proxy.errors import UpstreamError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest
from mellum_proxy.tuning.sim.responder import Responder
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory

REQUEST = NormalizedRequest(id="r", route="openai", session="s", prefix="def fib(n):", max_tokens=4)
PROMPT = BudgetedPrompt("def fib(n):", None, 4, (), 8, 8, False, "bytes")


def counting_session() -> tuple[aiohttp.ClientSession, list[int]]:
    """A session that counts the TCP connections it opens."""
    opened: list[int] = []
    trace = aiohttp.TraceConfig()

    async def on_create(*_: Any) -> None:
        opened.append(1)

    trace.on_connection_create_end.append(on_create)
    return aiohttp.ClientSession(trace_configs=[trace]), opened


async def texts(upstream: UpstreamClient) -> str:
    return "".join([chunk.text async for batch in upstream.stream_completion(REQUEST, PROMPT) for chunk in batch])


async def test_a_finished_stream_gives_its_connection_back(fake_upstream: Any) -> None:
    _, url = await fake_upstream(tokens=3)
    session, opened = counting_session()
    async with session:
        upstream = UpstreamClient(session, url)
        assert [await texts(upstream) for _ in range(3)] == ["t0 t1 t2 "] * 3
    assert len(opened) == 1  # the end of the chunked body was read after [DONE], so the socket was reused


@pytest.mark.embedded
async def test_back_to_back_streams_survive_llama_cpp_closing_the_connection(embedded_server: EmbeddedServer) -> None:
    """llama.cpp closes the connection after a streamed answer; the next request, sent at once on
    the pooled socket, is sent again on a fresh one instead of failing with 502."""
    async with aiohttp.ClientSession() as session:
        assert embedded_server.url is not None
        upstream = UpstreamClient(session, embedded_server.url)
        results = [await texts(upstream) for _ in range(4)]
    assert all(results)


async def test_the_client_sees_the_upstreams_text_events_unchanged(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream(tokens=3)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars")
    resp = await proxy.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 3, "stream": True})
    events = [event + b"\n\n" for event in (await resp.read()).split(b"\n\n") if event]
    created = orjson.loads(events[0][6:])["created"]
    assert events[:3] == [sse(text_completion("fake-1", created, "fake", f"t{i} ", None)) for i in range(3)]
    final = orjson.loads(events[3][6:])
    assert final["id"] == "fake-1" and final["choices"][0]["finish_reason"] == "length"  # the upstream's id
    assert events[4:] == [DONE] and fake.completed == 1


async def test_an_upstream_that_ignores_stream_true_still_gives_its_text(aiohttp_server: Any) -> None:
    async def answer_json(request: web.Request) -> web.StreamResponse:
        answer = Responder(request, {"stream": False}, "j", "m")  # whatever the request asked
        await answer.write("whole answer")
        return await answer.finish("stop", {"prompt_tokens": 3})

    app = web.Application()
    app.router.add_post("/v1/completions", answer_json)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        batches = [batch async for batch in UpstreamClient(session, str(server.make_url(""))).stream_completion(
            REQUEST, PROMPT
        )]  # fmt: skip
    assert [(c.text, c.finish_reason, c.usage) for b in batches for c in b] == [
        ("whole answer", "stop", {"prompt_tokens": 3})
    ]


@pytest.mark.embedded
async def test_let_go_waits_for_the_real_server_to_drop_a_cancelled_request(embedded_server: EmbeddedServer) -> None:
    """llama.cpp keeps working on a request after its client closed the connection; `let_go` returns once
    the server's own gauges say it holds nothing more than allowed."""
    long = NormalizedRequest(id="r", route="openai", session="s", prefix="def fib(n):", max_tokens=400)
    prompt = BudgetedPrompt("def fib(n):", None, 400, (), 8, 8, False, "bytes")
    async with aiohttp.ClientSession() as session:
        upstream = UpstreamClient(session, str(embedded_server.url))
        stream = upstream.stream_completion(long, prompt)
        await anext(stream)  # decoding has started
        await stream.aclose()  # the connection is closed, as when a request is superseded
        assert await upstream.let_go(lambda held: held == 0, timeout_s=30) is True
        assert await upstream.held() == 0


async def test_held_reads_llama_cpp_gauges_and_says_when_it_cannot(aiohttp_server: Any) -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    bare = await aiohttp_server(web.Application())
    async with aiohttp.ClientSession() as session:
        assert await UpstreamClient(session, str(server.make_url(""))).held() == 3
        silent = UpstreamClient(session, str(bare.make_url("")))
        assert await silent.held() is None
        assert await silent.let_go(lambda held: held == 0, timeout_s=1) is False  # the fallback rule applies


def test_what_vllm_holds_is_read_from_its_own_metrics() -> None:
    """vLLM 0.32.0's real `/metrics`, captured with two completions running (tests/fixtures/servers/)."""
    from pathlib import Path

    from mellum_proxy.upstream.metrics import held_from_metrics
    from mellum_proxy.upstream.servers import GENERIC, holding_kinds

    gauges = [kind.held_gauges for kind in holding_kinds(GENERIC)]  # every kind's, as before discovery
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "servers" / "vllm-0.32.0-metrics.txt").read_text()
    assert held_from_metrics(text, gauges) == 2
    two_engines = text + 'vllm:num_requests_waiting{engine="1",model_name="gemma3-270m"} 3.0\n'
    assert held_from_metrics(two_engines, gauges) == 5  # summed over the engines' label sets
    assert held_from_metrics("# HELP other_metric x\nother_metric 1.0\n", gauges) is None  # says neither
    assert held_from_metrics("<html>not metrics</html>", gauges) is None


async def test_a_connection_the_server_closed_is_tried_again_once_never_twice() -> None:
    """A server that restarted (or a laptop that slept) leaves the pool a connection it has closed: a request sent
    on it that got no answer is sent once more on a new connection; a server that drops every request is not
    asked a third time."""
    import asyncio

    attempts: list[int] = []
    drop_all = {"on": False}
    answer = b'{"data": [{"id": "m"}]}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        while await reader.readuntil(b"\r\n\r\n"):
            attempts.append(1)
            if drop_all["on"] or served == 1:  # the second request on a connection finds it closed, unanswered
                writer.close()
                return
            served += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))  # fmt: skip
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, aiohttp.ClientSession() as session:
        upstream = UpstreamClient(session, url)
        assert await upstream.post_json("/tokenize", {}) == {"data": [{"id": "m"}]}  # a POST: aiohttp retries none
        assert await upstream.post_json("/tokenize", {}) == {"data": [{"id": "m"}]}  # its pooled connection was
        assert len(attempts) == 3 and upstream.reconnected  # closed: sent again on a new one, answered
        drop_all["on"] = True
        attempts.clear()
        with pytest.raises(UpstreamError):
            await upstream.post_json("/tokenize", {})
        assert len(attempts) == 2  # once more, never twice


STOPPED_AT_ONCE = """
from mellum_proxy.upstream.embedded import EmbeddedServer
for _ in range(3):
    server = EmbeddedServer(ctx_tokens=256, slots=1)
    server.start()
    server.stop()
print("stopped")
"""


@pytest.mark.embedded
def test_a_server_stopped_the_moment_it_started_stops() -> None:
    """xllamacpp returns from its start before llama.cpp's task loop runs, and a stop in that gap used to wait
    forever (the fresh-clone CI beside two busy loops hung on it): `start` now returns once the loop answers."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STOPPED_AT_ONCE], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-2000:]
