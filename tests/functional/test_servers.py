"""Servers other than the embedded llama.cpp build, from their documented shapes.

Each fake follows a file of the server's own source, cited at the fake.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from bench.fake_upstream import FakeUpstream
from proxy.http import RECORDS
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
