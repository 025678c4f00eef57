"""Servers other than the embedded llama.cpp build, from their documented shapes.

Each fake follows a file of the server's own source, cited at the fake.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from aiohttp import web

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.http import POLICIES, PROBES, RECORDS
from mellum_proxy.tuning.sim.responder import answering, routes
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
    assert proxy.app[RECORDS].last().tokenizer == "upstream-count"  # a count is enough to measure exactly
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
        answered: web.StreamResponse = await handler(request)
        return answered

    async def models(request: web.Request) -> web.Response:
        entry = {"id": VLLM_MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 1024}
        return web.json_response({"object": "list", "data": [entry]})

    async def tokenize(request: web.Request) -> web.Response:  # protocol.py `TokenizeCompletionRequest`
        body = await request.json()
        if "prompt" not in body:
            return web.json_response({"object": "error", "message": "Field required: prompt",
                                      "type": "BadRequestError", "code": 400}, status=400)  # fmt: skip
        tokens = list(range(len(body["prompt"]) // 3 + 1))
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 1024})

    app.middlewares.append(vllm_rules)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    return app


BODIES: dict[str, dict[str, Any]] = {
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
        await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 30)  # the start-up line is said by then
    found = "kind vllm, model JetBrains/Mellum-4b-base, 1024 tokens per request, 4 slots"
    assert any(found in message for message in caplog.messages), caplog.messages  # the start-up line
    assert proxy.app[POLICIES].admission.limit == 4  # not serialized at 1 for want of /props
    for path, body in BODIES.items():
        for stream in (False, True):
            resp = await proxy.post(path, json={**body, "stream": stream})
            raw = await resp.read()
            assert resp.status == 200 and answer_text(raw) == "t0 t1 t2 t3 ", (path, stream, raw)
    assert {payload["model"] for payload in fake.payloads} == {VLLM_MODEL}
    assert proxy.app[RECORDS].last().tokenizer in ("upstream-count", "bytes")  # bytes: so short it fits uncounted
    assert any("a count without its tokens' text" in message for message in caplog.messages)
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


OWNED = {"n_predict": 100000, "id_slot": 0, "slot_id": 1, "min_tokens": 50, "ignore_eos": True, "n_keep": -1,
         "max_completion_tokens": 9999, "priority": -10, "n_cmpl": 3}  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/completions", "/infill", "/completion"])
async def test_what_the_proxy_owns_on_the_server_never_reaches_it(
    path: str, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """A body that would lift the token cap or pin a slot: the upstream sees the proxy's cap and none of it."""
    fake, url = await fake_upstream(tokens=2)
    proxy = await make_proxy(upstream=url, tokenizer="chars", max_tokens=16)
    prompt = {"prompt": "def f("} if path != "/infill" else {"input_prefix": "def f(", "input_suffix": ")"}
    resp = await proxy.post(path, json={**prompt, "max_tokens": 4, **OWNED})
    assert resp.status == 200, await resp.text()
    sent = fake.payloads[-1]
    assert sent["max_tokens"] == 4 and not set(OWNED) & set(sent), sent
    several = await proxy.post("/v1/completions", json={"prompt": "x", "best_of": 3})
    assert several.status == 400 and "'best_of' must be 1" in (await several.json())["error"]["message"]


async def test_kinds_are_told_apart_by_what_they_answer(aiohttp_server: Any, embedded_server: Any) -> None:
    import aiohttp

    from mellum_proxy.upstream.client import UpstreamClient
    from mellum_proxy.upstream.servers import detect

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
            assert (await detect(UpstreamClient(session, str(server.make_url(""))))).name == kind
        assert (await detect(UpstreamClient(session, embedded_server.url))).name == "llama.cpp"


OLLAMA_MODEL = "mellum:4b"


def answer_text(raw: bytes) -> str:
    """The completion text of an answer in any dialect, whole or streamed (SSE or NDJSON)."""
    text = ""
    for line in raw.splitlines() or [raw]:
        line = line.removeprefix(b"data: ").strip()
        if not line.startswith(b"{"):
            continue
        event = orjson.loads(line)
        choices = event.get("choices") or [{}]
        text += choices[0].get("text") or event.get("content") or event.get("response") or ""
    return text


