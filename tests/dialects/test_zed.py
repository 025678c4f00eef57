"""Zed's edit predictions through the proxy: each body Zed's source builds (`tests/fixtures/clients/zed/`),
against the embedded llama.cpp server and against a fake that shows what reached it.

Fill-in-the-middle formats are read back and rendered in the served model's template; edit-region prompts
(`zeta`, `zeta2`, Sweep's) and their answers pass untouched, while the policies that protect the server
(supersede, the deadline) apply to them as to any request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from mellum_proxy import edit_region
from mellum_proxy.budget.templates import MELLUM, FimParts
from mellum_proxy.config import Settings
from mellum_proxy.edit_region import edit_region_format
from mellum_proxy.editor.configs import render
from mellum_proxy.http import PROBES, RECORDS
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.dialects.plugins import FIXTURES, zed, zed_raw

ZED = FIXTURES / "zed"
FIM_FORMATS = ["code-llama", "star-coder", "deepseek-coder", "qwen", "code-gemma", "codestral", "glm"]
EDIT_REGIONS = {"zeta": "zeta", "zeta2": "zeta2", "sweep": "sweep"}
DEMO = orjson.loads((FIXTURES / "continue" / "openai-completions.json").read_bytes())["prompt"]
PREFIX = DEMO[len("<fim_prefix>") : DEMO.index("<fim_suffix>")]
SUFFIX = DEMO[DEMO.index("<fim_suffix>") + len("<fim_suffix>") : DEMO.index("<fim_middle>")]
# What a Zeta model answers: the region rewritten, lines the prompt already has, a dedent below the cursor's
# line, and the format's own markers; every cleaning rule would cut or trim it.
ZETA_ANSWER = [
    "<|editable_region_start|>\n", "        return 0.0\n", "    total = sum(u.age for u in users)\n",
    "\n", "    return total / len(users)\n", "    return total / len(users)\n", "    return total / len(users)\n",
    "\n", "<|editable_region_end|>\n", "```",
]  # fmt: skip


def body(name: str) -> dict[str, Any]:
    return dict(orjson.loads((ZED / f"{name}.json").read_bytes()))


async def recording_relay(aiohttp_server: Any, target: str) -> tuple[list[dict[str, Any]], str]:
    """A relay to `target` that keeps the JSON of every completion request it forwards."""
    seen: list[dict[str, Any]] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        data = await request.read()
        if request.method == "POST" and request.path in ("/completion", "/v1/completions", "/infill"):
            seen.append(orjson.loads(data))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, target + request.path_qs, data=data, headers=headers) as resp,
        ):
            relayed = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.headers.get(
                "Content-Type", "application/json")})  # fmt: skip
            await relayed.prepare(request)
            async for piece in resp.content.iter_any():  # streamed as it comes
                await relayed.write(piece)
            await relayed.write_eof()
            return relayed

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    server = await aiohttp_server(app)
    return seen, str(server.make_url("")).rstrip("/")


def test_every_fixture_is_told_apart() -> None:
    for name in FIM_FORMATS:
        assert edit_region_format(body(f"fim-{name}")["prompt"]) is None
    for name, kind in EDIT_REGIONS.items():
        assert edit_region_format(body(name)["prompt"]) == kind
    assert edit_region_format("def f(<|fim_prefix|>x") is None  # a FIM marker alone is not an edit region


def test_code_that_mentions_the_markers_is_an_ordinary_prompt() -> None:
    """Zed's own source and this project's name the markers in strings: such a file is fitted, rendered and
    cleaned like any other, however big; only the layout (own-line region markers around the cursor) counts."""
    source = (
        Path(edit_region.__file__).read_text() + '\nconst CURSOR: &str = "<|user_cursor_is_here|>";\n'
        'const START: &str = "<|editable_region_start|>";\nconst END: &str = "<|editable_region_end|>";\n'
    )
    assert edit_region_format(source * 50) is None
    assert edit_region_format("x = '<|user_cursor|>'\n<|fim_suffix|>\n") is None
    zeta = body("zeta")["prompt"]
    assert edit_region_format(zeta.replace("\n<|editable_region_end|>", " <|editable_region_end|>")) is None


async def test_a_refused_edit_region_prompt_is_not_sent_again(make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    """The client sized it: fitting it again would upload the same bytes, so the server's refusal is the answer."""
    asked: list[int] = []

    async def refuse(request: web.Request) -> web.Response:
        asked.append(len(await request.read()))
        error = {"code": 400, "type": "exceed_context_size_error",
                 "message": "request (5000 tokens) exceeds the available context size (64 tokens)"}  # fmt: skip
        return web.json_response({"error": error}, status=400)

    app = web.Application()
    app.router.add_post("/v1/completions", refuse)
    server = await aiohttp_server(app)
    proxy = await make_proxy(upstream=str(server.make_url("")), tokenizer="chars", reuse=False)
    resp = await proxy.post("/v1/completions", json=body("zeta"))
    assert resp.status == 400 and len(asked) == 1
    plain = await proxy.post("/v1/completions", json={"prompt": "def f(" * 50})  # a prompt the proxy fitted
    assert plain.status == 400 and len(asked) == 3  # is fitted again once


