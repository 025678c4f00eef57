"""The proxy in front of the real llama.cpp server: transparent completions, streaming, health, errors."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mellum_proxy.http import RECORDS
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.sse import collect_text, events

pytestmark = pytest.mark.embedded

PROMPT = "def fibonacci(n):\n"
GREEDY = {"temperature": 0, "seed": 42, "max_tokens": 24}


async def direct(url: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The same request straight to the upstream: (text, usage)."""
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        if body.get("stream"):
            text, seen = await collect_text(resp)
            usage = next((e.get("usage") for e in seen if isinstance(e, dict) and e.get("usage")), None)
            return text, usage
        data = await resp.json()
        return data["choices"][0]["text"], data.get("usage")


async def test_non_stream_completion_equals_direct(embedded_server: EmbeddedServer, embedded_proxy: Any) -> None:
    body = {"prompt": PROMPT, **GREEDY}
    expected, _ = await direct(str(embedded_server.url), body)
    resp = await embedded_proxy.post("/v1/completions", json=body)
    assert resp.status == 200
    data = await resp.json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == expected
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 24
    assert resp.headers["X-Request-Id"]


async def test_stream_completion_equals_direct(embedded_server: EmbeddedServer, embedded_proxy: Any) -> None:
    body = {"prompt": PROMPT, **GREEDY, "stream": True}
    expected, _ = await direct(str(embedded_server.url), body)
    resp = await embedded_proxy.post("/v1/completions", json=body)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    text, seen = await collect_text(resp)
    assert text == expected
    assert seen[-1] == "[DONE]"
    final = seen[-2]
    assert isinstance(final, dict)
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 24  # usage from the upstream is passed on


async def test_first_chunk_reaches_client_while_upstream_still_generates(
    embedded_server: EmbeddedServer, embedded_proxy: Any
) -> None:
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 300, "stream": True, "ignore_eos": True}
    resp = await embedded_proxy.post("/v1/completions", json=body)
    async with aiohttp.ClientSession() as session:
        async for event in events(resp):
            assert isinstance(event, dict)
            if event["choices"][0]["text"]:
                async with session.get(f"{embedded_server.url}/slots") as slots:
                    busy = [slot["is_processing"] for slot in await slots.json()]
                break
    assert any(busy), "the first chunk arrived only after the upstream had finished"
    rest = [event async for event in events(resp)]
    assert rest[-1] == "[DONE]"


async def test_record_knows_time_to_first_token(embedded_proxy: Any) -> None:
    from mellum_proxy.http import RECORDS

    resp = await embedded_proxy.post("/v1/completions", json={"prompt": PROMPT, **GREEDY, "stream": True})
    await collect_text(resp)
    record = embedded_proxy.app[RECORDS].last()
    assert record.outcome == "ok"
    assert 0 < record.ttft_ms < record.total_ms


async def test_health_follows_the_upstream(make_proxy: ProxyFactory) -> None:
    server = EmbeddedServer(ctx_tokens=512, slots=1)
    server.start()
    port = server.port
    try:
        proxy = await make_proxy(upstream=server.url, timeout_ms=0)
        ok = await proxy.get("/health")
        assert ok.status == 200
        assert await ok.json() == {"status": "ok", "upstream": {"url": server.url, "reachable": True}}
        server.stop()
        down = await proxy.get("/health")
        assert down.status == 503
        assert (await down.json())["upstream"]["reachable"] is False
        server = EmbeddedServer(ctx_tokens=512, slots=1, port=port)
        server.start()
        back = await proxy.get("/health")
        assert back.status == 200
    finally:
        server.stop()


async def test_models_and_chat_are_passed_through(embedded_proxy: Any) -> None:
    models = await embedded_proxy.get("/v1/models")
    assert models.status == 200
    assert (await models.json())["data"][0]["id"] == "gemma-3-270m-q4_k_m"  # named by the model, not its path
    chat = await embedded_proxy.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "stream": True},
    )
    assert chat.status == 200
    _, seen = await collect_text(chat)
    assert seen[-1] == "[DONE]"


async def test_upstream_error_status_and_message_are_passed_on(embedded_proxy: Any) -> None:
    """The chat route is not budgeted: llama.cpp's own 400 for a prompt past its context comes through."""
    chat = {"messages": [{"role": "user", "content": "hello " * 3000}], "max_tokens": 4}
    resp = await embedded_proxy.post("/v1/chat/completions", json=chat)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "exceed_context_size_error"
    assert "context size" in error["message"]
    # and the proxy keeps serving
    again = await embedded_proxy.post("/v1/completions", json={"prompt": PROMPT, **GREEDY})
    assert again.status == 200


async def test_a_completion_past_the_servers_context_per_request_is_fitted(embedded_proxy: Any) -> None:
    """The suite's server has 2 slots of 2,048 tokens; the proxy was told 1<<20. It reads the server's
    context per request (`/props` `default_generation_settings.n_ctx`) and fits the prompt into it."""
    from mellum_proxy.http import RECORDS

    resp = await embedded_proxy.post("/v1/completions", json={"prompt": "hello " * 3000, "max_tokens": 4})
    assert resp.status == 200
    record = embedded_proxy.app[RECORDS].last()
    assert record.truncated and record.prompt_tokens_after is not None and record.prompt_tokens_after <= 2048 - 4


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens"),
        (b'{"prompt": 3}', 400, "prompt"),
        (b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
        (b'{"prompt": "x", "n": 2}', 400, "'n'"),
        (b'{"prompt": "x\\ud800", "max_tokens": NaN}', 400, "not valid JSON"),  # the repair path refuses NaN too
    ],
)
async def test_bad_input_is_a_json_400(embedded_proxy: Any, body: bytes, status: int, needle: str) -> None:
    resp = await embedded_proxy.post("/v1/completions", data=body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"


async def test_a_prompt_cut_inside_an_emoji_is_served(embedded_proxy: Any) -> None:
    """JavaScript's JSON.stringify writes a lone surrogate as `\\ud83d`; orjson refuses it, the proxy repairs it."""
    body = b'{"prompt": "def smile():\\n    return \\"\\ud83d", "max_tokens": 4, "temperature": 0}'
    resp = await embedded_proxy.post("/v1/completions", data=body)
    assert resp.status == 200, await resp.text()
    assert embedded_proxy.app[RECORDS].last().outcome == "ok"


async def test_body_over_the_limit_is_413(make_proxy: ProxyFactory, embedded_server: EmbeddedServer) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, timeout_ms=0, max_body_bytes=2048)
    resp = await proxy.post("/v1/completions", json={"prompt": "x" * 4096})
    assert resp.status == 413
    assert (await resp.json())["error"]["type"] == "request_too_large"


async def test_unknown_path_is_a_json_404(embedded_proxy: Any) -> None:
    resp = await embedded_proxy.get("/v2/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["type"] == "not_found"


async def test_refused_upstream_is_a_502_not_a_wait(make_proxy: ProxyFactory, unused_tcp_port: int) -> None:
    """No deadline to end it: the answer is the refusal itself (by state, not by a clock on a busy machine)."""
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{unused_tcp_port}", debounce_ms=0, timeout_ms=0)
    resp = await proxy.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert resp.status == 502
    assert proxy.app[RECORDS].last().error == "upstream_unreachable"
    assert (await resp.json())["error"]["type"] == "upstream_unavailable"
    health = await proxy.get("/health")
    assert health.status == 503
