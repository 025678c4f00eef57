"""`python -m benchmarks soak`: many mixed requests with faults injected; does anything leak or go unlogged?

`mellum-proxy serve` runs as its own process, with a request log, in front of three upstreams in failover
order: a captive portal (HTML for everything), a server that accepts and never answers, and this process's
`FaultUpstream`, which serves. `clients` concurrent editors (one session each) send `requests` completions:
every dialect, streamed or not; most answered normally, the rest meeting an upstream fault (named in the
prompt), a malformed body, a client that goes away at a random moment (queued, waiting, mid-answer) or reads
slowly, or coming from a web page (a foreign `Origin`, a `text/plain` body). The proxy's VmRSS, open file
descriptors, threads and asyncio tasks are read once it is warm and after every tenth of the requests. At the
end the proxy is stopped with SIGTERM and its log read back: every request that got an answer must have its
line (by `X-Request-Id`), no answer may be a 500, and the proxy's stderr (kept in a file) must hold no
traceback and stay under `STDERR_LINES` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.doubles.fault_upstream import FaultUpstream, SilentServer, captive_portal
from benchmarks.reporting.soak_report import Soak, render
from benchmarks.runners.processes import process_state, wait_healthy
from mellum_proxy.console import INDEX, POSITIVE, command, fail, real
from mellum_proxy.http import serve_app
from mellum_proxy.telemetry.stats import read_log
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.urls import free_port


def add_commands(commands: Any) -> None:
    soak = command(commands, "soak", "many mixed requests with upstream faults: RSS, fds, tasks, log completeness",
                   _soak, out="soak")  # fmt: skip
    soak.add_argument("--requests", type=POSITIVE, default=100_000, help="requests in all [default: 100000]")
    soak.add_argument("--clients", type=POSITIVE, default=8, help="concurrent editors [default: 8]")
    soak.add_argument("--seed", type=INDEX, default=0, help="of the request mix [default: 0]")
    soak.add_argument("--gone", type=real(0.0, 0.9), default=GONE_SHARE,
                      help=f"share of clients that leave at a random moment [default: {GONE_SHARE}]")  # fmt: skip


def _soak(args: argparse.Namespace) -> None:
    result = asyncio.run(measure(args.requests, args.clients, args.seed, progress=print, gone=args.gone))
    write_report(args.out, "soak", result, render)
    if result["answered_not_logged"] or "500" in result["statuses"]:
        fail("soak: an answer was a 500 or went unlogged (see the report)")
    if result["stderr_tracebacks"] or result["stderr_lines"] >= STDERR_LINES:
        fail(f"soak: the proxy's stderr had {result['stderr_tracebacks']} tracebacks in {result['stderr_lines']} lines")


# fault -> share of requests (the rest of the mix: malformed bodies and clients that go away)
FAULT_MIX = {
    "ok": 0.80, "status_500": 0.03, "drop_after_first": 0.03, "error_event_after_first": 0.03,
    "garbage_after_first": 0.02, "usage_not_numbers": 0.02, "html_answer": 0.02, "json_answer": 0.02,
    "multiline_data": 0.02, "drop_before_headers": 0.005, "stall_after_first": 0.003, "huge_event": 0.002,
    "empty_stream": 0.005, "done_only": 0.005, "stall_after_headers": 0.002,
}  # fmt: skip
STDERR_LINES = 100  # what a background service may write in a soak: its start, its upstreams' changes
MALFORMED_SHARE = 0.05
GONE_SHARE = 0.03
GONE_WITHIN_S = 0.03  # a leaving client leaves this long after sending, at the most (answers take milliseconds)
PAGE_SHARE = 0.03  # a web page's request: a foreign Origin, or a text/plain body (403 / 415)
SLOW_SHARE = 0.03  # a client that reads its answer 64 bytes at a time
BODIES = {
    "/v1/completions": lambda text: {"prompt": text, "suffix": ")"},
    "/infill": lambda text: {"input_prefix": text, "input_suffix": ")"},
    "/completion": lambda text: {"prompt": text},
    "/api/generate": lambda text: {"prompt": text, "suffix": ")", "model": "m"},
}
MALFORMED = [b"{not json", b'{"prompt": 3}', b"[]", b'{"input_prefix": [1]}', b'{"prompt": "x", "stream": "yes"}']


class Client:
    """One editor: a session of its own, sending requests one after another."""

    def __init__(
        self, number: int, session: aiohttp.ClientSession, url: str, seed: int, gone: float = GONE_SHARE
    ) -> None:
        self.number, self.session, self.url, self.gone_share = number, session, url, gone
        self.rng = random.Random(seed * 1000 + number)
        self.answered: dict[str, int] = {}  # request id -> status
        self.gone = 0
        self.kinds: Counter[str] = Counter()

    def _fault(self) -> str:
        return self.rng.choices(list(FAULT_MIX), weights=list(FAULT_MIX.values()))[0]

    async def one(self) -> None:
        path = self.rng.choice(list(BODIES))
        stream = self.rng.random() < 0.5
        roll = self.rng.random()
        headers = {"Content-Type": "application/json", "X-Session-Id": f"editor-{self.number}"}
        if roll < MALFORMED_SHARE:
            kind, data = "malformed", self.rng.choice(MALFORMED)
        else:
            kind = self._kind(roll - MALFORMED_SHARE)
            fault = kind if kind in FAULT_MIX else "ok"
            body = BODIES[path](f"def f{self.rng.randrange(10**6)}(  # [fault:{fault}]") | {"stream": stream}
            data = orjson.dumps(body)
            if kind == "page":
                page = self.rng.choice([{"Origin": "https://attacker.example"}, {"Content-Type": "text/plain"}])
                headers |= page
        self.kinds[kind] += 1
        if kind == "gone":  # the editor goes away at a random moment: queued, waiting, or mid-answer
            try:
                async with asyncio.timeout(self.rng.uniform(0.0, GONE_WITHIN_S)):
                    await self._send(path, data, headers, kind)
            except TimeoutError:
                self.gone += 1
            return
        await self._send(path, data, headers, kind)

    async def _send(self, path: str, data: bytes, headers: dict[str, str], kind: str) -> None:
        async with self.session.post(self.url + path, data=data, headers=headers) as resp:
            if kind == "slow":
                async for _ in resp.content.iter_chunked(64):
                    await asyncio.sleep(0.005)  # the pace of a slow reader
            else:
                await resp.read()
            self.answered[resp.headers["X-Request-Id"]] = resp.status

    def _kind(self, roll: float) -> str:
        for kind, share in (("gone", self.gone_share), ("page", PAGE_SHARE), ("slow", SLOW_SHARE)):
            if roll < share:
                return kind
            roll -= share
        return self._fault()

    async def run(self, count: int) -> None:
        for _ in range(count):
            await self.one()


async def measure(
    requests: int, clients: int, seed: int, progress: Callable[[str], None], gone: float = GONE_SHARE
) -> Soak:
    fake = FaultUpstream(tokens=4)
    folder = Path(tempfile.mkdtemp(prefix="mellum-soak-"))
    log = folder / "requests.jsonl"
    async with serve_app(fake.app()) as upstream, serve_app(captive_portal()) as portal, SilentServer() as silent:
        port = free_port()
        args = ["-m", "mellum_proxy", "serve", "--upstream", portal, "--upstream", silent, "--upstream", upstream,
                "--listen", f"127.0.0.1:{port}", "--tokenizer", "chars", "--timeout-ms", "500", "--max-concurrency",
                "64", "--max-queue", "64", "--log", str(log), "--log-max-mb", "4096", "--health-interval-ms", "200",
                "--upstream-answer-timeout-ms", "300"]  # fmt: skip
        with (folder / "stderr.txt").open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=asyncio.subprocess.DEVNULL, stderr=stderr
            )
        url = f"http://127.0.0.1:{port}"
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        editors: list[Client] = []
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await wait_healthy(session, url, exited=process)

                async def sample(sent: int) -> None:
                    for _ in range(500):  # idle first: what is left then is what leaked
                        async with session.get(url + "/status") as resp:
                            status = await resp.json()
                        if status["inflight"] == 0 and status["queued"] == 0:
                            break
                        await asyncio.sleep(0.01)
                    state = process_state(process.pid) | {"requests": sent, "tasks": status["tasks"]}
                    samples.append(state)
                    progress(f"soak: {sent} requests, RSS {state['rss_mib']:.1f} MiB, {state['fds']} fds, "
                             f"{state['tasks']} tasks, {state['threads']} threads")  # fmt: skip

                editors = [Client(i, session, url, seed, gone) for i in range(clients)]
                warm = max(clients, requests // 100)
                await asyncio.gather(*(editor.run(warm // clients) for editor in editors))
                sent = warm // clients * clients
                await sample(sent)
                step = max(clients, (requests - sent) // 10)
                while sent < requests:
                    batch = min(step, requests - sent)
                    share = [batch // clients + (i < batch % clients) for i in range(clients)]
                    await asyncio.gather(*(editor.run(n) for editor, n in zip(editors, share, strict=True)))
                    sent += batch
                    await sample(sent)
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()
    elapsed = time.monotonic() - started
    stderr_text = (folder / "stderr.txt").read_text(errors="replace")
    lines = _read_and_remove(folder, log)
    answered = {rid: status for editor in editors for rid, status in editor.answered.items()}
    logged = {line["id"] for line in lines}
    first, last = samples[0], samples[-1]
    return {
        "requests": requests, "clients": clients, "seed": seed, "elapsed_s": round(elapsed, 1),
        "exit_code": process.returncode, "samples": samples,
        "kinds": dict(sum((editor.kinds for editor in editors), Counter())),
        "statuses": {str(k): v for k, v in sorted(Counter(answered.values()).items())},
        "gone": sum(editor.gone for editor in editors),
        "answered": len(answered), "logged": len(lines), "answered_not_logged": len(set(answered) - logged),
        "outcomes": dict(Counter(str(line.get("outcome")) for line in lines)),
        "growth": {key: last[key] - first[key] for key in ("rss_mib", "fds", "tasks", "threads")},
        "growth_after_first_tenth": {key: last[key] - samples[1][key] for key in ("rss_mib", "fds", "tasks")},
        "stderr_lines": len(stderr_text.splitlines()), "stderr_tracebacks": stderr_text.count("Traceback"),
        "stderr_levels": dict(Counter(word for line in stderr_text.splitlines()
                                      for word in line.split()[2:3] if word.isupper())),
    }  # fmt: skip


def _read_and_remove(folder: Path, log: Path) -> list[dict[str, Any]]:
    lines = read_log(log)[0]  # the request lines (each suggestion's `acceptance` line is apart)
    shutil.rmtree(folder)
    return lines