class OllamaShaped:
    """An Ollama server as its source describes it (ollama `server/routes.go`, `api/types.go`): `/api/version`,
    `/api/tags`, `/api/ps` (the loaded model with its `context_length`), `/api/show`, `/v1/models` (entries
    `owned_by: "library"`), no `/health`, `/props` nor `/tokenize`. `/api/generate` answers NDJSON, 404
    `{"error": "model ... not found"}` for an unknown model, and cuts a prompt longer than the context
    silently (counted here, at 3 characters a token). `/v1/completions` exists but applies the model's
    template; the proxy must not use it."""

    def __init__(self, context: int = 1024) -> None:
        self.context = context
        self.generate: list[dict[str, Any]] = []
        self.openai_completions = 0
        self.truncated = 0

    def app(self) -> web.Application:
        entry = {"name": OLLAMA_MODEL, "model": OLLAMA_MODEL, "size": 1, "digest": "d", "details": {}}
        listing = {"object": "list", "data": [{"id": OLLAMA_MODEL, "object": "model", "owned_by": "library"}]}
        return routes({
            "GET /api/version": answering({"version": "0.12.6"}), "GET /api/tags": answering({"models": [entry]}),
            "GET /api/ps": answering({"models": [{**entry, "context_length": self.context}]}),
            "POST /api/show": answering({"parameters": "stop <fim_prefix>", "template": "{{ .Prompt }}"}),
            "GET /v1/models": answering(listing), "POST /api/generate": self._generate,
            "POST /v1/completions": self._openai,
        })  # fmt: skip

    async def _openai(self, request: web.Request) -> web.Response:
        self.openai_completions += 1
        return web.json_response({"error": {"message": "templated"}}, status=500)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.generate.append(body)
        if body.get("model") != OLLAMA_MODEL:
            return web.json_response({"error": f"model '{body.get('model')}' not found"}, status=404)
        options = body.get("options") or {}
        if len(body.get("prompt", "")) // 3 + options.get("num_predict", 128) > self.context:
            self.truncated += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for piece in ("x", " =", " 1"):
            line = {"model": OLLAMA_MODEL, "created_at": "2026-12-03T10:00:00Z", "response": piece, "done": False}
            await resp.write(orjson.dumps(line) + b"\n")
        end = {"model": OLLAMA_MODEL, "created_at": "2026-12-03T10:00:00Z", "response": "", "done": True,
               "done_reason": "stop", "prompt_eval_count": 12, "prompt_eval_duration": 2_000_000,
               "eval_count": 3, "eval_duration": 3_000_000}  # fmt: skip
        await resp.write(orjson.dumps(end) + b"\n")
        await resp.write_eof()
        return resp


async def test_an_ollama_shaped_upstream_serves_every_dialect_through_its_native_api(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ollama = OllamaShaped(context=1024)
    upstream = await aiohttp_server(ollama.app())
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=str(upstream.make_url("")), reuse=False)
    found = "kind ollama, model mellum:4b, 1024 tokens per request"
    assert any(found in message for message in caplog.messages), caplog.messages
    for path, body in BODIES.items():
        for stream in (False, True):
            resp = await proxy.post(path, json={**body, "stream": stream})
            raw = await resp.read()
            assert resp.status == 200, (path, raw)
            assert answer_text(raw) == "x = 1", (path, stream, raw)
    assert ollama.openai_completions == 0  # never through the templating OpenAI endpoint
    assert {payload["model"] for payload in ollama.generate} == {OLLAMA_MODEL}
    assert all(payload["raw"] is True and "suffix" not in payload for payload in ollama.generate)
    long = {"prompt": "".join(f"x_{i} = {i}\n" for i in range(2000)), "suffix": "\n"}
    assert (await proxy.post("/v1/completions", json=long)).status == 200
    assert ollama.truncated == 0  # fitted to the loaded context, not the proxy's 2,048
    assert "x_1999 = 1999\n" in ollama.generate[-1]["prompt"]


