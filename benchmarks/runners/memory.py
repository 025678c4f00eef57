"""`python -m benchmarks memory`: the proxy's resident memory, idle and over many requests.

`mellum-proxy serve` runs as its own process (as a user runs it) in front of this process's fast fake
upstream, with its policies off; `clients` concurrent clients (one editor session each) send
`requests` streaming completions. VmRSS is read from `/proc/PID/status` once the proxy answers
`/health` and is idle, then after every fifth of the requests. A second run, with `--tokenizer` a
GGUF file, shows what an exact local vocabulary holds in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.doubles.fake_upstream import FakeUpstream
from benchmarks.reporting.memory_report import Memory, render
from benchmarks.runners.processes import rss_mib, wait_healthy
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.http import serve_app
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.urls import free_port


def add_commands(commands: Any) -> None:
    about = "the proxy's resident memory, idle and over many requests"
    memory = command(commands, "memory", about, _memory, out="memory")
    memory.add_argument("--requests", type=POSITIVE, default=100_000, help="streaming requests [default: 100000]")
    memory.add_argument("--clients", type=POSITIVE, default=8, help="concurrent clients [default: 8]")
    memory.add_argument("--gguf", type=Path, help="also run with this GGUF's vocabulary as the tokenizer")


def _memory(args: argparse.Namespace) -> None:
    if args.gguf is not None and not args.gguf.is_file():
        fail(f"--gguf {args.gguf}: no such file")
    result = asyncio.run(measure(args.requests, args.clients, args.gguf, progress=print))
    write_report(args.out, "memory", result, render)


JSON = {"Content-Type": "application/json"}


async def one_run(
    upstream: str, tokenizer: str, requests: int, clients: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    port = free_port()
    args = [
        "-m",
        "mellum_proxy",
        "serve",
        "--upstream",
        upstream,
        "--listen",
        f"127.0.0.1:{port}",
        "--tokenizer",
        tokenizer,
        "--debounce-ms",
        "0",
        "--timeout-ms",
        "0",
        "--max-concurrency",
        "64",
        "--max-queue",
        "64",
        "--log",
        "off",
    ]  # fmt: skip  (never the user's own log)
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    samples: list[dict[str, float]] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_healthy(session, url, exited=process)
            await asyncio.sleep(2.0)  # background probes (and a local tokenizer's load) settle
            samples.append({"requests": 0, "rss_mib": rss_mib(process.pid)})
            progress(f"{tokenizer}: idle {samples[-1]['rss_mib']:.1f} MiB")
            body = b'{"prompt": "def fibonacci(n):\\n    ", "max_tokens": 16, "stream": true}'
            step = max(1, requests // 5)
            sent = 0

            async def client(number: int, count: int) -> None:
                headers = {**JSON, "X-Session-Id": f"editor-{number}"}
                for _ in range(count):
                    async with session.post(url + "/v1/completions", data=body, headers=headers) as resp:
                        await resp.read()

            while sent < requests:
                batch = min(step, requests - sent)
                await asyncio.gather(*(client(i, batch // clients + (i < batch % clients)) for i in range(clients)))
                sent += batch
                samples.append({"requests": sent, "rss_mib": rss_mib(process.pid)})
                progress(f"{tokenizer}: {sent} requests {samples[-1]['rss_mib']:.1f} MiB")
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()
    after = [s["rss_mib"] for s in samples[1:]]
    return {"tokenizer": Path(tokenizer).name, "samples": samples, "idle_mib": samples[0]["rss_mib"],
            "growth_after_first_fifth_mib": (after[-1] - after[0]) if after else 0.0}  # fmt: skip


async def measure(requests: int, clients: int, gguf: Path | None, progress: Callable[[str], None]) -> Memory:
    fake = FakeUpstream(tokens=16, slots=64)
    runs = []
    async with serve_app(fake.app()) as upstream:
        runs.append(await one_run(upstream, "chars", requests, clients, progress))
        if gguf is not None:
            runs.append(await one_run(upstream, str(gguf), max(1, requests // 10), clients, progress))
    return Memory(requests=requests, clients=clients, runs=runs)
