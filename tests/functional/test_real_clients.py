"""The registry's own client libraries, `openai` and `ollama`, talk to the proxy in front of the real
embedded llama.cpp server: they validate every answer against their own response models."""

from __future__ import annotations

import asyncio
from typing import Any

import ollama
import openai
import pytest

from mellum_proxy.http import PROBES, RECORDS
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, embedded_server: EmbeddedServer) -> Any:
    # greedy: sampled, its answer was once empty in a fresh-clone run beside two busy loops, and an empty answer
    # leaves nothing to reuse
    client = await make_proxy(upstream=embedded_server.url, timeout_ms=0, max_tokens=16, default_temperature=0)
    await asyncio.wait_for(client.app[PROBES].settled.wait(), 60)
    return client


def base_url(proxy: Any) -> str:
    return str(proxy.make_url("")).rstrip("/")


async def test_the_openai_library_completes_streamed_and_not(proxy: Any) -> None:
    async with openai.AsyncOpenAI(base_url=base_url(proxy) + "/v1", api_key="unused", max_retries=0) as client:
        whole = await client.completions.create(model="mellum", prompt=PREFIX, suffix=SUFFIX, max_tokens=8)
        assert whole.object == "text_completion" and len(whole.choices) == 1
        assert isinstance(whole.choices[0].text, str) and whole.choices[0].finish_reason in ("stop", "length")
        assert whole.usage is not None and whole.usage.prompt_tokens > 0
        stream = await client.completions.create(
            model="mellum", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, stream=True
        )
        events = [event async for event in stream]
    assert events and all(event.choices and isinstance(event.choices[0].text, str) for event in events)
    assert events[-1].choices[0].finish_reason in ("stop", "length")
    assert [r.outcome for r in proxy.app[RECORDS]][-2:] == ["ok", "reused"]  # asked again: the same answer


async def test_the_openai_library_reads_the_proxys_errors(proxy: Any) -> None:
    async with openai.AsyncOpenAI(base_url=base_url(proxy) + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="mellum", prompt=PREFIX, n=2)
    assert "'n' must be 1" in caught.value.message


async def test_the_ollama_library_lists_shows_and_generates_streamed_and_not(proxy: Any) -> None:
    async with ollama.AsyncClient(host=base_url(proxy)) as client:
        await talk_ollama(client, proxy)


async def talk_ollama(client: ollama.AsyncClient, proxy: Any) -> None:
    listed = await client.list()
    name = listed.models[0].model
    assert name == "gemma-3-270m-q4_k_m"  # the embedded server's model, by its name
    shown = await client.show(name)
    assert ".Suffix" in (shown.template or "")
    assert f"num_ctx {proxy.app[PROBES].budget.settings.max_context_tokens}" in (shown.parameters or "")
    whole = await client.generate(model=name, prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 8})
    assert whole.done and isinstance(whole.response, str) and whole.done_reason in ("stop", "length")
    pieces = [part async for part in await client.generate(model=name, prompt=PREFIX, suffix=SUFFIX, stream=True,
                                                             options={"num_predict": 8})]  # fmt: skip
    assert pieces[-1].done and all(isinstance(part.response, str) for part in pieces)
    assert [r.outcome for r in proxy.app[RECORDS]][-2:] == ["ok", "reused"]  # asked again: the same answer


async def test_the_ollama_library_reads_the_proxys_errors(proxy: Any) -> None:
    async with ollama.AsyncClient(host=base_url(proxy)) as client:
        with pytest.raises(ollama.ResponseError) as caught:
            await client.generate(model="mellum", prompt=PREFIX, options={"num_predict": "many"})
    assert caught.value.status_code == 400 and "num_predict" in caught.value.error
