"""A server whose `/tokenize` counts but cannot say where its tokens start (vLLM): every prompt still fits its
context as the server counts it, by measuring each rendered prompt; a prompt it refuses anyway is fitted
again. Text that tokenizes densely (one token a character) is the hard case for any character estimate."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from benchmarks.runners import ladder
from mellum_proxy.budget.tokenizers import CountingTokenizer, UpstreamTokenizer, _vocab_byte_lengths, upstream_counter
from mellum_proxy.http import PROBES, RECORDS
from mellum_proxy.upstream.client import UpstreamClient
from tests.conftest import ProxyFactory
from tests.fakes import CountingVllm

# Dense text: minified code, CJK comments and emoji, as the issue measured (one token a character).
DENSE = "".join(f"const a{i}=(b,c)=>b*c+{i};// 计算乘积 ✓😀\n" for i in range(400))


async def test_a_count_only_server_gets_prompts_that_fit_over_a_300_keystroke_replay(
    make_proxy: ProxyFactory, aiohttp_server: Any
) -> None:
    vllm = CountingVllm(max_model_len=1024)
    upstream = await aiohttp_server(vllm.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), reuse=False, timeout_ms=0)
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 10)
    assert proxy.app[PROBES].budget.counter.method == "upstream-count"
    start, calls_before = len(DENSE) // 2, vllm.tokenize_calls
    for keystroke in range(300):
        cursor = start + keystroke
        resp = await proxy.post("/v1/completions", json={"prompt": DENSE[:cursor], "suffix": DENSE[cursor:]})
        assert resp.status == 200, await resp.text()
    assert vllm.refused == 0
    assert len(vllm.prompt_tokens) == 300
    assert max(vllm.prompt_tokens) + 128 <= 1024  # every prompt fits as the server counts it
    assert min(vllm.prompt_tokens) > 300  # the text nearest the cursor is kept, never an emptied prompt
    calls = (vllm.tokenize_calls - calls_before) / 300
    assert calls <= 3, calls
    assert {r.tokenizer for r in proxy.app[RECORDS]} == {"upstream-count"}


async def test_a_prompt_the_server_refuses_as_too_long_is_fitted_again_once(
    make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer that disagrees with the server (here it counts a token per 3 characters, the server one
    per character): the 400 names the server's count; the proxy learns it, fits harder and asks again."""
    vllm = CountingVllm(max_model_len=1024, undercount=3)
    upstream = await aiohttp_server(vllm.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), reuse=False, timeout_ms=0)
    with caplog.at_level(logging.WARNING, "mellum_proxy"):
        resp = await proxy.post("/v1/completions", json={"prompt": DENSE[:5000], "suffix": DENSE[5000:]})
    assert resp.status == 200 and resp.headers["X-Mellum-Outcome"] == "ok"
    assert vllm.refused == 1 and vllm.prompt_tokens[-1] + 128 <= 1024
    assert any("the upstream counted" in message for message in caplog.messages)


async def test_vllms_token_strings_give_exact_cuts(aiohttp_server: Any) -> None:
    upstream = await aiohttp_server(CountingVllm(token_strs=True).app())
    import aiohttp

    async with aiohttp.ClientSession() as session:
        counter = await upstream_counter(UpstreamClient(session, str(upstream.make_url("")).rstrip("/")))
        assert isinstance(counter, UpstreamTokenizer) and counter.shape.name == "vllm"
        text = "def f(x):\n    return x  # ✓ 中\n"
        assert await counter.offsets(text) == list(range(len(text)))  # one token a character, at each one


def test_vocabulary_tokens_are_read_back_to_their_text_lengths() -> None:
    assert _vocab_byte_lengths(["def", "Ġf", "(", "x", "):", "Ċ", "ĠĠĠ", "Ġâľĵ"]) == [3, 2, 1, 1, 2, 1, 3, 4]
    assert _vocab_byte_lengths(["▁def", "▁f", "<0x0A>", "中"]) == [4, 2, 1, 3]  # SentencePiece
    assert _vocab_byte_lengths(None) is None
    # a `▁` of the text itself (DeepSeek's markers): what vLLM 0.32's gemma tokenizer answered for it
    marker = "<｜fim▁begin｜>"  # noqa: RUF001
    lengths = _vocab_byte_lengths(["<", "｜", "fim", "▁begin", "｜", ">"], marker)  # noqa: RUF001
    assert lengths is not None and sum(lengths) == len(marker.encode()) and lengths[3] == len("▁begin".encode())
    assert _vocab_byte_lengths(["x", "▁▁y"], "x ▁y") == [1, 5]  # a space, then the text's own `▁`


async def test_ladder_prompts_are_cut_by_count_on_a_count_only_server(aiohttp_server: Any) -> None:
    """`benchmarks ladder`'s workflow (short / mid / long prompts) against one's own vLLM."""
    vllm = CountingVllm(max_model_len=2048)
    upstream = await aiohttp_server(vllm.app())
    import aiohttp

    async with aiohttp.ClientSession() as session:
        counter = await upstream_counter(UpstreamClient(session, str(upstream.make_url("")).rstrip("/")))
        assert isinstance(counter, CountingTokenizer)
        for tokens in (256, 1024, 1900):
            cut = await ladder.cut_to_tokens(DENSE, tokens, counter)
            assert vllm.count(cut) == tokens
        url = str(upstream.make_url("/v1/completions"))
        prompts = {n: await ladder.cut_to_tokens(DENSE, n, counter) for n in (256, 1900)}
    cells = await ladder.run_ladder(url, prompts, [1, 2], repeat=2, max_tokens=16, model=CountingVllm.model)
    assert [cell.summary()["failures"] for cell in cells] == [{}, {}, {}, {}]
