"""One error middleware renders every error in the route's own dialect and records it.

OpenAI `{"error": {"message", "type"}}`, llama.cpp `{"error": {"code", "message", "type"}}` (its
`format_error_response`), Ollama `{"error": "message"}`; a completion request that fails before the
service has it is recorded here as `bad_request`, one that fails upstream as `upstream_error`.
"""

from __future__ import annotations

from typing import Any

from mellum_proxy.http import RECORDS
from tests.conftest import ProxyFactory
from tests.shapes import NAMES, SHAPES, llamacpp_shape, ollama_shape


async def test_413_in_every_dialects_shape_and_recorded(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars", max_body_bytes=1024)
    for path, shape in SHAPES.items():
        resp = await proxy.post(path, json={"prompt": "x" * 4096}, headers={"X-Session-Id": "ed"})
        assert resp.status == 413, path
        assert shape(await resp.json(), 413), (path, await resp.text())
        record = proxy.app[RECORDS].last()
        assert (record.outcome, record.dialect, record.session, record.upstream_status) == (
            "bad_request", NAMES[path], "ed", 413
        )  # fmt: skip
    assert fake.payloads == []


async def test_bad_json_in_every_dialects_shape(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars")
    for path, shape in SHAPES.items():
        resp = await proxy.post(path, data=b"{not json")
        assert resp.status == 400 and shape(await resp.json(), 400), path
        assert proxy.app[RECORDS].last().outcome == "bad_request"
    assert len(proxy.app[RECORDS]) == len(SHAPES)


async def test_unreachable_upstream_is_a_502_in_the_dialects_shape(
    make_proxy: ProxyFactory, unused_tcp_port: int
) -> None:
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{unused_tcp_port}", debounce_ms=0, tokenizer="chars")
    bodies = {"/infill": {"input_prefix": "x = ", "input_suffix": ""}, "/api/generate": {"prompt": "x = "},
              "/completion": {"prompt": "x = "}, "/v1/completions": {"prompt": "x = "}}  # fmt: skip
    for path, body in bodies.items():
        resp = await proxy.post(path, json=body)
        assert resp.status == 502 and SHAPES[path](await resp.json(), 502), path
        record = proxy.app[RECORDS].last()
        assert (record.outcome, record.dialect, record.upstream_status) == ("upstream_error", NAMES[path], 502)


async def test_wrong_method_and_unknown_path(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    infill = await proxy.get("/infill")
    assert infill.status == 405 and llamacpp_shape(await infill.json(), 405)
    generate = await proxy.get("/api/generate")
    assert generate.status == 405 and ollama_shape(await generate.json(), 405)
    missing = await proxy.get("/v2/nothing")
    assert missing.status == 404 and (await missing.json())["error"]["type"] == "not_found"
    show = await proxy.post("/api/show", json={})
    assert show.status == 400 and ollama_shape(await show.json(), 400)
    assert [r.outcome for r in proxy.app[RECORDS]] == ["bad_request", "bad_request"]  # the two completion routes
    assert (await proxy.get("/health")).status == 200  # still serving


async def test_stream_options_that_is_not_an_object_is_a_400_naming_it(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars")
    for path in ("/infill", "/completion", "/v1/completions"):
        resp = await proxy.post(path, json={"prompt": "x", "stream": True, "stream_options": "yes"})
        body = await resp.json()
        assert resp.status == 400 and SHAPES[path](body, 400), path
        assert "'stream_options' must be an object" in str(body)
    assert fake.payloads == []
    served = await proxy.post("/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": False}})
    assert served.status == 200 and fake.payloads[0]["stream_options"] == {"include_usage": False}
