"""`python -m benchmarks ladder`: prompt lengths x concurrency against a real server, one variable at a time.

One fixed code snippet (the project's own `mellum_proxy/tuning/code/` by default) is cut to each prompt length in
tokens, exactly, with the server's own tokenizer; the longest defaults to near the server's context. Every cell
sends `repeat` streaming requests (rounded up to whole groups of `concurrency`), `concurrency` at once, at
temperature 0 and a fixed seed with the prompt cache off (`cache_prompt: false`), and records time to first
token, total time, tokens from `usage`, failures by kind, and memory: GPU through NVML (null without an NVIDIA
driver) and the server process's host RSS where its PID is known (labelled host memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.reporting.ladder_report import Attempt, Cell, as_json, plot, render
from benchmarks.upstreams import upstream_for
from mellum_proxy.budget.tokenizers import TokenCounter, upstream_counter
from mellum_proxy.console import INDEX, POSITIVE, command, fail
from mellum_proxy.errors import UpstreamError
from mellum_proxy.planning.probe import host_rss_mib
from mellum_proxy.telemetry import GpuSampler, NvmlBackend
from mellum_proxy.tuning.reporting.writing import command_line
from mellum_proxy.tuning.runners.policy import add_proxy_options, chosen_policy, proxy_for
from mellum_proxy.tuning.runners.upstreams import context_limit
from mellum_proxy.tuning.workloads.corpus import code_texts
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.servers.openai import served_model


def add_commands(commands: Any) -> None:
    about = "prompt length x concurrency against a real server: TTFT, memory, failures"
    ladder = command(commands, "ladder", about, _ladder, out="ladder")
    ladder.add_argument("--upstream", required=True, help="URL or 'embedded'")
    add_proxy_options(ladder)
    ladder.add_argument("--contexts", default="short,mid,long", help="prompt tokens, or short,mid,long [default]")
    ladder.add_argument("--concurrency", default="1,2,4", help="requests at once [default: 1,2,4]")
    ladder.add_argument("--repeat", type=POSITIVE, default=5,
                        help="requests per cell, rounded up to a multiple of the concurrency [default: 5]")  # fmt: skip
    ladder.add_argument("--max-tokens", type=POSITIVE, default=64)
    ladder.add_argument(
        "--code", type=Path, help="the code snippet [default: the shipped mellum_proxy/tuning/code corpus]"
    )
    ladder.add_argument("--context-limit", type=POSITIVE,
                        help="the server's context per request [default: from /props]")  # fmt: skip
    ladder.add_argument("--gpu", type=INDEX, default=0)
    ladder.add_argument("--upstream-pid", type=POSITIVE, help="server PID, for its host memory")


def _ladder(args: argparse.Namespace) -> None:
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        fail(f"--concurrency takes comma-separated numbers, got '{args.concurrency}'")
    asyncio.run(_run_ladder(args, concurrencies))


async def _run_ladder(args: argparse.Namespace, concurrencies: list[int]) -> None:
    code = args.code.read_text() if args.code else "\n".join(code_texts() * 3)
    async with upstream_for(args.upstream) as (url, described):
        pid = args.upstream_pid or (os.getpid() if args.upstream == "embedded" else None)
        limit = args.context_limit or await context_limit(url)
        names = {"short": 256, "mid": 1024, "long": (limit or 2048) - args.max_tokens - 16}
        try:
            contexts = [names[c] if c in names else int(c) for c in args.contexts.split(",")]
        except ValueError:
            fail(f"--contexts takes numbers or short,mid,long, got '{args.contexts}'")
        async with aiohttp.ClientSession() as session:
            client = UpstreamClient(session, url)
            model = await served_model(client)
            counter = await upstream_counter(client, model)  # with each token's text, else by count
            if counter is None:
                fail("the server has no /tokenize to cut prompts to exact token counts with")
            try:
                prompts = {n: await cut_to_tokens(code, n, counter) for n in contexts}
            except (UpstreamError, ValueError) as exc:
                fail(f"cannot cut the prompts with the server's /tokenize: {exc}")
        gpu = GpuSampler(lambda: NvmlBackend(args.gpu, pid))
        gpu.open()
        async with proxy_for(chosen_policy(args), url) as (target, _):
            print(f"upstream: {described}; context limit {limit}; {'via proxy' if args.via_proxy else 'direct'}")
            cells = await run_ladder(target + "/v1/completions", prompts, concurrencies, args.repeat,
                                            args.max_tokens, gpu, pid, progress=print, model=model)  # fmt: skip
        gpu.close()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": command_line(), "upstream": described, "context_limit": limit, "via_proxy": args.via_proxy,
            "vram_source": gpu.source, "vram_reason": gpu.reason}  # fmt: skip
    (args.out / "ladder.json").write_bytes(as_json(cells, meta))
    text = render(cells, command_line())
    (args.out / "ladder.md").write_text(text)
    plot(cells, args.out / "ladder.png")
    print(text)
    print(f"wrote {args.out / 'ladder.json'}, {args.out / 'ladder.md'}, {args.out / 'ladder.png'}")


OOM_MARKERS = ("out of memory", "exceeds the available context", "exceed_context_size", "kv cache", "cuda error")


async def cut_to_tokens(text: str, tokens: int, counter: TokenCounter) -> str:
    """The start of `text` whose prompt (BOS included) is exactly `tokens` tokens, or as close below as exists.

    With a server that only counts (vLLM's `/tokenize` without token strings) the cut is searched by count:
    about log2(len(text)) calls.
    """
    if not counter.exact:
        return await _cut_by_count(text, tokens, counter)
    offsets = await counter.offsets(text)
    if tokens - 1 >= len(offsets):
        raise ValueError(f"the code snippet has only {len(offsets)} tokens; it cannot fill {tokens}")
    end = tokens - 1  # one for BOS
    cut = text[: offsets[end]] if end < len(offsets) else text
    count = await counter.count(cut)
    while count != tokens:  # re-tokenizing at the cut can merge or split one token: step until exact
        end += 1 if count < tokens else -1
        if end <= 0 or end >= len(offsets):
            break
        previous, cut = count, text[: offsets[end]]
        count = await counter.count(cut)
        if previous < tokens < count:  # no cut gives exactly `tokens`: keep the one just below
            cut = text[: offsets[end - 1]]
            break
    return cut


async def _cut_by_count(text: str, tokens: int, counter: TokenCounter) -> str:
    """The longest start of `text` whose count is at most `tokens` (a binary search on characters)."""
    if await counter.count(text) < tokens:
        raise ValueError(f"the code snippet has fewer than {tokens} tokens; it cannot fill them")
    low, high = 0, len(text)  # count(text[:low]) <= tokens < count(text[:high + 1]) is kept true
    while low < high:
        middle = (low + high + 1) // 2
        if await counter.count(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def classify(status: int | None, body: str) -> str:
    lowered = body.lower()
    if any(marker in lowered for marker in OOM_MARKERS):
        return f"out_of_memory ({status})" if status else "out_of_memory"
    return f"http_{status}"


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, timeout_s: float, model: str | None = None
) -> Attempt:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 42, "stream": True,
            "cache_prompt": False, "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if model is not None:
        body["model"] = model  # vLLM answers 404 for a name it does not serve
    attempt = Attempt()
    started = time.monotonic()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status >= 400:
                attempt.failure = classify(resp.status, await resp.text())
                return attempt
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                event = orjson.loads(line[5:])
                if "error" in event:
                    attempt.failure = classify(None, str(event["error"]))
                    return attempt
                text = (event.get("choices") or [{}])[0].get("text")
                if text and attempt.ttft_ms is None:
                    attempt.ttft_ms = (time.monotonic() - started) * 1000
                if event.get("usage"):
                    attempt.prompt_tokens = event["usage"].get("prompt_tokens")
                    attempt.completion_tokens = event["usage"].get("completion_tokens")
        attempt.total_ms = (time.monotonic() - started) * 1000
    except TimeoutError:
        attempt.failure = "timeout"
    except aiohttp.ClientConnectorError:
        attempt.failure = "refused"
    except aiohttp.ClientError as exc:
        attempt.failure = f"connection: {type(exc).__name__}"
    return attempt


@contextlib.asynccontextmanager
async def watching(gpu: GpuSampler | None, pid: int | None, cell: Cell) -> AsyncIterator[None]:
    """GPU memory before / peak / after, and the server's host RSS peak, around one cell."""
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            if gpu is not None:
                await gpu.sample_once()
            rss = host_rss_mib(pid)
            if rss is not None:
                cell.host_rss_peak_mib = max(cell.host_rss_peak_mib or 0.0, rss)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)  # the sampling period, ended early by `stop`

    if gpu is not None and gpu.source == "nvml":
        reading = await gpu.sample_once()
        cell.vram_before_mib = reading.used_mib if reading else None
        gpu.start_window(id(cell))
    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        stop.set()
        await task
        if gpu is not None and gpu.source == "nvml":
            window = gpu.end_window(id(cell))
            cell.vram_peak_mib, cell.vram_after_mib = window.peak_mib, window.end_mib


