"""The live page at `/`: in a real headless Chromium against the proxy in front of the real llama.cpp server,
and its stream and guards through plain HTTP."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from mellum_proxy.http import RECORDS, UPSTREAMS
from tests.browser import chromium, chromium_binary
from tests.conftest import ProxyFactory
from tests.sse import page_state

CHROMIUM = chromium_binary()
ARTIFACTS = Path(os.environ.get("MELLUM_PROXY_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
SECRET = "def secret_function_name(x):\n    return "


def loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "data" or parts.hostname in ("127.0.0.1", "localhost", "::1")


@pytest.mark.embedded
async def test_the_page_lists_each_completion_as_it_is_answered(make_proxy: ProxyFactory, embedded_server: Any) -> None:
    if CHROMIUM is None:
        if os.environ.get("MELLUM_PROXY_REQUIRE_BROWSER"):  # CI installed it: its absence is a failure
            pytest.fail("no chromium on the PATH, yet MELLUM_PROXY_REQUIRE_BROWSER is set")
        pytest.skip("no chromium here (.ci/run installs Debian's chromium)")
    proxy = await make_proxy(upstream=embedded_server.url, timeout_ms=0)  # `make run`'s proxy, without the deadline
    base = str(proxy.make_url("")).rstrip("/")

    async def complete(prompt: str, session: str) -> str:
        resp = await proxy.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                                headers={"X-Session-Id": session})  # fmt: skip
        assert resp.status == 200
        await resp.json()
        return resp.headers["X-Request-Id"]

    ids = [
        await complete("def add(a, b):\n    return ", "page-1"),
        await complete("def mul(a, b):\n    return ", "page-2"),
    ]
    async with chromium(CHROMIUM) as page:
        await page.open(base + "/")
        await page.until("document.getElementById('connection').textContent === 'live'", 10)
        for rid in ids:  # the completions before the page opened
            await page.until(f"document.querySelector('[data-request-id=\"{rid}\"]')", 5)

        loop = asyncio.get_running_loop()
        rid = await complete("def sub(a, b):\n    return ", "page-3")
        answered = loop.time()
        await page.until(f"document.querySelector('[data-request-id=\"{rid}\"]')", 10)
        assert loop.time() - answered < 1.0  # listed within a second of the answer
        ids.append(rid)

        shown = await page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#timeline tbody tr')].map((tr) => [tr.dataset.requestId,"
            " [tr.querySelector('.outcome').textContent, tr.querySelector('.ttft').textContent]]))"
        )
        records = {record.id: record for record in proxy.app[RECORDS]}
        for rid in ids:
            record = records[rid]
            assert record.ttft_ms is not None
            assert shown[rid] == [record.outcome, str(round(record.ttft_ms))]
        upstream = await page.until("document.querySelector('#upstreams tbody tr')?.textContent", 5)
        assert embedded_server.url in upstream and "serving" in upstream
        member = proxy.app[UPSTREAMS].members[0]
        member.sleep.says = False  # the health watch no longer reads the real server's sleep over what is set here
        member.sleep.asleep, member.sleep.wakes, member.sleep.last_wake_s = True, 2, 1.6  # as a sleeping server's
        asleep = "document.querySelector('#upstreams tbody tr')?.textContent.includes('asleep')"
        await page.until(asleep, 10)  # the next state event says it
        assert "2 (last 1.6 s)" in await page.evaluate("document.querySelector('#upstreams tbody tr').textContent")
        member.sleep.asleep = False
        evidence = await page.until("document.querySelector('#evidence li')?.textContent", 10)  # doctor's reading
        assert evidence.startswith("over the last 2 requests kept")  # what its counts are counted over
        assert "answered since start" in await page.evaluate("document.querySelector('#upstreams thead').textContent")
        now = "(() => { const s = document.getElementById('now'); return [s.scrollWidth, s.clientWidth]; })()"
        scroll, width = await page.evaluate(now)
        assert scroll <= width, (scroll, width)  # no sideways scrolling at 1,400 px

        reports = [REPORTS / "results.json", REPORTS / "lab.json"]
        document = await page.call("DOM.getDocument")
        chooser = await page.call("DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#report-file")
        await page.call("DOM.setFileInputFiles", files=[str(path) for path in reports], nodeId=chooser["nodeId"])
        opened = await page.until("document.querySelectorAll('#report-view .report table').length === 2 &&"
                                  " document.getElementById('report-view').textContent", 10)  # fmt: skip
        assert "debounce-only" in opened and "defaults (embedded-cpu)" in opened  # both reports' policies
        await page.screenshot(ARTIFACTS / "page.png")
    assert page.problems == []  # no console error, exception or failed load
    assert page.urls and all(loopback(url) for url in page.urls), page.urls


async def test_with_a_token_the_page_and_its_stream_ask_for_it(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, auth_token="s3cret-token")
    for path in ("/", "/ui/page.js", "/ui/events"):
        refused = await proxy.get(path)
        assert refused.status == 401 and refused.headers["WWW-Authenticate"].startswith("Basic ")
        wrong = await proxy.get(path, headers={"Authorization": "Basic " + base64.b64encode(b"me:guess").decode()})
        assert wrong.status == 401
    basic = {"Authorization": "Basic " + base64.b64encode(b"me:s3cret-token").decode()}  # as a browser sends it
    page = await proxy.get("/", headers=basic)
    assert page.status == 200 and "text/html" in page.headers["Content-Type"]
    stream = await proxy.get("/ui/events", headers={"Authorization": "Bearer s3cret-token"})
    assert stream.status == 200 and (await stream.content.readline()) == b"event: hello\n"
    stream.close()
    completion = await proxy.post("/v1/completions", json={"prompt": "x"}, headers=basic)
    assert completion.status == 200  # the token as a password opens the rest too


async def test_a_foreign_host_or_origin_is_refused(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url)
    for path in ("/", "/ui/page.css", "/ui/events"):
        assert (await proxy.get(path, headers={"Host": "rebound.example:8000"})).status == 403
        assert (await proxy.get(path, headers={"Origin": "http://rebound.example"})).status == 403
    page = await proxy.get("/")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]  # the page itself asks nothing elsewhere
    assert (await proxy.get("/ui/secrets.txt")).status == 404


async def test_the_stream_carries_requests_and_no_source_text(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream(tokens=3)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0)
    stream = await proxy.get("/ui/events")
    assert await stream.content.readline() == b"event: hello\n"
    answer = await proxy.post("/v1/completions", json={"prompt": SECRET, "max_tokens": 3})
    await answer.json()
    rid = answer.headers["X-Request-Id"]
    seen = b""
    async with asyncio.timeout(10):
        while rid.encode() not in seen:
            seen += await stream.content.readline()
    assert b"event: requests\n" in seen and b"secret_function_name" not in seen
    stream.close()


async def test_an_open_page_does_not_hold_the_shutdown(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url)
    async with aiohttp.ClientSession() as page:  # the page's own connection, apart from the test client's
        stream = await page.get(proxy.make_url("/ui/events"))
        assert await stream.content.readline() == b"event: hello\n"
        async with asyncio.timeout(5):  # aiohttp would wait out its shutdown grace for a stream that never ends
            await proxy.close()
            while await stream.content.readline():  # and the stream ends properly
                pass


async def test_the_page_warns_while_completions_keep_ending_at_the_deadline(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    _, url = await fake_upstream(first_token_delay_s=5.0)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=100)
    for number in range(3):  # three in a row end at the deadline before their first token
        await (await proxy.post("/v1/completions", json={"prompt": f"x{number}"})).json()
    warning = await page_state(proxy, "warning")
    assert warning.startswith("completions show nothing: 3 in a row ended at the deadline (timeout_ms=100)")


async def test_live_pages_have_a_limit_of_their_own_and_a_stalled_one_is_let_go(
    make_proxy: ProxyFactory, fake_upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """260 open streams locked the editor out: past `MAX_PAGES` a page is answered 503 (the editor is served);
    a page that reads nothing is closed after `STALLED_S` of writes that cannot go out."""
    from mellum_proxy.http import page as page_module

    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    opened = [await proxy.get("/ui/events") for _ in range(page_module.MAX_PAGES)]
    for stream in opened:
        assert await stream.content.readline() == b"event: hello\n"
    refused = await proxy.get("/ui/events")
    assert refused.status == 503 and "live pages" in (await refused.json())["error"]["message"]
    assert (await proxy.post("/v1/completions", json={"prompt": "x"})).status == 200
    for stream in opened:
        stream.close()
    pages = proxy.app[page_module.PAGES]
    await proxy.app[RECORDS].changes.wait_for(lambda: pages["open"] == 0, timeout_s=10)

    monkeypatch.setattr(page_module, "STALLED_S", 0.05)
    real_write = web.StreamResponse.write

    async def stalled(self: web.StreamResponse, data: bytes) -> None:
        if data.startswith(b"event: hello"):
            return await real_write(self, data)
        await asyncio.Event().wait()  # a reader that never reads: the write never drains

    monkeypatch.setattr(web.StreamResponse, "write", stalled)
    stuck = await proxy.get("/ui/events")
    assert await stuck.content.readline() == b"event: hello\n"
    await proxy.app[RECORDS].changes.wait_for(lambda: pages["open"] == 0, timeout_s=10)
