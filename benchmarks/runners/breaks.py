"""`python -m benchmarks breaks`: the first suggestion after a break, from a server that sleeps when idle.

The embedded llama.cpp unloads its model after `sleep_idle_s` idle seconds (`--sleep-idle-seconds`). After each
break, `keystrokes` keystrokes `gap_ms` apart (one session, each a streamed `/v1/completions` of the text typed so
far, from `PROMPT_CHARS` characters on) and then a pause: the time from the pause's keystroke to its first text.
Warm: the same after 1 s breaks, the server awake. Through `mellum-proxy serve` (a process of its own, its console
kept), then going direct to the same server. The server's own `/props` says whether it slept in each break.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.reporting.breaks_report import Breaks, render
from benchmarks.runners.processes import wait_healthy
from mellum_proxy.console import POSITIVE, command, fail, real
from mellum_proxy.stopping import stopped_like_ctrl_c
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.workloads.corpus import code_texts
from mellum_proxy.upstream.embedded import EmbeddedServer
from mellum_proxy.urls import free_port

PROMPT_CHARS = 600
WARM_BREAK_S = 1.0
WARM_BURSTS = 3


def add_commands(commands: Any) -> None:
    breaks = command(commands, "breaks", "the first suggestion after a break, from a server that sleeps when idle",
                     _breaks, out="breaks")  # fmt: skip
    breaks.add_argument("--breaks", type=POSITIVE, default=5, help="breaks [default: 5]")
    breaks.add_argument("--break-s", type=real(0.5, 600.0), default=5.0, help="each break's length [default: 5]")
    breaks.add_argument("--keystrokes", type=POSITIVE, default=12, help="after each break [default: 12]")
    breaks.add_argument("--gap-ms", type=real(10.0, 5000.0), default=180.0, help="between keystrokes [default: 180]")
    breaks.add_argument("--sleep-idle-s", type=POSITIVE, default=2, help="the server's idle limit [default: 2]")


def _breaks(args: argparse.Namespace) -> None:
    try:
        with stopped_like_ctrl_c():
            result = asyncio.run(measure(args.breaks, args.break_s, args.keystrokes, args.gap_ms / 1000,
                                         args.sleep_idle_s, progress=print))  # fmt: skip
    except KeyboardInterrupt:
        fail("breaks: stopped before its end; the proxy and the server it started are stopped, no report written")
    write_report(args.out, "breaks", result, render)


async def first_text(session: aiohttp.ClientSession, url: str, prefix: str) -> float | None:
    """Seconds from sending to the first text of a streamed completion; None: none came."""
    started = time.monotonic()
    body = {"prompt": prefix, "max_tokens": 16, "stream": True}
    async with session.post(url + "/v1/completions", json=body, headers={"X-Session-Id": "typist"}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {") and orjson.loads(line[6:])["choices"][0]["text"]:
                return time.monotonic() - started
    return None


async def sleeping(session: aiohttp.ClientSession, server: str) -> bool:
    async with session.get(server + "/props") as resp:
        return bool((await resp.json()).get("is_sleeping"))


async def typed(
    session: aiohttp.ClientSession, url: str, server: str, text: str, start: int, rest_s: float, keystrokes: int,
    gap_s: float,
) -> tuple[float | None, bool]:  # fmt: skip
    """After `rest_s` of quiet, `keystrokes` keystrokes and a pause: the pause's first text (ms), and whether the
    server slept at the end of the quiet."""
    await asyncio.sleep(rest_s)
    asleep = await sleeping(session, server)
    typing = []
    for n in range(keystrokes):
        end = start + n
        typing.append(asyncio.create_task(first_text(session, url, text[:end])))  # typed on: the prefix grows
        await asyncio.sleep(gap_s)
    pause = await typing[-1]
    await asyncio.gather(*typing, return_exceptions=True)
    return (None if pause is None else pause * 1000), asleep


async def measure(
    breaks: int, break_s: float, keystrokes: int, gap_s: float, sleep_idle_s: int, progress: Callable[[str], None]
) -> Breaks:
    server = EmbeddedServer(ctx_tokens=4096, slots=2, sleep_idle_s=sleep_idle_s)
    upstream = await asyncio.to_thread(server.start)
    text = max(code_texts(), key=len)
    modes: dict[str, dict[str, Any]] = {}
    console = {"asleep": 0, "woke": 0}
    try:
        async with aiohttp.ClientSession() as session:
            for mode in ("proxy", "direct"):
                with tempfile.TemporaryDirectory() as folder:
                    stderr_path = Path(folder) / "stderr"
                    process = None
                    url = upstream
                    if mode == "proxy":
                        port = free_port()
                        with stderr_path.open("wb") as stderr:
                            process = await asyncio.create_subprocess_exec(
                                sys.executable, "-m", "mellum_proxy", "serve", "--upstream", upstream, "--listen",
                                f"127.0.0.1:{port}", "--log", "off", stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
                            )  # fmt: skip
                        url = f"http://127.0.0.1:{port}"
                        await wait_healthy(session, url, exited=process)
                    try:
                        position = PROMPT_CHARS
                        warm: list[float | None] = []
                        for _ in range(WARM_BURSTS):
                            pause, _ = await typed(session, url, upstream, text, position, WARM_BREAK_S, keystrokes,
                                                   gap_s)  # fmt: skip
                            warm.append(pause)
                            position += keystrokes
                        after: list[float | None] = []
                        asleep: list[bool] = []
                        for _ in range(breaks):
                            pause, slept = await typed(session, url, upstream, text, position, break_s, keystrokes,
                                                       gap_s)  # fmt: skip
                            after.append(pause)
                            asleep.append(slept)
                            position += keystrokes
                        median = statistics.median([ms for ms in warm if ms is not None] or [0.0])
                        modes[mode] = {"warm_ms": warm, "warm_median_ms": median, "bar_ms": 2 * median + 150,
                                       "breaks_ms": after, "asleep": asleep}  # fmt: skip
                        progress(f"breaks: {mode}: warm {warm}, after the breaks {after}, asleep {asleep}")
                    finally:
                        if process is not None:
                            process.terminate()
                            await process.wait()
                            said = stderr_path.read_text(errors="replace")
                            console = {"asleep": said.count(" is asleep "), "woke": said.count(" woke in "),
                                       "restored": said.count(" prompt caches restored")}  # fmt: skip
    finally:
        await asyncio.to_thread(server.stop)
    return {
        "sleep_idle_s": sleep_idle_s, "break_s": break_s, "keystrokes": keystrokes, "gap_ms": gap_s * 1000,
        "prompt_chars": PROMPT_CHARS, "modes": modes, "console": console,
    }  # fmt: skip
