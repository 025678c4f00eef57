"""`python -m benchmarks budget`: what an exact context budget costs on every keystroke.

Three measurements against the embedded llama.cpp server (gemma-3-270m, one slot, 4,096 tokens):

1. **Agreement**: the GGUF's own vocabulary rebuilt locally (`mellum_proxy.budget.gguf_vocab`) against the
   server's `/tokenize` on every file of `mellum_proxy/tuning/code/` and on the files cut at random points (BOS
   included, special tokens parsed): identical id sequences, and the largest count difference.
2. **Pre-upstream time per file size** (2 KB to 1 MB, cursor mid-file, `keystrokes` consecutive
   characters typed there): from the client sending a request to the upstream receiving it, through
   the proxy with debounce 0, for `gguf`, `upstream` (llama.cpp `/tokenize`) and `chars`. The upstream
   of this part records arrival times and answers at once; `/tokenize` goes to the real server.
3. **Replay**: `replay_keystrokes` consecutive keystrokes through the proxy to the real server, one
   completion each (debounce 0, 4 tokens): auxiliary upstream requests (`/tokenize`) per completion,
   and whether `usage.prompt_tokens + max_tokens <= max_context_tokens` held on every request.
4. **Stepped window**: `reuse_keystrokes` characters retyped mid-file, every keystroke's budgeted prompt
   (1,024 tokens) sent to the server (`/completion`, 1 token), adding up what the server took from its
   cache (`timings.cache_n`) against what it computed (`timings.prompt_n`), with the window's edges moving
   in 16-line steps and on every line. The server runs with `swa_full`: without it llama.cpp re-processes
   most of a gemma-3 prompt (its sliding-window layers keep too little cache to reuse a prefix).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from benchmarks.reporting.budget_report import Budget, render
from mellum_proxy.budget import BUILTIN, BudgetSettings, ContextBudget, UpstreamTokenizer
from mellum_proxy.budget.local import load_local
from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, command
from mellum_proxy.http import PROBES, RECORDS, UPSTREAM, build_app, serve_app
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.tuning.reporting.writing import measured
from mellum_proxy.tuning.sim.responder import Responder, answering, routes
from mellum_proxy.tuning.workloads.corpus import code_texts
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.embedded import EmbeddedServer, packaged_model

SIZES = (2_048, 20_480, 204_800, 1_048_576)
TOKENIZERS = ("gguf", "upstream", "chars")
CONTEXT, MAX_TOKENS = 2048, 4
JSON = {"Content-Type": "application/json"}


def add_commands(commands: Any) -> None:
    about = "the exact budget per keystroke: agreement, pre-upstream time, /tokenize, the stepped window's cache reuse"
    run = measured("budget", lambda args: measure(args.keystrokes, args.replay, args.reuse_keystrokes, print), render)
    budget = command(commands, "budget", about, run, out="budget")
    budget.add_argument("--keystrokes", type=POSITIVE, default=40, help="typed per file size [default: 40]")
    budget.add_argument("--replay", type=POSITIVE, default=300, help="keystrokes replayed [default: 300]")
    budget.add_argument("--reuse-keystrokes", type=POSITIVE, default=300,
                        help="retyped per window step, for the cache reuse [default: 300]")  # fmt: skip


def corpus_file(size: int) -> str:
    code = "\n".join(code_texts())
    return (code * (size // len(code) + 1))[:size]


class RecordingUpstream:
    """Answers completions at once and notes when each arrived; forwards `/tokenize` to the real server."""

    def __init__(self, real: str) -> None:
        self.real = real
        self.arrivals: list[float] = []
        self.tokenize_calls = 0

    def app(self) -> web.Application:
        app = routes({"POST /v1/completions": self._complete, "POST /tokenize": self._tokenize,
                      "GET /health": answering({"status": "ok"}),
                      "GET /props": answering({"total_slots": 1})})  # fmt: skip
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> Any:
        async with aiohttp.ClientSession() as self.session:
            yield

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.perf_counter())
        answer = Responder(request, await request.json(), "r", "m")
        await answer.write("x")
        return await answer.finish("length")

    async def _tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        async with self.session.post(self.real + "/tokenize", data=await request.read()) as resp:
            return web.Response(body=await resp.read(), content_type="application/json")


async def agreement(real: str, samples: int = 40) -> dict[str, Any]:
    local = await asyncio.to_thread(load_local, packaged_model())
    texts = list(code_texts())
    rng = random.Random(12)
    whole = "\n".join(texts)
    texts += [whole[: rng.randrange(len(whole))][-rng.randrange(200, 6000) :] for _ in range(samples)]
    same, worst, tokens = 0, 0, 0
    async with aiohttp.ClientSession() as session:
        for text in texts:
            async with session.post(real + "/tokenize", json={"content": text, "add_special": True}) as resp:
                server = (await resp.json())["tokens"]
            ids = local.ids(text)
            same += ids == server
            worst = max(worst, abs(len(ids) - len(server)))
            tokens += len(server)
    return {"texts": len(texts), "identical": same, "max_count_difference": worst, "tokens": tokens}


def _settings(upstream: str, tokenizer: str, **extra: Any) -> Settings:
    choice = str(packaged_model()) if tokenizer == "gguf" else tokenizer
    return Settings(upstream=upstream, tokenizer=choice, debounce_ms=0, timeout_ms=0, max_context_tokens=CONTEXT,
                    max_tokens=MAX_TOKENS, **extra)  # fmt: skip


async def pre_upstream(real: str, keystrokes: int, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    fake = RecordingUpstream(real)
    rows = []
    async with serve_app(fake.app()) as upstream:
        for tokenizer in TOKENIZERS:
            async with serve_app(build_app(_settings(upstream, tokenizer))) as proxy, aiohttp.ClientSession() as client:
                for size in SIZES:
                    text = corpus_file(size)
                    cursor = text.index("\n", size // 2) + 1
                    times, calls = [], fake.tokenize_calls
                    for n in range(keystrokes + 1):
                        body = {"prompt": text[:cursor] + "x" * n, "suffix": text[cursor:], "max_tokens": MAX_TOKENS}
                        data = orjson.dumps(body)  # encoded before the clock starts: the editor's cost, not ours
                        sent = time.perf_counter()
                        async with client.post(proxy + "/v1/completions", data=data, headers=JSON) as resp:
                            await resp.read()
                        if n:  # the first keystroke in a file meets a cold line cache; it is reported apart
                            times.append((fake.arrivals[-1] - sent) * 1000)
                        else:
                            cold = (fake.arrivals[-1] - sent) * 1000
                    rows.append({
                        "tokenizer": tokenizer, "file_bytes": size, "keystrokes": keystrokes,
                        "pre_upstream_p50_ms": statistics.median(times), "pre_upstream_max_ms": max(times),
                        "first_keystroke_ms": cold, "tokenize_calls": fake.tokenize_calls - calls,
                    })  # fmt: skip
                    progress(_row_line(rows[-1]))
    return rows


async def replay(real: str, tokenizer: str, keystrokes: int) -> dict[str, Any]:
    text = corpus_file(204_800)
    cursor = text.index("func (inv *Inventory) Find")
    typed, before, after = text[cursor : cursor + keystrokes], text[:cursor], text[cursor + keystrokes :]
    settings = _settings(real, tokenizer, max_concurrency=1)
    async with serve_app(app := build_app(settings)) as proxy, aiohttp.ClientSession() as client:
        await asyncio.wait_for(app[PROBES].settled.wait(), 60)
        calls = 0
        real_tokenize = app[UPSTREAM].tokenize

        async def counting(body: dict[str, Any], timeout_s: float = 5.0) -> Any:
            nonlocal calls
            calls += 1
            return await real_tokenize(body, timeout_s)

        app[UPSTREAM].tokenize = counting  # type: ignore[method-assign]
        over = 0
        for n in range(1, keystrokes + 1):
            body = {"prompt": before + typed[:n], "suffix": after, "max_tokens": MAX_TOKENS, "temperature": 0}
            async with client.post(proxy + "/v1/completions", json=body) as resp:
                over += over_budget(await resp.json())
        records = [r for r in app[RECORDS] if r.outcome == "ok"]
        method = records[-1].tokenizer if records else None
    return {"tokenizer": tokenizer, "method": method, "completions": keystrokes, "tokenize_calls": calls,
            "tokenize_per_completion": calls / keystrokes, "over_budget": over}  # fmt: skip


def over_budget(answer: dict[str, Any]) -> bool:
    """Whether an answer's prompt and `max_tokens` exceeded the context; a keystroke answered from the previous
    completion (typed through: no upstream request, no `usage`) sent no prompt at all."""
    usage = answer.get("usage")
    return usage is not None and usage["prompt_tokens"] + MAX_TOKENS > CONTEXT


async def stepped_window(real: str, step_lines: int, keystrokes: int, context: int = 1024) -> dict[str, Any]:
    """Prompt-cache reuse on the server while typing, with the window's edges moving in `step_lines` steps."""
    code = "\n".join(code_texts())
    settings = BudgetSettings(
        max_context_tokens=context, max_tokens=16, step_lines=step_lines, template=BUILTIN["mellum"]
    )
    cursor = code.index("func (inv *Inventory) Find")  # mid-corpus: both sides are longer than their shares
    typed, before, after = code[cursor : cursor + keystrokes], code[:cursor], code[cursor + keystrokes :]
    cached = computed = 0
    elapsed = []
    async with aiohttp.ClientSession() as session:
        upstream = UpstreamClient(session, real)
        budget = ContextBudget(settings, UpstreamTokenizer(upstream))
        for n in range(1, keystrokes + 1):
            request = NormalizedRequest(id="b", route="bench", session="s", prefix=before + typed[:n], suffix=after,
                                        file_path="app.py")  # fmt: skip
            out = await budget.apply(request)
            body = {"prompt": out.prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": True}
            sent = time.perf_counter()
            async with session.post(real + "/completion", json=body) as resp:
                timings = (await resp.json())["timings"]
            elapsed.append((time.perf_counter() - sent) * 1000)
            cached += timings.get("cache_n", 0)
            computed += timings["prompt_n"]
    return {"step_lines": step_lines, "keystrokes": keystrokes, "max_context_tokens": context, "cached_tokens": cached,
            "computed_tokens": computed, "reuse": cached / (cached + computed),
            "median_request_ms": statistics.median(elapsed)}  # fmt: skip


async def measure(
    keystrokes: int, replay_keystrokes: int, reuse_keystrokes: int, progress: Callable[[str], None]
) -> Budget:
    server = EmbeddedServer(ctx_tokens=4096, slots=1, swa_full=True)
    real = await asyncio.to_thread(server.start)
    try:
        agree = await agreement(real)
        progress(f"agreement: {agree['identical']}/{agree['texts']} identical")
        rows = await pre_upstream(real, keystrokes, progress)
        replays = []
        for tokenizer in ("gguf", "upstream"):
            replays.append(await replay(real, tokenizer, replay_keystrokes))
            progress(f"replay {tokenizer}: {replays[-1]['tokenize_per_completion']:.2f} /tokenize per completion")
        stepped = []
        for step in (16, 1):
            stepped.append(await stepped_window(real, step, reuse_keystrokes))
            progress(f"window steps of {step} lines: {stepped[-1]['reuse']:.1%} of prompt tokens from the cache")
    finally:
        await asyncio.to_thread(server.stop)
    return Budget(agreement=agree, pre_upstream=rows, replay=replays, stepped_window=stepped, context=CONTEXT)


def _row_line(row: dict[str, Any]) -> str:
    return (f"{row['tokenizer']:>8} {row['file_bytes']:>8} B: p50 {row['pre_upstream_p50_ms']:.2f} ms, first "
            f"{row['first_keystroke_ms']:.1f} ms, /tokenize {row['tokenize_calls']}")  # fmt: skip
