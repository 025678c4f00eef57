"""Every editor dialect, with the request exactly as its plugin builds it, through the proxy to the real
embedded llama.cpp server; answers parsed the way the plugin parses them."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.http import PROBES, RECORDS
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.sse import events
from tests.virtual_time import Answer, proxy_before, run_virtual

pytestmark = pytest.mark.embedded

PREFIX = "def add(a, b):\n"
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, embedded_server: EmbeddedServer) -> Any:
    # The plugins send no temperature; sampled, the model's first line was once a blank one, cleaned away, and
    # a check that the answer holds text failed. Greedy (`default_temperature`), what it writes is the same.
    return await make_proxy(upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, default_temperature=0)


def llama_vim_request() -> dict[str, Any]:
    """ggml-org/llama.vim autoload/llama.vim, `llama#fim`: the request body it json_encodes."""
    return {
        "input_prefix": PREFIX, "input_suffix": SUFFIX,
        "input_extra": [{"text": "import math\n", "time": 1733000000.0, "filename": "util.py"}],
        "prompt": "    return ", "n_predict": 16, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
        "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                            "tokens_cached"],
    }  # fmt: skip


def llama_vscode_request(n_predict: int = 16) -> dict[str, Any]:
    """ggml-org/llama.vscode src/llama-server.ts, `createRequestPayload(false, ...)` (and `true`: warm-up)."""
    if n_predict == 0:
        return {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x = 1\n", "time": 0,
                "filename": "a.py"}], "prompt": "", "n_predict": 0, "samplers": [], "cache_prompt": True,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 1}  # fmt: skip
    return {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [], "prompt": "    return ",
            "n_predict": n_predict, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000}  # fmt: skip


async def test_llama_vim_infill(proxy: Any) -> None:
    resp = await proxy.post("/infill", json=llama_vim_request())
    assert resp.status == 200
    body = orjson.loads(await resp.read())  # llama.vim: json_decode of the whole body
    assert set(body) <= set(llama_vim_request()["response_fields"])
    assert isinstance(body["content"], str) and body["content"]
    assert body["timings/predicted_n"] > 0 and "tokens_cached" in body and body["truncated"] is False
    record = proxy.app[RECORDS].last()
    assert record.dialect == "llamacpp-infill" and record.outcome == "ok"


async def test_llama_vscode_infill_and_warm_up(proxy: Any) -> None:
    resp = await proxy.post("/infill", json=llama_vscode_request())
    body = await resp.json()  # llama.vscode: LlamaResponse {content, tokens_cached, truncated, timings}
    assert isinstance(body["content"], str) and body["stop"] is True
    assert body["timings"]["predicted_n"] > 0 and body["timings"]["prompt_n"] > 0
    assert isinstance(body["tokens_cached"], int) and isinstance(body["truncated"], bool)
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)  # the template for gemma is decided
    warm = await proxy.post("/infill", json=llama_vscode_request(n_predict=0))
    # gemma-3-270m gets prefix-only prompts, which have no place for other files: nothing to warm, so the
    # warm-up is answered here instead of holding a slot to generate a token from an empty prompt
    assert warm.status == 200 and warm.headers["X-Mellum-Outcome"] == "skipped"
    assert proxy.app[RECORDS].last().reached_upstream is False


async def test_a_warm_up_warms_exactly_the_start_of_the_next_completion(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """llama.vim's ring update (`n_predict: 0`, other files only) sends the other files and the edited file's
    header as the next completion renders them, so the server's prompt cache matches that completion."""
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars", fim_template="mellum")
    extra = [{"text": "import math\n", "time": [293, -1533570430], "filename": "util.py"}]
    warm = {"input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "", "n_predict": 0,
            "response_fields": [""], "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "cache_prompt": True}  # fmt: skip
    resp = await proxy.post("/infill", json=warm)
    assert resp.headers["X-Mellum-Outcome"] == "ok"
    await proxy.post("/infill", json=llama_vim_request() | {"input_extra": extra})
    warmed, completion = (payload["prompt"] for payload in fake.payloads)
    assert warmed == "<filename>util.py\nimport math\n<filename>\n"
    assert fake.payloads[0]["max_tokens"] == 0
    assert completion.startswith(warmed + "<fim_suffix>")


async def test_warm_up_is_dropped_while_the_upstream_is_busy(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream()
    fake.gate = asyncio.Event()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, max_concurrency=1)
    busy = asyncio.create_task(proxy.post("/infill", json=llama_vscode_request(), headers={"X-Session-Id": "a"}))
    await fake.wait_until(lambda f: f.active == 1)
    warm = await proxy.post("/infill", json=llama_vscode_request(n_predict=0))
    assert warm.headers["X-Mellum-Outcome"] == "skipped"
    assert (await warm.json())["content"] == ""
    assert len(fake.payloads) == 1  # never queued, never reached the upstream
    fake.gate.set()
    assert (await busy).headers["X-Mellum-Outcome"] == "ok"  # and it did not cancel the real completion


async def test_continue_llama_cpp_completion_stream(proxy: Any) -> None:
    """continuedev/continue core/llm/llms/LlamaCpp.ts: POST /completion {prompt, stream: true, n_predict, ...}."""
    body = {"prompt": PREFIX, "stream": True, "n_predict": 16, "stop": ["\n\n"], "top_k": 40, "top_p": 0.9,
            "temperature": 0.0}  # fmt: skip
    resp = await proxy.post("/completion", json=body)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    seen = [event async for event in events(resp)]
    content = "".join(e["content"] for e in seen if isinstance(e, dict) and e.get("content"))  # streamSse
    assert content
    assert isinstance(seen[-1], dict) and seen[-1]["stop"] is True and "[DONE]" not in seen


async def test_continue_ollama_discovery_and_fim_stream(proxy: Any) -> None:
    """continuedev/continue core/llm/llms/Ollama.ts: /api/show, /api/tags, then /api/generate with suffix."""
    show = await (await proxy.post("/api/show", json={"name": "mellum"})).json()
    assert ".Suffix" in show["template"]  # Continue: fimSupported = template includes ".Suffix"
    assert show["parameters"].startswith("num_ctx ")
    tags = await (await proxy.get("/api/tags")).json()
    assert tags["models"][0]["name"] == "gemma-3-270m-q4_k_m"  # Continue: data.models.map(m => m.name)
    assert (await (await proxy.get("/api/version")).json())["version"]
    body = {"model": "mellum", "prompt": PREFIX + "    return ", "suffix": SUFFIX, "raw": True,
            "options": {"temperature": 0.01, "top_p": 0.9, "num_predict": 16, "stop": ["\n\n"], "num_ctx": 2048},
            "keep_alive": 1800, "stream": True}  # fmt: skip
    resp = await proxy.post("/api/generate", json=body)
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines() if line.strip()]
    assert "".join(line["response"] for line in lines)  # Continue: yield j.response per NDJSON line
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] > 0


