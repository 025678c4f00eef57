"""`python -m benchmarks lanes`: completion latency beside chat on one server, with and without lanes.

The scenario: a server with two slots, two chat clients streaming long answers (each asks again the moment its
answer ends), and an editor asking for a completion every `--every-ms` for `--seconds`. Four runs under the same
load: the completions alone through the proxy; everything straight to the server (`direct`); through the proxy
with bulk requests allowed every slot (`completion_reserve = 0`: no lanes); through the proxy's defaults (lanes).
Reported: the completions' time to first text (an answer without text counts at its end), how many had text,
the chat answers completed and their mean time. The target: with lanes, the completion p95 within 1.5x its p95
alone + 100 ms, while every chat client still completes answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from benchmarks.reporting.lanes_report import Lanes, render
from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.http import build_app, serve_app
from mellum_proxy.telemetry.stats import percentile
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.runners.upstreams import upstream_for
from mellum_proxy.tuning.sim.server import SimServer, profile

# Each run: the completions go through the proxy (else straight to the server); the chats too (else straight).
MODES: dict[str, tuple[bool, bool]] = {
    "alone": (True, False),  # no chat at all
    "direct": (False, False),
    "no lanes": (True, False),  # the proxy does not see the chats: as it passed them on before lanes
    "lanes": (True, True),
}
DIRECT_TIMEOUT_S = 5.0  # a plugin's own limit when it talks to the server straight
TARGET_FACTOR, TARGET_MS = 1.5, 100.0


def add_commands(commands: Any) -> None:
    lanes = command(commands, "lanes", "completion latency beside chat on one 2-slot server, with and without lanes",
                    _lanes, out="lanes")  # fmt: skip
    lanes.add_argument("--upstream", default="sim:gpu",
                       help="'sim[:PROFILE]' (served with 2 slots) or 'embedded' [default: sim:gpu]")  # fmt: skip
    lanes.add_argument("--seconds", type=POSITIVE, default=20, help="each run's length [default: 20]")
    lanes.add_argument("--every-ms", type=POSITIVE, default=400, help="between completions [default: 400]")
    lanes.add_argument("--chats", type=POSITIVE, default=2, help="chat clients [default: 2]")
    lanes.add_argument("--chat-tokens", type=POSITIVE, default=600,
                       help="tokens in each chat answer (4 s at the gpu profile) [default: 600]")  # fmt: skip
    lanes.add_argument("--max-tokens", type=POSITIVE, default=16, help="each completion's [default: 16]")


def _lanes(args: argparse.Namespace) -> None:
    if args.upstream != "embedded" and not args.upstream.startswith("sim"):
        fail("bench lanes takes --upstream sim[:PROFILE] or embedded (it starts the server it measures)")
    try:
        result = asyncio.run(measure(args.upstream, args.seconds, args.every_ms, args.chats, args.chat_tokens,
                                     args.max_tokens, progress=print))  # fmt: skip
    except ValueError as exc:
        fail(str(exc))
    write_report(args.out, "lanes", result, render)


@contextlib.asynccontextmanager
async def two_slots(spec: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh server with two slots: a simulated profile (its figures, 2 slots), or the embedded llama.cpp."""
    if spec == "embedded":
        async with upstream_for("embedded") as served:
            yield served
        return
    chosen = dataclasses.replace(profile(spec.partition(":")[2] or "gpu"), slots=2)
    async with serve_app(SimServer(chosen).app()) as url:
        yield url, f"sim:{chosen.name} with 2 slots ({chosen.source})"


async def measure(
    upstream: str, seconds: float, every_ms: float, chats: int, chat_tokens: int, max_tokens: int,
    progress: Callable[[str], None] = print,
) -> Lanes:  # fmt: skip
    modes: dict[str, Any] = {}
    described = upstream
    for mode, (completions_proxied, chats_proxied) in MODES.items():
        async with two_slots(upstream) as (url, server):
            described = server
            modes[mode] = await one_run(url, completions_proxied, chats_proxied, seconds, every_ms,
                                        0 if mode == "alone" else chats, chat_tokens, max_tokens)  # fmt: skip
        progress(f"{mode}: {line(modes[mode])}")
    alone, lanes = modes["alone"]["ttft_p95_ms"], modes["lanes"]["ttft_p95_ms"]
    limit = None if alone is None else TARGET_FACTOR * alone + TARGET_MS
    met = limit is not None and lanes is not None and lanes <= limit and modes["lanes"]["chat_answers"] > 0
    return Lanes(
        upstream=described,
        seconds=seconds,
        every_ms=every_ms,
        chats=chats,
        chat_tokens=chat_tokens,
        max_tokens=max_tokens,
        modes=modes,
        target={"lanes_p95_limit_ms": limit, "met": met},
    )


