"""The live page beside chat traffic, in a real headless Chromium 1,000 px wide: chats and agents in a lane of their
own (table and chart), legends that name the outcomes they count, values that stay whole; and the deadline warning
that names traffic the proxy did not send."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from mellum_proxy.models import Outcome
from mellum_proxy.tuning.sim.responder import answering, routes
from tests.browser import chromium, chromium_binary
from tests.conftest import ProxyFactory
from tests.sse import page_state

CHROMIUM = chromium_binary()
ARTIFACTS = Path(os.environ.get("MELLUM_PROXY_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
CHAT = {"messages": [{"role": "user", "content": "explain this function"}], "stream": True}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def chat_server(held: list[int], completion: Handler | None = None) -> web.Application:
    """Completions answer at once (or as `completion` does); a chat streams a sentence; `/slots` says the server
    holds `held[0]` requests."""

    async def answer_at_once(request: web.Request) -> web.StreamResponse:  # a speculating llama.cpp's answer
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "t0 ", "index": 0, "finish_reason": "length"}], '
                             b'"usage": {"prompt_tokens": 3, "completion_tokens": 1}, '
                             b'"timings": {"draft_n": 4, "draft_n_accepted": 3}}\n\ndata: [DONE]\n\n')  # fmt: skip
        await response.write_eof()
        return response

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "Sure."}, "finish_reason": "stop"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def slots(request: web.Request) -> web.Response:
        return web.json_response([{"id": i, "is_processing": True} for i in range(held[0])])

    return routes({
        "POST /v1/completions": completion or answer_at_once, "POST /v1/chat/completions": chat, "GET /slots": slots,
        "GET /props": answering({"total_slots": 2}), "GET /health": answering({"status": "ok"}),
    })  # fmt: skip


async def test_chats_have_their_own_lane_and_the_page_reads_whole_at_1000px(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    if CHROMIUM is None:
        if os.environ.get("MELLUM_PROXY_REQUIRE_BROWSER"):  # CI installed it: its absence is a failure
            pytest.fail("no chromium on the PATH, yet MELLUM_PROXY_REQUIRE_BROWSER is set")
        pytest.skip("no chromium here (.ci/run installs Debian's chromium)")
    upstream = await aiohttp_server(chat_server([0]))
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", timeout_ms=0)
    base = str(proxy.make_url("")).rstrip("/")
    assert (await proxy.post("/v1/completions", json={"prompt": "def f("})).status == 200
    chat = await proxy.post("/v1/chat/completions", json=CHAT)
    assert chat.status == 200 and (await chat.read()).endswith(b"data: [DONE]\n\n")
    rid = chat.headers["X-Request-Id"]
    async with chromium(CHROMIUM, width=1000) as page:
        await page.open(base + "/")
        row = await page.until(f"document.querySelector('#chats [data-request-id=\"{rid}\"]')?.textContent", 10)
        assert "ok" in row and "200" in row and "explain" not in await page.evaluate("document.body.innerText")
        await page.until("document.querySelectorAll('#chart-chats polyline, #chart-chats circle').length > 0", 10)
        await page.until("document.querySelector('#upstreams tbody tr')", 10)
        legends = await page.evaluate("[...document.querySelectorAll('#chart-outcomes text.legend')]"
                                      ".map((t) => t.textContent)")  # fmt: skip
        named = {name for legend in legends for name in legend.split("/")}
        assert named == {str(outcome) for outcome in Outcome}, legends  # every outcome, and only outcomes
        counts = await page.until("document.getElementById('counts').textContent", 5)
        assert "75 %draft acceptance (3 of 4)" in counts  # the server's speculation, from its own timings
        broken = await page.evaluate("""[...document.querySelectorAll('#upstreams tbody td, #counts b, #chats td')]
            .flatMap((cell) => { const texts = [], walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
                                 while (walk.nextNode()) texts.push(walk.currentNode); return texts; })
            .filter((text) => { const range = document.createRange(); range.selectNodeContents(text);
                                return range.getClientRects().length > 1; })
            .map((text) => text.textContent)""")  # a value broken over lines: its text in more than one box
        assert broken == []
        overlapping = await page.evaluate("""[...document.querySelectorAll('svg')].some((svg) => {
            const boxes = [...svg.querySelectorAll('text.legend')].map((t) => t.getBoundingClientRect());
            return boxes.some((a, i) => boxes.some((b, j) => i < j && a.left < b.right && b.left < a.right
                                                   && a.top < b.bottom && b.top < a.bottom)); })""")
        assert overlapping is False
        scroll, width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert scroll <= width, (scroll, width)
        await page.screenshot(ARTIFACTS / "page-1000px.png")
    assert page.problems == []


async def test_the_warning_names_traffic_the_proxy_did_not_send(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    """Chats pointed straight at the server fill it: the proxy's completions end at the deadline, and the warning
    names the server's other requests instead of only the deadline or the server's speed."""

    held = [2]  # the others' chats, and each completion while the server has it

    async def slow_completion(request: web.Request) -> web.StreamResponse:
        held[0] += 1
        try:
            await asyncio.sleep(5)  # never within the deadline: the server is full of others' work
            return web.json_response({})
        finally:
            held[0] -= 1  # the proxy hung up: the server lets it go

    upstream = await aiohttp_server(chat_server(held, slow_completion))
    proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", timeout_ms=100, reuse=False)
    for number in range(3):
        await (await proxy.post("/v1/completions", json={"prompt": f"x{number}"})).json()
    warning = await page_state(proxy, "warning")
    assert warning.startswith("completions show nothing: 3 in a row")
    assert "the server holds 2 request(s) beyond those the proxy has running there" in warning
