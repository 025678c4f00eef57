"""The context budget against the real llama.cpp server: its own /tokenize, its own usage count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mellum_proxy import discovery
from mellum_proxy.budget import local
from mellum_proxy.budget.context import EDGE_TOKENS
from mellum_proxy.http import PROBES, RECORDS, SERVICE
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory, corpus_texts

pytestmark = pytest.mark.embedded

TEXT = "\n".join(corpus_texts())


@pytest.mark.parametrize("cursor", [900, 4000, 8000])
async def test_server_counts_no_more_than_the_budget(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, cursor: int
) -> None:
    proxy = await make_proxy(
        upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, tokenizer="upstream", max_context_tokens=300,
        max_tokens=16, context_step_lines=1, fim_template="mellum",  # both sides of the cursor, to be fitted
    )  # fmt: skip
    body = {"prompt": TEXT[:cursor], "suffix": TEXT[cursor:], "max_tokens": 64, "temperature": 0}
    resp = await proxy.post("/v1/completions", json=body, headers={"X-File-Path": "inventory.py"})
    usage = (await resp.json())["usage"]
    assert usage["completion_tokens"] <= 16  # capped by --max-tokens
    assert 284 - 60 <= usage["prompt_tokens"] <= 284  # exact; whole lines leave up to a line per side unused
    record = proxy.app[RECORDS].last()
    assert record.tokenizer == "upstream" and record.truncated is True
    # one /tokenize: the prompt cut after it is counted by its measurement, a bound within the edges' margin
    assert 0 <= (record.prompt_tokens_after or 0) - usage["prompt_tokens"] <= 4 * EDGE_TOKENS
    assert (record.prompt_tokens_before or 0) > 2000


async def test_auto_reads_the_gguf_vocabulary_before_it_answers(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer
) -> None:
    """Reading the model's tokenizer holds the interpreter's lock for about a second: it is done before the proxy
    says it is ready (a switch after it froze `/health` and the first completion for that long)."""
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, max_context_tokens=64,
                             max_tokens=16)  # fmt: skip
    budget = proxy.app[SERVICE].budget
    assert proxy.app[PROBES].ready.is_set()
    assert budget.counter.method == "gguf"  # /props names the model file; its vocabulary agrees with /tokenize
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 30)
    assert budget.counter.method == "gguf"
    body = {"prompt": TEXT[:2000], "max_tokens": 2, "temperature": 0}
    usage = (await (await proxy.post("/v1/completions", json=body)).json())["usage"]
    record = proxy.app[RECORDS].last()
    assert record.tokenizer == "gguf" and record.truncated is True
    assert record.prompt_tokens_after == usage["prompt_tokens"] <= 64 - 2  # exact, as the server counts


async def test_a_prompt_that_fits_by_its_length_is_sent_whole_and_uncounted(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer
) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, max_context_tokens=400)
    prefix, suffix = TEXT[:150], TEXT[150:300]
    body = {"prompt": prefix, "suffix": suffix, "max_tokens": 4, "temperature": 0}
    usage = (await (await proxy.post("/v1/completions", json=body)).json())["usage"]
    record = proxy.app[RECORDS].last()
    assert record.tokenizer == "bytes" and record.truncated is False
    assert usage["prompt_tokens"] <= (record.prompt_tokens_after or 0) <= 400 - 4  # a true bound, within the budget


async def test_cursor_in_a_comment_is_skipped(make_proxy: ProxyFactory, fake_upstream: object) -> None:
    fake, url = await fake_upstream()  # type: ignore[operator]
    proxy = await make_proxy(upstream=url, debounce_ms=0, complete_in_comments=False, tokenizer="chars")
    headers = {"X-File-Path": "app.py"}
    skipped = await proxy.post("/v1/completions", json={"prompt": "x = 1  # why", "suffix": "\n"}, headers=headers)
    assert skipped.headers["X-Mellum-Outcome"] == "skipped"
    assert (await skipped.json())["choices"][0]["text"] == ""
    served = await proxy.post("/v1/completions", json={"prompt": "x = ", "suffix": "\n"}, headers=headers)
    assert served.headers["X-Mellum-Outcome"] == "ok"
    assert len(fake.payloads) == 1
    assert fake.payloads[0]["prompt"] == "<filename>app.py\n<fim_suffix>\n<fim_prefix>x = <fim_middle>"
    assert fake.payloads[0]["stop"] == ["<|endoftext|>", "<filename>"]
    assert "suffix" not in fake.payloads[0]


async def test_template_none_sends_the_suffix_as_a_field(make_proxy: ProxyFactory, fake_upstream: object) -> None:
    fake, url = await fake_upstream()  # type: ignore[operator]
    proxy = await make_proxy(upstream=url, debounce_ms=0, fim_template="none", tokenizer="chars")
    await proxy.post("/v1/completions", json={"prompt": "x = ", "suffix": "\nprint(x)\n", "stop": "\n\n"})
    payload = fake.payloads[0]
    assert (payload["prompt"], payload["suffix"], payload["stop"]) == ("x = ", "\nprint(x)\n", "\n\n")


async def test_other_files_are_trimmed_by_the_chars_estimate_too(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    """204 KB of `input_extra` against a 2,048-token budget: what goes upstream fits it, recorded as truncated."""
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, tokenizer="chars", max_context_tokens=2048, max_tokens=64)
    extra = [{"filename": f"f{i}.py", "text": "x = 1\n" * 3400} for i in range(10)]
    resp = await proxy.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")", "input_extra": extra})
    assert resp.status == 200
    sent = fake.payloads[-1]["prompt"]
    record = proxy.app[RECORDS].last()
    assert "def f(" in sent and len(sent) < 4 * (2048 - 64) and record.truncated
    assert record.prompt_tokens_after is not None and record.prompt_tokens_after <= 2048 - 64


async def test_the_packaged_model_without_fim_tokens_gets_prefix_only_prompts(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """gemma-3-270m has no `<fim_*>` tokens: the default Mellum template would be noise to it (its first
    completion was `print(fibonacci(n))\\n    <fim_end>...`). A template the user chose is kept, with a warning."""
    import logging

    from mellum_proxy.budget.templates import PREFIX_ONLY

    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0)
        await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 120)
        chosen = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, fim_template="mellum")
        await asyncio.wait_for(chosen.app[PROBES].settled.wait(), 120)
    assert proxy.app[SERVICE].budget.settings.template is PREFIX_ONLY
    template = chosen.app[SERVICE].budget.settings.template
    assert template is not None and template.name == "mellum"
    assert any("mellum -> prefix" in m for m in caplog.messages)
    assert any("will read them as text" in m for m in caplog.messages)
    body = {"prompt": "def add(a, b):\n    return ", "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 8,
            "temperature": 0}  # fmt: skip
    resp = await proxy.post("/v1/completions", json=body)
    assert resp.status == 200 and "<fim" not in (await resp.json())["choices"][0]["text"]


async def test_a_vocabulary_never_cached_is_cached_for_the_next_start_not_read_while_answering(
    make_proxy: ProxyFactory, embedded_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start ever: the GGUF's vocabulary is rebuilt in a process of its own and cached (at the lowest
    CPU priority: on two busy cores that takes minutes, so here the build only records what it was asked); this
    process keeps asking the server's exact /tokenize rather than read the result while it answers."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(local, "_LOADED", {})
    built: list[Path] = []

    async def build_aside(model: Path) -> None:
        built.append(model)

    monkeypatch.setattr(discovery, "build_aside", build_aside)
    proxy = await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0)
    budget = proxy.app[SERVICE].budget
    assert budget.counter.method == "upstream"
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)
    assert [model.suffix for model in built] == [".gguf"]  # cached for the next start, in a process of its own
    assert budget.counter.method == "upstream"
