"""No web page can use the proxy: what a page in the developer's browser can send, refused on every route.

A page can POST cross-origin without asking first (`text/plain`, a form), and through DNS rebinding (its
own name re-pointed at 127.0.0.1) read what it gets back. Plugins send no `Origin` and name this machine.
"""

from __future__ import annotations

from typing import Any

import pytest

from mellum_proxy.http import RECORDS
from tests.conftest import ProxyFactory
from tests.shapes import SHAPES, ollama_shape, openai_shape

ROUTES = [
    ("POST", "/v1/completions", {"prompt": "x = "}),
    ("POST", "/infill", {"input_prefix": "x = ", "input_suffix": ""}),
    ("POST", "/completion", {"prompt": "x = "}),
    ("POST", "/api/generate", {"prompt": "x = ", "model": "m", "stream": False}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/v1/models", None),
    ("GET", "/api/tags", None),
    ("GET", "/status", None),
    ("GET", "/metrics", None),
    ("GET", "/health", None),
]
PAGES = [
    {"Origin": "https://attacker.example"},  # a page elsewhere
    {"Origin": "null"},  # a sandboxed page, or a file opened in the browser
    {"Origin": "http://127.0.0.1:3000"},  # another local web app is a page too
    {"Host": "attacker.example:8011"},  # DNS rebinding: the page's own name, re-pointed at loopback
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port on this machine
]


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, fake_upstream: Any) -> Any:
    fake, url = await fake_upstream()
    client = await make_proxy(upstream=url, tokenizer="chars", upstream_api_key="team-key-123")
    client.fake = fake  # type: ignore[attr-defined]  # the test's own handle on the upstream
    return client


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("page", PAGES, ids=lambda page: ",".join(f"{k}={v}" for k, v in page.items()))
async def test_every_route_refuses_a_web_page(
    proxy: Any, method: str, path: str, body: dict[str, Any] | None, page: dict[str, str]
) -> None:
    resp = await proxy.request(method, path, json=body, headers=page)
    assert resp.status == 403, (path, page)
    shape = ollama_shape if path.startswith("/api/") else SHAPES.get(path, openai_shape)
    assert shape(await resp.json(), 403)  # in the route's own dialect
    assert proxy.fake.payloads == [] and proxy.fake.headers == []  # nothing reached the upstream, no key sent


@pytest.mark.parametrize(
    "content_type", ["text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"]
)
async def test_a_body_a_page_can_send_without_asking_is_refused(proxy: Any, content_type: str) -> None:
    resp = await proxy.post("/v1/completions", data=b'{"prompt": "x = "}', headers={"Content-Type": content_type})
    assert resp.status == 415 and openai_shape(await resp.json(), 415)
    assert proxy.app[RECORDS].last().outcome == "bad_request" and proxy.fake.payloads == []


async def test_what_plugins_send_is_served(proxy: Any) -> None:
    """No Origin, this machine's name: the proxy's own page (same origin) and curl with a JSON body are served
    (a bare `curl -d`'s form content type is what a page may send without asking: refused, naming JSON)."""
    for headers in ({}, {"Host": "localhost:8011"}, {"Origin": f"http://{proxy.host}:{proxy.port}"},
                    {"Sec-Fetch-Site": "same-origin"}):  # fmt: skip
        resp = await proxy.post("/v1/completions", json={"prompt": "x = "}, headers=headers)
        assert resp.status == 200, headers
    curl = await proxy.post("/v1/completions", data=b'{"prompt": "x = "}',
                            headers={"Content-Type": "application/json", "User-Agent": "curl/8.5.0"})  # fmt: skip
    assert curl.status == 200
    bare = await proxy.post("/v1/completions", data=b'{"prompt": "x = "}',
                            headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert bare.status == 415 and "send application/json" in (await bare.json())["error"]["message"]


async def test_clients_that_name_no_session_do_not_read_each_others_completions(proxy: Any) -> None:
    """Without X-Session-Id or `user`, each client (by its User-Agent) has a session of its own: one
    editor's completion is never another's typed-through answer."""
    body = {"prompt": "def total(items):\n    return ", "suffix": "\n"}
    await proxy.post("/v1/completions", json=body, headers={"User-Agent": "editor-a"})
    typed = {**body, "prompt": body["prompt"] + "t0"}
    other = await proxy.post("/v1/completions", json=typed, headers={"User-Agent": "editor-b"})
    assert other.headers["X-Mellum-Outcome"] == "ok" and len(proxy.fake.payloads) == 2
    same = await proxy.post("/v1/completions", json=typed, headers={"User-Agent": "editor-a"})
    assert same.headers["X-Mellum-Outcome"] == "reused" and len(proxy.fake.payloads) == 2
