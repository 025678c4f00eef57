"""`bench replay` counts the tokens of an answer that came without `usage` (ended early by the proxy) with
the server's own tokenizer, so a cleaned completion's shown tokens are not counted as waste."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mellum_proxy.bench.runners.replay import count_unmetered
from mellum_proxy.bench.workloads.editor import RequestResult


@pytest.mark.embedded
async def test_an_answer_without_usage_is_counted_by_the_server(embedded_server: Any) -> None:
    cleaned = RequestResult(0, "a.py", 0.0, status=200, text="return a + b")
    metered = RequestResult(1, "a.py", 0.0, status=200, text="return a * b", completion_tokens=7)
    empty = RequestResult(2, "a.py", 0.0, status=200, text="")
    async with aiohttp.ClientSession() as session:
        await count_unmetered(session, embedded_server.url, [cleaned, metered, empty])
        async with session.post(embedded_server.url + "/tokenize", json={"content": "return a + b"}) as resp:
            expected = len((await resp.json())["tokens"])
    assert cleaned.completion_tokens == expected > 0
    assert metered.completion_tokens == 7 and empty.completion_tokens == 0


async def test_a_server_that_cannot_count_leaves_it_at_zero(fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    cleaned = RequestResult(0, "a.py", 0.0, status=200, text="return a + b")
    async with aiohttp.ClientSession() as session:
        await count_unmetered(session, url, [cleaned])
    assert cleaned.completion_tokens == 0