async def test_every_generate_sent_to_ollama_carries_keep_alive(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    """Ollama unloads a model after 5 idle minutes (its default `keep_alive`): every `/api/generate` the proxy sends
    carries the setting's (30m by default, `--keep-alive 45m` sends "45m"), and a client's own passes through."""
    ollama = OllamaShaped()
    upstream = str((await aiohttp_server(ollama.app())).make_url(""))
    proxy = await make_proxy(upstream=upstream, reuse=False)
    for path, body in BODIES.items():
        assert (await proxy.post(path, json=body)).status == 200
    assert [payload["keep_alive"] for payload in ollama.generate] == ["30m"] * len(BODIES)
    ollama.generate.clear()
    proxy = await make_proxy(upstream=upstream, reuse=False, keep_alive="45m")
    assert (await proxy.post("/v1/completions", json={"prompt": "x"})).status == 200
    assert (await proxy.post("/api/generate", json={"prompt": "y", "model": "m", "keep_alive": "2h"})).status == 200
    assert (await proxy.post("/api/generate", json={"prompt": "y", "model": "m", "keep_alive": True})).status == 400
    assert [payload["keep_alive"] for payload in ollama.generate] == ["45m", "2h"]


async def test_default_temperature_fills_in_only_what_the_client_left_out(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    """llama.vim and llama.vscode send no temperature; Ollama would then sample at its own default."""
    ollama = OllamaShaped()
    upstream = await aiohttp_server(ollama.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), default_temperature=0.2, reuse=False)
    assert (await proxy.post("/infill", json={"input_prefix": "a = ", "input_suffix": ""})).status == 200
    assert (await proxy.post("/infill", json={"input_prefix": "b = ", "temperature": 0.9})).status == 200
    assert [payload["options"].get("temperature") for payload in ollama.generate] == [0.2, 0.9]
    fake = FakeUpstream()
    openai = await aiohttp_server(fake.app())
    plain = await make_proxy(upstream=str(openai.make_url("")), tokenizer="chars", reuse=False)
    assert (await plain.post("/infill", json={"input_prefix": "a = "})).status == 200
    assert "temperature" not in fake.payloads[-1]  # unset: the server's own default


async def test_an_ollama_error_line_mid_stream_ends_the_answer_in_the_clients_shape(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    async def generate(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        first, error = (
            b'{"model":"m","response":"x","done":false}\n',
            b'{"error":"llama runner process has terminated"}\n',
        )
        await resp.write(first + error)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/api/generate", generate)
    upstream = await aiohttp_server(app)
    proxy = await make_proxy(upstream=str(upstream.make_url("")), upstream_kind="ollama", upstream_model="m",
                             tokenizer="chars", reuse=False)  # fmt: skip
    resp = await proxy.post("/api/generate", json={"prompt": "def f(", "stream": True})
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert lines[0]["response"] == "x"
    assert "llama runner process has terminated" in str(lines) and lines[-1]["done"] is True
    resp = await proxy.post("/v1/completions", json={"prompt": "def f("})
    assert resp.status == 502 and "terminated" in (await resp.json())["error"]["message"]


def lmstudio_shaped(fake: FakeUpstream) -> web.Application:
    """LM Studio (lmstudio-ai/docs `1_developer/2_rest/list.md`, `openai-compat`): `/v1/models` lists every
    downloaded model, owned by `organization_owner`; `/api/v1/models` says which is loaded, with its
    `loaded_instances[].config.context_length`; completions are OpenAI's."""
    app = fake.app()

    async def models(request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "owned_by": "organization_owner"}
                for name in ("mellum-4b-base", "qwen2.5-coder-7b")]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def native(request: web.Request) -> web.Response:
        loaded = [{"id": "mellum-4b-base", "config": {"context_length": 1536}}]
        return web.json_response({"models": [
            {"type": "llm", "key": "mellum-4b-base", "loaded_instances": loaded, "max_context_length": 8192},
            {"type": "llm", "key": "qwen2.5-coder-7b", "loaded_instances": [], "max_context_length": 32768},
        ]})  # fmt: skip

    app.router.add_get("/v1/models", models)
    app.router.add_get("/api/v1/models", native)
    return app


async def test_an_lmstudio_shaped_upstream_gets_its_loaded_model_and_context(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeUpstream(slots=None)
    upstream = await aiohttp_server(lmstudio_shaped(fake))
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=str(upstream.make_url("")), tokenizer="chars", reuse=False)
    assert any("kind lmstudio, model mellum-4b-base, 1536 tokens per request" in m for m in caplog.messages)
    for path, body in BODIES.items():
        resp = await proxy.post(path, json=body)
        assert resp.status == 200 and answer_text(await resp.read()) == "t0 t1 t2 t3 ", path
    assert {payload["model"] for payload in fake.payloads} == {"mellum-4b-base"}


@pytest.mark.parametrize(
    "rendered",
    [
        "[SUFFIX]\n    return total\n[PREFIX]def add(a, b):\n    total = ",  # codestral
        "<fim_prefix>def add(a, b):\n    total = <fim_suffix>\n    return total\n<fim_middle>",  # starcoder
    ],
)
async def test_twinnys_prerendered_prompt_is_parsed_back(
    make_proxy: ProxyFactory, fake_upstream: Any, rendered: str
) -> None:
    """Twinny's Ollama FIM body (src/extension/provider-options.ts `createStreamRequestBodyFim`: model,
    prompt rendered with its template, stream, keep_alive, options {temperature, num_predict})."""
    fake, url = await fake_upstream(tokens=2)
    proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=False)
    body = {"model": "mellum", "prompt": rendered, "stream": True, "keep_alive": "5m",
            "options": {"temperature": 0.2, "num_predict": 128}}  # fmt: skip
    resp = await proxy.post("/api/generate", json=body)
    assert resp.status == 200 and answer_text(await resp.read()) == "t0 t1 "
    sent = fake.payloads[-1]["prompt"]  # the served model's own (Mellum) layout, suffix first
    assert sent.endswith("<fim_suffix>\n    return total\n<fim_prefix>def add(a, b):\n    total = <fim_middle>")
    assert "[SUFFIX]" not in sent and sent.count("<fim_prefix>") == 1