async def one_run(
    upstream: str, completions_proxied: bool, chats_proxied: bool, seconds: float, every_ms: float, chats: int,
    chat_tokens: int, max_tokens: int,
) -> dict[str, Any]:  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        proxied = upstream
        if completions_proxied or chats_proxied:
            proxy = build_app(Settings.model_validate({"upstream": upstream, "log": None}))  # the defaults
            proxied = await stack.enter_async_context(serve_app(proxy))
        url, chat_url = proxied if completions_proxied else upstream, proxied if chats_proxied else upstream
        session = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        stop = asyncio.Event()
        answers: list[float] = []
        refused = [0]
        chatters = [asyncio.create_task(chat_client(session, chat_url, chat_tokens, stop, answers, refused))
                    for _ in range(chats)]  # fmt: skip
        ttfts: list[float] = []
        with_text = [0]
        requests = []
        started = time.monotonic()
        number = 0
        while time.monotonic() - started < seconds:
            requests.append(asyncio.create_task(completion(session, url, number, max_tokens, ttfts, with_text,
                                                           direct=not completions_proxied)))  # fmt: skip
            number += 1
            await asyncio.sleep(every_ms / 1000)
        await asyncio.gather(*requests)
        stop.set()
        await asyncio.gather(*chatters)  # each ends the answer it has under way: every chat completes
    return {
        "completions": number, "with_text": with_text[0],
        "ttft_p50_ms": percentile(ttfts, 50), "ttft_p95_ms": percentile(ttfts, 95),
        "chat_answers": len(answers), "chat_answer_mean_s": statistics.fmean(answers) if answers else None,
        "chat_refused": refused[0],
    }  # fmt: skip


async def completion(
    session: aiohttp.ClientSession, url: str, number: int, max_tokens: int, ttfts: list[float], with_text: list[int],
    direct: bool,
) -> None:  # fmt: skip
    """One completion, streamed: its time to the first text (or to its end, when it has none)."""
    body = {"prompt": f"def step_{number}(state, event):\n    if event.kind == ", "max_tokens": max_tokens,
            "stream": True, "temperature": 0}  # fmt: skip
    started = time.monotonic()
    first: float | None = None
    try:
        timeout = aiohttp.ClientTimeout(total=DIRECT_TIMEOUT_S if direct else None)
        headers = {"X-Session-Id": f"editor-{number}"}  # its own: each one's latency, none superseded
        async with session.post(url + "/v1/completions", json=body, headers=headers, timeout=timeout) as resp:
            async for line in resp.content:
                if first is None and line.startswith(b"data: {") and _has_text(line[6:]):
                    first = time.monotonic()
    except (aiohttp.ClientError, TimeoutError):
        pass
    end = time.monotonic()
    if first is not None:
        with_text[0] += 1
    ttfts.append(((first or end) - started) * 1000)


def _has_text(data: bytes) -> bool:
    try:
        return bool(orjson.loads(data)["choices"][0].get("text"))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return False


async def chat_client(
    session: aiohttp.ClientSession, url: str, tokens: int, stop: asyncio.Event, answers: list[float], refused: list[int]
) -> None:
    """Ask, read the whole streamed answer, ask again, until `stop`; each completed answer's time."""
    body = {"messages": [{"role": "user", "content": "Explain what this module does, step by step."}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    while not stop.is_set():
        started = time.monotonic()
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                data = await resp.read()
            whole = resp.status == 200 and data.rstrip().endswith(b"data: [DONE]")
        except aiohttp.ClientError:  # llama.cpp closes a connection after a streamed answer: a pooled one may fail
            whole = False
        if whole:
            answers.append(time.monotonic() - started)
        else:
            refused[0] += 1
            await asyncio.sleep(0.1)


def line(run: dict[str, Any]) -> str:
    p50, p95 = run["ttft_p50_ms"], run["ttft_p95_ms"]
    mean = run["chat_answer_mean_s"]
    return (f"completion first text p50 {p50:.0f} ms, p95 {p95:.0f} ms ({run['with_text']} of {run['completions']} "
            f"with text); chat answers {run['chat_answers']}"
            + (f", {mean:.1f} s each" if mean is not None else ""))  # fmt: skip
