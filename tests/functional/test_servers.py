"""Servers other than the embedded llama.cpp build, from their documented shapes.

Each fake follows a file of the server's own source, cited at the fake.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from bench.fake_upstream import FakeUpstream
from proxy.http import POLICIES, RECORDS
from tests.conftest import ProxyFactory


def ids_only_tokenize(app: web.Application) -> None:
    """`/tokenize` that ignores `with_pieces` and answers bare ids, as llama.cpp builds before pieces did
    (tools/server: `tokens` a list of ints) and as vLLM does (entrypoints/openai/protocol.py
    `TokenizeResponse`: `tokens: list[int]`, `count`, `max_model_len`)."""

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        text = str(body.get("content", body.get("prompt", "")))
        tokens = list(range(len(text) // 3 + 1))
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    app.router.add_post("/tokenize", tokenize)


@pytest.mark.parametrize("tokenizer", ["auto", "upstream"])
async def test_a_tokenize_without_pieces_never_empties_the_prompt(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture, tokenizer: str
) -> None:
    fake = FakeUpstream()
    app = fake.app()
    ids_only_tokenize(app)
    upstream = await aiohttp_server(app)
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(
            upstream=str(upstream.make_url("")), tokenizer=tokenizer, max_context_tokens=512, reuse=False
        )
        prefix = "".join(f"value_{i} = compute({i})\n" for i in range(400)) + "result = "
        for _ in range(2):
            resp = await proxy.post("/v1/completions", json={"prompt": prefix, "suffix": "\nprint(result)\n"})
            assert resp.status == 200
    sent = fake.payloads[-1]["prompt"]
    assert "value_399 = compute(399)\nresult = " in sent  # the text nearest the cursor is kept
    assert 300 < len(sent) < 512 * 4
    assert proxy.app[RECORDS].last().tokenizer == "chars"
    assert sum("without their pieces" in message for message in caplog.messages) >= 1


VLLM_MODEL = "JetBrains/Mellum-4b-base"


def vllm_shaped(fake: FakeUpstream, key: str) -> web.Application:
    """What vLLM's OpenAI server asks of a client (vllm/entrypoints/openai/api_server.py): `Authorization:
    Bearer KEY` on `/v1/*` when started with `--api-key` (401 `{"error": "Unauthorized"}`), the served model
    name in `model` (serving_engine.py `_check_model`: 404 `The model ... does not exist.`), no `/props`
    nor `/slots`, and `/v1/models` listing the one served name."""
    app = fake.app()

    @web.middleware
    async def vllm_rules(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if request.path == "/props":
            raise web.HTTPNotFound()
        if request.path == "/v1/completions":
            model = (await request.json()).get("model")
            if model != VLLM_MODEL:
                message = f"The model `{model}` does not exist."
                return web.json_response({"object": "error", "message": message, "type": "NotFoundError",
                                          "code": 404}, status=404)  # fmt: skip
        return await handler(request)

    async def models(request: web.Request) -> web.Response:
        entry = {"id": VLLM_MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 1024}
        return web.json_response({"object": "list", "data": [entry]})

    app.middlewares.append(vllm_rules)
    app.router.add_get("/v1/models", models)
    return app


BODIES = {
    "/v1/completions": {"prompt": "def f(", "suffix": ")", "model": "mellum"},  # what the shipped configs send
    "/infill": {"input_prefix": "def f(", "input_suffix": ")"},
    "/completion": {"prompt": "def f("},
    "/api/generate": {"prompt": "def f(", "suffix": ")", "model": "mellum", "stream": False},
}


async def test_a_vllm_shaped_upstream_gets_its_model_name_and_key(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream()
    upstream = await aiohttp_server(vllm_shaped(fake, "team-key-123"))
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=str(upstream.make_url("")), upstream_api_key="team-key-123", reuse=False)
    found = "kind vllm, model JetBrains/Mellum-4b-base, 1024 tokens per request, 4 slots"
    assert any(found in message for message in caplog.messages), caplog.messages  # the start-up line
    assert proxy.app[POLICIES].admission.limit == 4  # not serialized at 1 for want of /props
    for path, body in BODIES.items():
        resp = await proxy.post(path, json=body)
        assert resp.status == 200, (path, await resp.text())
    assert {payload["model"] for payload in fake.payloads} == {VLLM_MODEL}
    status = await (await proxy.get("/status")).text()
    assert "team-key-123" not in status
    long = {"prompt": "".join(f"x_{i} = {i}\n" for i in range(2000)), "suffix": "\n"}
    assert (await proxy.post("/v1/completions", json=long)).status == 200
    record = proxy.app[RECORDS].last()  # fitted to the server's max_model_len, not the proxy's 2,048
    assert record.truncated and record.prompt_tokens_after is not None and record.prompt_tokens_after <= 1024 - 128
    named = await make_proxy(upstream=str(upstream.make_url("")), upstream_api_key="team-key-123",
                             upstream_model="other")  # fmt: skip
    resp = await named.post("/v1/completions", json={"prompt": "x"})
    assert resp.status == 404 and "does not exist" in (await resp.json())["error"]["message"]  # it was sent as set
    keyless = await make_proxy(upstream=str(upstream.make_url("")))
    resp = await keyless.post("/v1/completions", json={"prompt": "x"})
    assert resp.status == 401  # the upstream's refusal, passed on


async def test_llama_vscodes_request_with_n_cmpl_gives_one_clean_completion(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """llama.vscode's infill body (src/llama-server.ts `createRequestPayload`: input_prefix/suffix/extra,
    prompt, n_predict, top_k, top_p, stream false, samplers, cache_prompt, t_max_*), with `n_cmpl: 3`."""
    fake, url = await fake_upstream(tokens=4)
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    body = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n", "input_extra": [], "prompt": "    return ",
            "n_predict": 16, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "n_cmpl": 3}  # fmt: skip
    resp = await proxy.post("/infill", json=body)
    answer = await resp.json()
    assert resp.status == 200 and answer["content"] == "t0 t1 t2 t3 "  # one completion, not three interleaved
    assert "n_cmpl" not in fake.payloads[-1]


async def test_kinds_are_told_apart_by_what_they_answer(aiohttp_server: Any, embedded_server: Any) -> None:
    import aiohttp

    from proxy.upstream import UpstreamClient
    from proxy.upstream.kinds import detect_kind

    def answering(body: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(body)

        return handler

    ollama = web.Application()  # ollama server/routes.go: GET /api/version -> {"version": "0.9.0"}
    ollama.router.add_get("/api/version", answering({"version": "0.9.0"}))
    lmstudio = web.Application()  # LM Studio's /v1/models entries are owned by "organization_owner"
    entry = {"id": "mellum-4b-base", "object": "model", "owned_by": "organization_owner"}
    lmstudio.router.add_get("/v1/models", answering({"object": "list", "data": [entry]}))
    plain = web.Application()
    servers = {"ollama": ollama, "lmstudio": lmstudio, "openai": plain}
    async with aiohttp.ClientSession() as session:
        for kind, app in servers.items():
            server = await aiohttp_server(app)
            assert await detect_kind(UpstreamClient(session, str(server.make_url("")))) == kind
        assert await detect_kind(UpstreamClient(session, embedded_server.url)) == "llama.cpp"
