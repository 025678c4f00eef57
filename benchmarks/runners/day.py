"""`python -m benchmarks day`: a working day in an hour, for a proxy that runs for days.

The embedded llama.cpp (gemma-3-270m) serves on a fixed port and unloads its model after 2 idle seconds. Two
`mellum-proxy serve` processes (the installed service and a `make run` beside it) share one request log and front
it, rotating at 8 MB and keeping every rotated file (`log_keep` 1000: what the default 3 drops by design, the
oldest, would read as lost). `typists` editors type bursts of keystrokes (each a streamed `/v1/completions`) with
pauses, half naming their session and half not (llama.vim's way: the proxy tells their documents apart); every
`BREAK_EVERY_S` all of them stop for `BREAK_S`, long enough for the server to fall asleep; halfway the server is
stopped and started again on its port; editors open new connection pools now and then and leave some requests mid-
flight. Every minute each proxy's resident memory, open files, threads, asyncio tasks, sessions and anonymous
documents are read. At the end both are stopped with SIGTERM and the shared log is read back: every answered request
must have its line.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.reporting.day_report import Day, render
from benchmarks.runners.processes import process_state, wait_healthy
from mellum_proxy.console import INDEX, POSITIVE, command, fail, real
from mellum_proxy.stopping import stopped_like_ctrl_c
from mellum_proxy.telemetry.stats import log_files, read_log
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.workloads.corpus import code_texts
from mellum_proxy.upstream.embedded import EmbeddedServer
from mellum_proxy.urls import free_port

BREAK_EVERY_S = 90.0  # (a test shortens it)
BREAK_S = 8.0  # the server sleeps after 2 s idle (the last requests end within the 1.5 s deadline)
SAMPLE_EVERY_S = 60.0
ABANDON_SHARE = 0.05  # requests whose editor leaves within 300 ms
NEW_POOL_EVERY = 60  # requests between two connection pools of one editor


def add_commands(commands: Any) -> None:
    day = command(commands, "day", "two proxies for an hour before a sleeping, restarting server: RSS, log", _day,
                  out="day")  # fmt: skip
    day.add_argument("--minutes", type=real(0.2, 24 * 60.0), default=60.0, help="how long [default: 60]")
    day.add_argument("--typists", type=POSITIVE, default=6, help="editors typing at once [default: 6]")
    day.add_argument("--seed", type=INDEX, default=0, help="of the typing [default: 0]")


def _day(args: argparse.Namespace) -> None:
    try:
        with stopped_like_ctrl_c():
            result = asyncio.run(measure(args.minutes, args.typists, args.seed, progress=print))
    except KeyboardInterrupt:
        fail("day: stopped before its end; the proxies and the server it started are stopped, no report written")
    write_report(args.out, "day", result, render)
    if result["answered_not_logged"] or result["stderr_tracebacks"]:
        fail("day: an answered request went unlogged, or a proxy wrote a traceback (see the report)")


class Typist:
    """One editor typing through one of the proxies."""

    def __init__(self, number: int, url: str, text: str, seed: int, clock: Callable[[], float]) -> None:
        self.number, self.url, self.text = number, url, text
        self.rng = random.Random(seed * 1000 + number)
        self.headers = {"X-Session-Id": f"typist-{number}"} if number % 2 == 0 else {}  # odd ones: anonymous
        self.clock = clock
        self.answered: dict[str, int] = {}
        self.abandoned = 0
        self.pools = 0
        self.sent = 0
        self.position = self.rng.randrange(200, max(201, len(text) - 400))

    async def run(self, until: float, typing: asyncio.Event) -> None:
        """Type until `until`, stopping whenever `typing` is cleared (a break)."""
        while self.clock() < until:
            self.pools += 1
            async with aiohttp.ClientSession() as session:
                for _ in range(NEW_POOL_EVERY):
                    if self.clock() >= until:
                        return
                    await typing.wait()  # a break: everybody stops
                    await self.burst(session, typing)

    async def burst(self, session: aiohttp.ClientSession, typing: asyncio.Event) -> None:
        for _ in range(self.rng.randint(4, 14)):
            if not typing.is_set():
                return  # a break begins: the burst stops mid-way
            self.position = self.position + 1 if self.position + 1 < len(self.text) else 200
            prefix = self.text[max(0, self.position - 1500) : self.position]
            asyncio.get_running_loop().create_task(self.keystroke(session, prefix))
            await asyncio.sleep(self.rng.uniform(0.12, 0.25))
        await asyncio.sleep(self.rng.uniform(0.5, 2.5))  # a pause

    async def keystroke(self, session: aiohttp.ClientSession, prefix: str) -> None:
        self.sent += 1
        body = {"prompt": prefix, "suffix": self.text[self.position : self.position + 200], "max_tokens": 16,
                "stream": True}  # fmt: skip
        leave = self.rng.random() < ABANDON_SHARE
        try:
            async with asyncio.timeout(self.rng.uniform(0.0, 0.3) if leave else 30.0):
                async with session.post(self.url + "/v1/completions", json=body, headers=self.headers) as resp:
                    await resp.read()
                    self.answered[resp.headers["X-Request-Id"]] = resp.status
        except TimeoutError:
            self.abandoned += 1
        except aiohttp.ClientError:
            self.answered[f"lost-{self.sent}"] = 0  # no answer at all: counted as a status 0


async def measure(minutes: float, typists: int, seed: int, progress: Callable[[str], None]) -> Day:
    folder = Path(tempfile.mkdtemp(prefix="mellum-day-"))
    log = folder / "requests.jsonl"
    port = free_port()
    server = EmbeddedServer(ctx_tokens=4096, slots=2, port=port, sleep_idle_s=2)
    await asyncio.to_thread(server.start)
    upstream = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    started = loop.time()
    proxies: dict[str, tuple[asyncio.subprocess.Process, str]] = {}
    stderr_files = []
    for name in ("service", "make-run"):
        listen = free_port()
        args = ["-m", "mellum_proxy", "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{listen}", "--log",
                str(log), "--log-max-mb", "8", "--log-keep", "1000", "--health-interval-ms", "500"]  # fmt: skip
        stderr = (folder / f"{name}.stderr").open("wb")
        stderr_files.append(stderr)
        process = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=stderr)  # fmt: skip
        proxies[name] = (process, f"http://127.0.0.1:{listen}")
    samples: list[dict[str, Any]] = []
    editors: list[Typist] = []
    breaks = restarts = wakes = 0
    after_restart: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as probe:
            for process, url in proxies.values():
                await wait_healthy(probe, url, exited=process)
            until = loop.time() + minutes * 60
            texts = code_texts()
            urls = [url for _, url in proxies.values()]
            editors = [Typist(i, urls[i % 2], texts[i % len(texts)], seed, loop.time) for i in range(typists)]
            allowed = asyncio.Event()
            allowed.set()
            typing = [asyncio.create_task(editor.run(until, allowed)) for editor in editors]

            async def sample() -> None:
                held: dict[str, dict[str, Any]] = {}
                minute: dict[str, Any] = {"minute": (loop.time() - started) / 60, "proxies": held}
                for name, (process, url) in proxies.items():
                    async with probe.get(url + "/status") as resp:
                        status = await resp.json()
                    held[name] = process_state(process.pid) | {
                        "tasks": status["tasks"], "sessions": len(status["sessions"]),
                        "documents": status.get("documents", 0),
                        "wakes": sum(u.get("wakes", 0) for u in status["upstreams"]),
                    }  # fmt: skip
                samples.append(minute)
                shown = ", ".join(f"{n} {s['rss_mib']:.1f} MiB" for n, s in held.items())
                progress(f"day: minute {minute['minute']:.0f}: {shown}")

            await sample()
            next_sample, next_break = loop.time() + SAMPLE_EVERY_S, loop.time() + BREAK_EVERY_S
            restart_at = loop.time() + minutes * 30
            while loop.time() < until:
                await asyncio.sleep(0.5)
                if loop.time() >= next_break:
                    allowed.clear()
                    breaks += 1
                    resume = loop.time() + BREAK_S
                    if restart_at and loop.time() >= restart_at:  # in a break: its first completion is alone
                        restart_at, restarts = 0, restarts + 1
                        await asyncio.sleep(2.0)  # the last requests end
                        await asyncio.to_thread(server.stop)
                        server = EmbeddedServer(ctx_tokens=4096, slots=2, port=port, sleep_idle_s=2)
                        await asyncio.to_thread(server.start)
                        first = {"prompt": "def fibonacci(n):\n    ", "max_tokens": 4}
                        async with probe.post(urls[0] + "/v1/completions", json=first,
                                              headers={"X-Session-Id": "after-restart"}) as r:  # fmt: skip
                            text = bool((await r.json())["choices"][0]["text"])
                            after_restart = {"status": r.status, "text": text, "id": r.headers["X-Request-Id"]}
                        progress(f"day: upstream restarted; the next completion: {after_restart}")
                    await asyncio.sleep(max(0.0, resume - loop.time()))
                    allowed.set()
                    next_break = loop.time() + BREAK_EVERY_S
                if loop.time() >= next_sample:
                    await sample()
                    next_sample += SAMPLE_EVERY_S
            await asyncio.gather(*typing)
            await sample()
            wakes = sum(s["wakes"] for s in samples[-1]["proxies"].values())
    finally:
        for process, _ in proxies.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in proxies.values():
            await process.wait()
        for stderr in stderr_files:
            stderr.close()
        await asyncio.to_thread(server.stop)
    stderr_text = "".join((folder / f"{name}.stderr").read_text(errors="replace") for name in proxies)
    lines = read_log(log)[0] if log_files(log) else []
    shutil.rmtree(folder)
    answered = {rid: status for editor in editors for rid, status in editor.answered.items()}
    if "id" in after_restart:  # what its record says
        record = next((line for line in lines if line["id"] == after_restart["id"]), {})
        after_restart |= {key: record.get(key) for key in ("outcome", "ttft_ms", "total_ms", "error")}
    logged = {line["id"] for line in lines}
    at_ten = next((s for s in samples if s["minute"] >= 10), samples[0])
    growth = {name: {key: samples[-1]["proxies"][name][key] - at_ten["proxies"][name][key]
                     for key in ("rss_mib", "fds", "tasks")} for name in proxies}  # fmt: skip
    return {
        "minutes": minutes, "typists": typists, "seed": seed, "elapsed_s": round(loop.time() - started, 1),
        "samples": samples, "growth_after_10_min": growth, "answered": len(answered), "logged": len(lines),
        "answered_not_logged": len([rid for rid, status in answered.items() if status and rid not in logged]),
        "statuses": {str(k): v for k, v in sorted(Counter(answered.values()).items())},
        "outcomes": dict(Counter(str(line.get("outcome")) for line in lines)), "wakes": wakes, "breaks": breaks,
        "restarts": restarts, "after_restart": after_restart,
        "abandoned": sum(editor.abandoned for editor in editors), "sessions_opened": sum(e.pools for e in editors),
        "exit_codes": [process.returncode for process, _ in proxies.values()],
        "stderr_tracebacks": stderr_text.count("Traceback"),
    }  # fmt: skip