@pytest.mark.parametrize("name", FIM_FORMATS)
async def test_zeds_fim_formats_reach_the_server_in_its_own_template(
    name: str, make_proxy: ProxyFactory, embedded_server: EmbeddedServer, aiohttp_server: Any
) -> None:
    seen, url = await recording_relay(aiohttp_server, str(embedded_server.url).rstrip("/"))
    proxy = await make_proxy(upstream=url, timeout_ms=0, default_temperature=0)
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)
    resp = await proxy.post("/v1/completions", json=body(f"fim-{name}"))
    assert resp.status == 200
    zed(resp.status, await resp.read())  # Zed's own parser reads it
    template = proxy.app[PROBES].budget.settings.template
    assert template is not None and template.name == "prefix"  # gemma-3 has no FIM tokens
    assert seen[-1]["prompt"] == PREFIX  # the served model's template: the text before the cursor, markers gone


@pytest.mark.parametrize("name", ["code-llama", "star-coder", "qwen", "codestral", "glm"])
async def test_a_mellum_server_gets_zeds_fim_prompt_in_mellums_layout(
    name: str, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream(tokens=3)
    proxy = await make_proxy(upstream=url, tokenizer="chars", fim_template="mellum", reuse=False)
    resp = await proxy.post("/v1/completions", json=body(f"fim-{name}"))
    assert resp.status == 200 and zed(resp.status, await resp.read()) == "t0 t1 t2 "
    assert fake.payloads[-1]["prompt"] == MELLUM.render(FimParts(PREFIX, SUFFIX, None))


@pytest.mark.parametrize("name", sorted(EDIT_REGIONS))
async def test_an_edit_region_prompt_and_its_answer_pass_untouched(
    name: str, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """Each of them would be changed here: a Mellum template and a budget of 256 tokens (the prompts are
    600-900), cleaning on (the default), reuse on (the default)."""
    fake, url = await fake_upstream(pieces=ZETA_ANSWER)
    proxy = await make_proxy(upstream=url, tokenizer="chars", fim_template="mellum", max_context_tokens=256,
                             max_tokens=64, timeout_ms=0)  # fmt: skip
    sent = body(name)
    resp = await proxy.post("/v1/completions", json=sent)
    assert resp.status == 200
    assert zed_raw(resp.status, await resp.read()) == "".join(ZETA_ANSWER)  # not a byte cleaned away
    upstream = fake.payloads[-1]
    assert upstream["prompt"] == sent["prompt"] and upstream["stop"] == sent["stop"]  # no cut, no stop added
    record = proxy.app[RECORDS].last()
    assert record.edit_region == EDIT_REGIONS[name] and record.truncated is False and record.cleaned is None
    typed = {**sent, "prompt": sent["prompt"].replace("total = ", "total = s", 1)}  # the person typed on
    await (await proxy.post("/v1/completions", json=typed)).read()
    assert proxy.app[RECORDS].last().outcome == "ok" and len(fake.payloads) == 2  # never answered by reuse


async def test_supersede_and_the_deadline_apply_to_edit_predictions(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream(pieces=ZETA_ANSWER, stall_after=2)
    proxy = await make_proxy(upstream=url, tokenizer="chars", timeout_ms=300)
    first = asyncio.ensure_future(proxy.post("/v1/completions", json=body("zeta2")))
    await fake.wait_until(lambda f: f.active == 1)
    second = await proxy.post("/v1/completions", json=body("zeta2"))
    await (await first).read()
    assert second.status == 200
    outcomes = sorted(str(record.outcome) for record in proxy.app[RECORDS])
    assert outcomes == ["cancelled", "timeout"]  # the first replaced, the second ended by the deadline
    assert {record.edit_region for record in proxy.app[RECORDS]} == {"zeta2"}


async def test_zeta_through_the_proxy_is_answered_as_the_server_answers_it(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, aiohttp_server: Any
) -> None:
    """Both with the prompt in llama.cpp's cache: its first, cold answer can differ at temperature 0 (measured:
    a line repeated), since evaluating a cached prompt changes the arithmetic."""
    sent = {**body("zeta"), "max_tokens": 24}
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # the first warms the cache
            async with session.post(str(embedded_server.url) + "/v1/completions", json={**sent, "temperature": 0}) as r:
                direct = (await r.json())["choices"][0]["text"]
    seen, url = await recording_relay(aiohttp_server, str(embedded_server.url).rstrip("/"))
    proxy = await make_proxy(upstream=url, timeout_ms=0, default_temperature=0, max_tokens=24)
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)
    resp = await proxy.post("/v1/completions", json=sent)
    assert seen[-1]["prompt"] == sent["prompt"] and seen[-1]["stop"] == []  # as Zed sent it
    assert resp.status == 200
    assert zed_raw(resp.status, await resp.read()) == direct and direct


def test_editor_config_zed_prints_a_block_zeds_settings_accept() -> None:
    text = render("zed", Settings(listen="127.0.0.1:9125", max_tokens=64))
    settings = orjson.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    block = settings["edit_predictions"]
    assert block["provider"] == "open_ai_compatible_api"  # settings_content: EditPredictionProvider, snake_case
    api = block["open_ai_compatible_api"]
    assert api == {"api_url": "http://127.0.0.1:9125/v1/completions", "model": "mellum",
                   "prompt_format": "star_coder", "max_output_tokens": 64}  # fmt: skip
    # EditPredictionPromptFormat's variants, serde snake_case (crates/settings_content)
    assert api["prompt_format"] in ("infer", "zeta", "zeta2", "code_llama", "star_coder", "deepseek_coder", "qwen",
                                    "code_gemma", "codestral", "glm")  # fmt: skip
    assert Path(ZED).is_dir()