async def run_ladder(
    url: str,
    prompts: dict[int, str],
    concurrencies: list[int],
    repeat: int,
    max_tokens: int,
    gpu: GpuSampler | None = None,
    pid: int | None = None,
    timeout_s: float = 120.0,
    progress: Callable[[str], None] | None = None,
    model: str | None = None,
) -> list[Cell]:
    """Every (context, concurrency) cell, contexts changing slowest: one variable changes per row."""
    cells = []
    # A fresh connection per request: llama.cpp closes idle keep-alive connections, and a pooled one that
    # it closed would be counted as a server failure.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for context, prompt in prompts.items():
            for concurrency in concurrencies:
                cell = Cell(context, concurrency)
                async with watching(gpu, pid, cell):
                    # whole groups only: a lone last request (repeat 5 at concurrency 2) ran alone and was
                    # averaged with the concurrent ones
                    for _ in range(math.ceil(repeat / concurrency)):
                        cell.attempts += await asyncio.gather(
                            *(
                                one_request(session, url, prompt, max_tokens, timeout_s, model)
                                for _ in range(concurrency)
                            )
                        )
                cells.append(cell)
                if progress:
                    s = cell.summary()
                    progress(f"context {context}, concurrency {concurrency}: ttft p50 {s['ttft_p50_ms']} ms, "
                             f"failures {s['failures'] or 'none'}")  # fmt: skip
    return cells