async def test_twinny_ollama_prerendered_fim(proxy: Any) -> None:
    """twinnydotdev/twinny src/extension/completion/request-body.ts (Ollama): a pre-rendered FIM prompt."""
    prompt = f"<fim_prefix>{PREFIX}    return <fim_suffix>{SUFFIX}<fim_middle>"
    body = {"model": "mellum", "prompt": prompt, "stream": False, "keep_alive": "5m",
            "options": {"temperature": 0.2, "num_predict": 16, "stop": ["<EOT>"]}}  # fmt: skip
    answer = await (await proxy.post("/api/generate", json=body)).json()
    assert isinstance(answer["response"], str) and answer["done"] is True
    assert proxy.app[RECORDS].last().truncated is False


async def test_minuet_openai_fim_stream(proxy: Any) -> None:
    """milanglacier/minuet-ai.nvim lua/minuet/backends/common.lua `complete_openai_fim_base`: {model, stream,
    prompt, suffix} plus `options.optional` (max_tokens, top_p); it reads `choices[1].text`."""
    body = {"model": "mellum", "prompt": PREFIX + "    return ", "suffix": SUFFIX, "max_tokens": 16,
            "top_p": 0.9, "stream": True}  # fmt: skip
    resp = await proxy.post("/v1/completions", json=body)
    seen = [event async for event in events(resp)]
    assert "".join(e["choices"][0]["text"] for e in seen if isinstance(e, dict))
    assert seen[-1] == "[DONE]"


def test_burst_of_infill_requests_yields_one_upstream_request() -> None:
    async def main() -> tuple[FakeUpstream, list[Answer]]:
        fake = FakeUpstream()
        async with proxy_before(fake.app(), debounce_ms=150, tokenizer="chars") as proxy:
            tasks = []
            for i in range(10):
                request = llama_vim_request() | {"prompt": "    return " + "x" * i}
                tasks.append(asyncio.create_task(proxy.post("/infill", request)))
                await asyncio.sleep(0.01)  # keystrokes 10 ms apart (virtual time: exactly)
            return fake, await asyncio.gather(*tasks)

    fake, answers = run_virtual(main())
    assert [a.outcome for a in answers] == ["debounced"] * 9 + ["ok"]
    assert len(fake.payloads) == 1
    prompt = fake.payloads[0]["prompt"]  # the budget rendered Mellum's FIM prompt, extra file first
    # the edited file is not util.py: llama.vim never names it, so its header names no file
    assert prompt.startswith("<filename>util.py\nimport math\n<filename>\n<fim_suffix>")
    assert prompt.endswith("    return xxxxxxxxx<fim_middle>")


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/infill", {"input_prefix": 3}, lambda b: b["error"]["message"] == "'input_prefix' must be a string"),
        ("/api/generate", {"prompt": "x", "options": {"num_predict": "many"}},
         lambda b: b["error"] == "'options.num_predict' must be an integer"),
        ("/completion", {"prompt": [1, 2]}, lambda b: "token arrays" in b["error"]["message"]),
    ],
)  # fmt: skip
async def test_errors_in_the_dialects_own_shape(proxy: Any, path: str, body: dict[str, Any], shape: Any) -> None:
    resp = await proxy.post(path, json=body)
    assert resp.status == 400
    assert shape(await resp.json())
    assert proxy.app[RECORDS].last().outcome == "bad_request"
