"""`python -m benchmarks overhead`: what the proxy adds to each request, against a bare relay.

The paths to one fast fake upstream, request by request in turn (in a shuffled order each time, seeded) so that
machine noise hits all alike: `direct` (client -> upstream), `bare` (client ->
`benchmarks.doubles.relays.bare_relay` -> upstream), `parsing` (client -> `benchmarks.doubles.floor_relay`, written
without anything of the package: it parses the request and each event's JSON at each network read and nothing else
-> upstream; the independent floor), `nginx` (Debian's nginx as a reverse proxy, buffering off, in a process of its
own; where it is installed) and `proxy` (client -> mellum-proxy with its policies off: debounce 0, no deadline, no
reuse, no post-processing, the `chars` tokenizer -> upstream); and two more such proxies, so that what each costs a
request shows against `proxy`: `cleaning`, with post-processing on (the default), and `page`, with its live page
open (a reader of `/ui/events` in a process of its own, as a browser would be). Each round sends `requests`
sequential streaming fill-in-the-middle completions (a prompt and a suffix, as the plugins send them) per path.
Added latency is a path's percentile less direct's in the same round; CPU per request is the process's CPU time
spent on the path's requests less direct's (client and fake upstream cost the same in both), so what remains is the
relay's own. All of that runs in this one process, where a relay's wake-ups share the loop's turns with the client's
and the upstream's. As deployed each is a process of its own, and every hop costs a process wake-up:
`parsing_process` and `proxy_process` are the floor and the proxy (as `proxy`) each in a process of its own, their
CPU that process's (from /proc) added to this one's. The ratios compare like with like; the absolute numbers are the
machine's."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.doubles import nginx as nginx_relay
from benchmarks.doubles.fake_upstream import FakeUpstream
from benchmarks.doubles.floor_relay import floor_relay
from benchmarks.doubles.relays import bare_relay
from benchmarks.reporting.overhead_report import Overhead, render
from benchmarks.runners.processes import listening, wait_healthy
from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, command, fail, real
from mellum_proxy.http import RECORDS, build_app, serve_app
from mellum_proxy.http.page import PAGES
from mellum_proxy.proc import cpu_seconds
from mellum_proxy.telemetry.stats import percentile
from mellum_proxy.tuning.reporting.writing import measured
from mellum_proxy.urls import free_port


def add_commands(commands: Any) -> None:
    about = "what the proxy adds per request: direct, a bare relay, the proxy"
    run = measured("overhead", lambda args: measure(args.requests, args.rounds, args.tokens, print,
                                                    token_gap_ms=args.token_gap_ms), render)  # fmt: skip
    overhead = command(commands, "overhead", about, run, out="overhead")
    overhead.add_argument("--requests", type=POSITIVE, default=500, help="per path and round [default: 500]")
    overhead.add_argument("--rounds", type=POSITIVE, default=3, help="interleaved rounds [default: 3]")
    overhead.add_argument("--tokens", type=POSITIVE, default=16, help="streamed tokens per request [default: 16]")
    overhead.add_argument("--token-gap-ms", type=real(0.0, 1000.0), default=0.0,
                          help="between the fake's tokens, so each comes in a read of its own, as a decoding server's "
                               "do [default: 0: all at once]")  # fmt: skip


PATHS = (
    "direct",
    "bare",
    "parsing",
    "nginx",
    "proxy",
    "cleaning",
    "page",
    "parsing_process",
    "proxy_process",
)  # nginx where installed
RELAYS = PATHS[1:]
PROXY_SETTINGS: dict[str, Any] = {  # no hold, no deadline, no reuse (every request goes upstream), no cleaning
    "debounce_ms": 0, "timeout_ms": 0, "tokenizer": "chars", "max_concurrency": 64, "max_queue": 64, "reuse": False,
    "postprocess": False,
}  # fmt: skip


@dataclass
class PathRound:
    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float]:
    started = time.perf_counter()
    first = None
    async with session.post(url + "/v1/completions", json=body) as resp:
        async for line in resp.content:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter()
    end = time.perf_counter()
    return ((first or end) - started) * 1000, (end - started) * 1000


async def _round(
    session: aiohttp.ClientSession, urls: dict[str, str], requests: int, body: dict[str, Any],
    pids: dict[str, int] | None = None,
) -> dict[str, PathRound]:  # fmt: skip
    """`requests` completions per path, one path after the other in turn, in a new order each turn: a path
    that always followed the same one would find its code warm or cold in the caches by where it stands.
    `pids`: the paths whose relay is a process of its own; its CPU over the round is added to theirs."""
    measured = {name: PathRound() for name in urls}
    own = {name: cpu_seconds(pid) for name, pid in (pids or {}).items()}
    names = list(urls)
    order = random.Random(requests)  # seeded: two runs take the same turns
    for _ in range(requests):
        order.shuffle(names)
        for name in names:
            result = measured[name]
            cpu = time.process_time()
            ttft, total = await _one(session, urls[name], body)
            result.cpu_s += time.process_time() - cpu
            result.ttft_ms.append(ttft)
            result.total_ms.append(total)
    for name, before in own.items():
        after = cpu_seconds((pids or {})[name])
        if before is not None and after is not None:
            measured[name].cpu_s += after - before
    return measured


async def measure(
    requests: int = 500,
    rounds: int = 3,
    tokens: int = 16,
    progress: Callable[[str], None] | None = None,
    nginx: bool = True,
    token_gap_ms: float = 0.0,
) -> Overhead:
    """Run the interleaved rounds; returns per-round figures and the ratios (`nginx`: with nginx where installed;
    `token_gap_ms`: the fake's pause between tokens)."""
    fake = FakeUpstream(tokens=tokens, slots=64, token_delay_s=token_gap_ms / 1000)
    body = {
        "prompt": "def fibonacci(n):\n    ",
        "suffix": "\n\n\nprint(fibonacci(10))\n",
        "max_tokens": tokens,
        "stream": True,
    }
    folder = Path(tempfile.mkdtemp(prefix="mellum-overhead-"))  # each proxy logs, as by default, but not to the
    # user's own log: stats, doctor and tune would describe this fake server

    def proxy_settings(name: str, **more: Any) -> Settings:
        return Settings(upstream=upstream, log=folder / f"{name}.jsonl", **{**PROXY_SETTINGS, **more})

    try:
        async with serve_app(fake.app()) as upstream, serve_app(bare_relay(upstream)) as bare:
            async with (
                serve_app(floor_relay(upstream)) as parsing,
                _nginx(upstream, nginx) as nginx_url,
                serve_app(build_app(proxy_settings("proxy"))) as proxy,
                serve_app(build_app(proxy_settings("cleaning", postprocess=True))) as cleaning,
                serve_app(page_app := build_app(proxy_settings("page"))) as page,
                _page_open(page_app, page),
                _own_processes(upstream, folder) as own,
            ):
                urls = {"direct": upstream, "bare": bare, "parsing": parsing, "nginx": nginx_url, "proxy": proxy,
                        "cleaning": cleaning, "page": page}  # fmt: skip
                urls = {name: url for name, url in urls.items() if url} | {name: url for name, (url, _) in own.items()}
                pids = {name: pid for name, (_, pid) in own.items()}
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                    await wait_healthy(session, own["proxy_process"][0])
                    await _round(session, urls, 20, body)  # warm up connections and code paths
                    rows = []
                    for number in range(rounds):
                        rows.append(_row(number, await _round(session, urls, requests, body, pids), requests))
                        if progress is not None:
                            progress(_line(rows[-1]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Overhead(
        requests=requests,
        rounds=rounds,
        tokens=tokens,
        rows=rows,
        summary=_summary(rows),
        paths=list(urls),
        token_gap_ms=token_gap_ms,
    )


FLOOR_RELAY = Path(__file__).resolve().parents[1] / "doubles" / "floor_relay.py"  # imports nothing of the project


@contextlib.asynccontextmanager
async def _own_processes(upstream: str, folder: Path) -> AsyncIterator[dict[str, tuple[str, int]]]:
    """The floor and the proxy (as the `proxy` path, settings by flag, no config file) each in a process of its
    own, as deployed: `{path: (url, pid)}`."""
    floor_port, proxy_port = free_port(), free_port()
    config = folder / "empty.toml"
    config.write_text("")  # not the user's own config file
    flags = [f"--{key.replace('_', '-')}" if value is True else f"--no-{key.replace('_', '-')}" if value is False
             else f"--{key.replace('_', '-')}={value}" for key, value in PROXY_SETTINGS.items()]  # fmt: skip
    log = folder / "proxy_process.jsonl"
    proxy_argv = [sys.executable, "-m", "mellum_proxy", "serve", "--config", str(config), "--upstream", upstream,
                  "--listen", f"127.0.0.1:{proxy_port}", "--log", str(log), *flags]  # fmt: skip
    floor_argv = [sys.executable, str(FLOOR_RELAY), str(floor_port), upstream]  # from any folder: a script
    async with contextlib.AsyncExitStack() as stack:
        try:
            floor_pid = await stack.enter_async_context(listening(floor_argv, floor_port))
            proxy_pid = await stack.enter_async_context(listening(proxy_argv, proxy_port))
        except (RuntimeError, TimeoutError) as exc:  # a relay that would not start: said in one line
            fail(f"bench overhead: a relay in a process of its own did not start: {exc}")
        yield {"parsing_process": (f"http://127.0.0.1:{floor_port}", floor_pid),
               "proxy_process": (f"http://127.0.0.1:{proxy_port}", proxy_pid)}  # fmt: skip


@contextlib.asynccontextmanager
async def _nginx(upstream: str, wanted: bool) -> AsyncIterator[str]:
    """nginx's URL in front of `upstream`, or "" where it is not installed (or not wanted)."""
    if not wanted or nginx_relay.installed() is None:
        yield ""
        return
    async with nginx_relay.nginx_relay(upstream) as url:
        yield url


# A browser's part of an open page, in a process of its own: it reads the event stream and drops it.
_READER = "import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1])\nwhile r.read(65536): pass"


@contextlib.asynccontextmanager
async def _page_open(app: web.Application, url: str) -> AsyncIterator[None]:
    """The proxy `app` (at `url`) with its live page open for the body of the `async with`."""
    reader = await asyncio.create_subprocess_exec(sys.executable, "-c", _READER, url + "/ui/events")
    try:
        await app[RECORDS].changes.wait_for(lambda: app[PAGES]["open"] == 1, timeout_s=30)
        yield
        assert app[PAGES]["open"] == 1, "the page's reader left during the run"
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have gone first (its connection closed)
            reader.kill()
        await reader.wait()


def _added(path: PathRound, direct: PathRound, values: str, q: float) -> float:
    return (percentile(getattr(path, values), q) or 0.0) - (percentile(getattr(direct, values), q) or 0.0)


def _row(number: int, measured: dict[str, PathRound], requests: int) -> dict[str, Any]:
    direct = measured["direct"]
    row: dict[str, Any] = {"round": number + 1}
    for name in RELAYS:
        if name not in measured:
            continue
        path = measured[name]
        row[name] = {
            "added_ttft_p50_ms": _added(path, direct, "ttft_ms", 50),
            "added_total_p50_ms": _added(path, direct, "total_ms", 50),
            "added_ttft_p95_ms": _added(path, direct, "ttft_ms", 95),
            "cpu_ms_per_request": (path.cpu_s - direct.cpu_s) * 1000 / requests,
        }
    row["direct"] = {"ttft_p50_ms": percentile(direct.ttft_ms, 50), "total_p50_ms": percentile(direct.total_ms, 50)}
    return row


def _ratio(rows: list[dict[str, Any]], key: str, over: str = "bare", path: str = "proxy") -> float | None:
    ratios = [row[path][key] / row[over][key] for row in rows if over in row and row[over][key] > 0]
    return median(ratios) if ratios else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("added_ttft_p50_ms", "added_total_p50_ms", "cpu_ms_per_request")
    summary = {f"proxy_over_bare_{key}": _ratio(rows, key) for key in keys}
    summary |= {f"parsing_over_bare_{key}": _ratio(rows, key, path="parsing") for key in keys}
    summary |= {f"proxy_over_parsing_{key}": _ratio(rows, key, over="parsing") for key in keys}
    summary |= {f"proxy_over_nginx_{key}": _ratio(rows, key, over="nginx") for key in keys}
    summary |= {f"cleaning_over_proxy_{key}": _ratio(rows, key, over="proxy", path="cleaning") for key in keys}
    summary |= {f"page_over_proxy_{key}": _ratio(rows, key, over="proxy", path="page") for key in keys}
    summary |= {f"proxy_process_over_parsing_process_{key}": _ratio(rows, key, over="parsing_process",
                                                                    path="proxy_process") for key in keys}  # fmt: skip
    summary |= {
        f"proxy_process_over_nginx_{key}": _ratio(rows, key, over="nginx", path="proxy_process")
        if key != "cpu_ms_per_request"
        else None
        for key in keys
    }  # nginx's own CPU is not read: no ratio
    return summary


def _line(row: dict[str, Any]) -> str:
    cells = ", ".join(
        f"{name} {row[name]['added_ttft_p50_ms']:.2f} ms TTFT / {row[name]['cpu_ms_per_request']:.2f} ms CPU"
        for name in RELAYS
        if name in row
    )
    return f"round {row['round']}: added {cells}"
