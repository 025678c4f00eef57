"""`python -m benchmarks first-run`: what a newcomer sees after `make run`, measured as they would see it.

It starts `mellum-proxy serve --embedded` as a process of its own (the defaults, nothing tuned), optionally
next to processes that keep cores busy (an editor and a browser do that on a laptop), and records the time
until `/health` says ok and the time to the first completion; then it asks for completions at different
positions of a small Python file, as an editor plugin would (OpenAI `prompt` + `suffix`, not streamed), and
checks each: not empty, not cut by the deadline, no fill-in-the-middle marker in it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.reporting.first_run_report import FirstRun, render
from benchmarks.runners.processes import busy_cores
from mellum_proxy.console import INDEX, command
from mellum_proxy.tuning.reporting.writing import measured
from mellum_proxy.tuning.workloads.corpus import CODE_DIR
from mellum_proxy.urls import free_port


def add_commands(commands: Any) -> None:
    about = "a newcomer's `make run`: time to healthy, to the first completion, and what six completions show"
    handler = measured("first-run", lambda args: run(args.busy, extra=tuple(args.serve_args)), render)
    first = command(commands, "first-run", about, handler, out="first-run")
    first.add_argument("--busy", type=INDEX, default=1, help="processes keeping a core busy meanwhile [default: 1]")
    first.add_argument("serve_args", nargs="*", help="extra `serve` flags, after --")


# Where the cursor is: the text of the line up to the cursor; the rest of that line is not written yet.
POSITIONS = (
    "        self.quantity += ",
    "        return sum(",
    "        needle = text.",
    "        self.items[item.sku] = ",
    '    print(f"total: {',
    "            raise ",
)
MARKERS = ("<fim_", "<filename>", "<|endoftext|>", "<|fim")
HEALTH_WATCH_S = 5.0  # from the first ok /health: how long its answer times are watched (target: p99 <= 50 ms)


@dataclass
class Shown:
    """One completion as the plugin got it."""

    position: str
    outcome: str
    text: str
    finish_reason: str | None
    total_ms: float

    @property
    def good(self) -> bool:
        return bool(self.text.strip()) and self.outcome == "ok" and not any(m in self.text for m in MARKERS)


def cursor_at(source: str, line_start: str) -> tuple[str, str]:
    """(prefix, suffix) with the cursor after `line_start`, the rest of its line not typed yet."""
    at = source.index(line_start) + len(line_start)
    line_end = source.index("\n", at)
    return source[:at], source[line_end:]


async def run(busy: int = 1, timeout_s: float = 300.0, extra: tuple[str, ...] = ()) -> FirstRun:
    """Start the proxy as `make run` does, wait for it, then complete at each of `POSITIONS`."""
    source = (CODE_DIR / "inventory.py").read_text()
    port = free_port()
    log = (
        Path(tempfile.gettempdir()) / f"mellum-first-run-{port}.jsonl"
    )  # as `make run` logs, but not to the user's log
    command = [sys.executable, "-m", "mellum_proxy", "serve", "--embedded", "--listen", f"127.0.0.1:{port}",
               "--log", str(log), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with busy_cores(busy):
        started = time.monotonic()
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # noqa: ASYNC220
        try:
            healthy_s, health_ms, completed = await _measure(f"http://127.0.0.1:{port}", source, started, timeout_s)
        finally:
            server.send_signal(signal.SIGTERM)
            output, _ = server.communicate(timeout=60)
            for part in log.parent.glob(log.name + "*"):
                part.unlink(missing_ok=True)
    serve_command = " ".join(["mellum-proxy", *command[3:]])
    return FirstRun(
        healthy_s=healthy_s,
        first_completion_s=completed["first_completion_s"],
        good=completed["good"],
        completions=completed["completions"],
        health_ms=health_ms,
        health_watch_s=HEALTH_WATCH_S,
        busy_processes=busy,
        serve_command=serve_command,
        command=serve_command,
        startup_lines=[line for line in output.splitlines() if line.strip()][:40],
    )


async def _watch_health(
    session: aiohttp.ClientSession, url: str, healthy: asyncio.Future[float], timeout_s: float
) -> list[float]:
    """Ask `/health` every 20 ms from the proxy's start, on a fixed schedule (a probe does not wait for the one
    before it, so a stall is seen by every probe it holds, not by one); `healthy` gets the time of its first ok.
    Returns the answer times (ms) of the ok answers asked from the first ok one on, for `HEALTH_WATCH_S`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    first_ok_asked: list[float] = []  # when the first probe that got an ok was sent

    async def probe() -> tuple[float, float] | None:
        asked = loop.time()
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                if resp.status != 200:
                    return None
        except (aiohttp.ClientError, TimeoutError):  # not listening yet
            return None
        if not healthy.done():
            healthy.set_result(loop.time() - started)
            first_ok_asked.append(asked)
        return asked, (loop.time() - asked) * 1000

    probes: list[asyncio.Task[tuple[float, float] | None]] = []
    while loop.time() - started < timeout_s and not (
        first_ok_asked and loop.time() > first_ok_asked[0] + HEALTH_WATCH_S
    ):
        probes.append(asyncio.create_task(probe()))
        await asyncio.sleep(0.02)
    answers = [answer for answer in await asyncio.gather(*probes) if answer is not None]
    if not healthy.done():
        healthy.set_exception(TimeoutError(f"/health not ok within {timeout_s:.0f} s"))
        return []
    return [ms for asked, ms in answers if asked >= first_ok_asked[0]]


async def _measure(
    url: str, source: str, started: float, timeout_s: float
) -> tuple[float, dict[str, float | int], dict[str, Any]]:
    """Seconds to healthy, `/health`'s answer times from then on, and the completions."""
    async with aiohttp.ClientSession() as session:
        healthy: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        watch = asyncio.create_task(_watch_health(session, url, healthy, timeout_s))
        waited = time.monotonic() - started
        healthy_s = waited + await healthy
        result = await _complete(session, url, source, started)
        health_ms = sorted(await watch)
    return healthy_s, _summary(health_ms), result


def _summary(times: list[float]) -> dict[str, float | int]:
    def at(q: float) -> float:
        return round(times[min(len(times) - 1, int(q * len(times)))], 1)

    return {"count": len(times), "p50": at(0.5), "p99": at(0.99), "max": round(times[-1], 1)}


async def _complete(session: aiohttp.ClientSession, url: str, source: str, started: float) -> dict[str, Any]:
    """Complete at each of `POSITIONS`, as a plugin asks: what each shows, and when the first came."""
    shown = []
    first_s = None
    for line_start in POSITIONS:
        prefix, suffix = cursor_at(source, line_start)
        asked = time.monotonic()
        body = {"model": "mellum", "prompt": prefix, "suffix": suffix, "max_tokens": 128, "stream": False}
        async with session.post(url + "/v1/completions", json=body) as resp:
            answer = await resp.json()
            outcome = resp.headers.get("X-Mellum-Outcome", f"http {resp.status}")
        choice = (answer.get("choices") or [{}])[0]
        shown.append(Shown(line_start.strip(), outcome, choice.get("text") or "", choice.get("finish_reason"),
                           (time.monotonic() - asked) * 1000))  # fmt: skip
        if first_s is None:
            first_s = time.monotonic() - started
    return {
        "first_completion_s": first_s,
        "good": sum(s.good for s in shown),
        "completions": [asdict(s) | {"good": s.good} for s in shown],
    }
