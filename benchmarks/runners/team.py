"""A team on one machine: several developers' proxies in front of a router and its workers.

`run_developers` replays one trace per developer at once, each through a proxy of its own (its own
`developer_id`, the routing key); `bench replay --developers N` uses it against any upstream.

`benchmarks team` (`run_team`) builds the whole setup from real parts: two embedded llama.cpp servers as
workers, each behind a `Tap` (a relay that counts which developer's requests reached that worker, and
whose stop is the worker dying), `vllm-router` in front of them, a local embedded server as every
developer's fallback (`--upstream ROUTER --upstream LOCAL`), and the proxies. Its phases:
consistent hashing, round robin, a worker killed mid-run, the router killed and started again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.reporting.team_report import failover_times, failures, team_report
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.tuning.reporting.replay_report import developers_markdown
from mellum_proxy.tuning.reporting.results import Phase
from mellum_proxy.tuning.reporting.writing import command_line
from mellum_proxy.tuning.runners.playback import schedule
from mellum_proxy.tuning.runners.policy import Policy, parse_policy
from mellum_proxy.tuning.runners.replay import run_developers
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.corpus import CODE_DIR, shipped_traces
from mellum_proxy.tuning.workloads.synth import synthesize_file
from mellum_proxy.tuning.workloads.trace import Event, TraceError, limited
from mellum_proxy.urls import free_port

log = logging.getLogger("benchmarks")


def add_commands(commands: Any) -> None:
    about = "2 embedded workers behind vllm-router, 3 developers' proxies, failover"
    team = command(commands, "team", about, _team, out="team")
    team.add_argument("traces", nargs="*", type=Path, help="one per developer [default: the shipped traces, then "
                      "synthetic typing of mellum_proxy/tuning/code]")  # fmt: skip
    team.add_argument("--router-bin", default="vllm-router", help="the vllm-router executable [default: on PATH]")
    team.add_argument("--developers", type=POSITIVE, default=3, help="[default: 3]")
    team.add_argument("--limit-events", type=POSITIVE, default=250, help="edits per developer [default: 250]")
    team.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    team.add_argument("--health-interval-ms", type=POSITIVE, default=500, help="the proxies' [default: 500]")


def _team(args: argparse.Namespace) -> None:
    router = shutil.which(args.router_bin) or args.router_bin
    if not Path(router).is_file():
        fail(f"vllm-router not found at {args.router_bin}: pip install vllm-router, or pass --router-bin PATH")
    paths = args.traces or shipped_traces()
    try:
        developers = [list(limited(load_trace(path), args.limit_events)) for path in paths][: args.developers]
        sources = sorted(CODE_DIR.glob("inventory.*"))
        for seed, source in enumerate(sources[: max(0, args.developers - len(developers))]):
            developers.append(list(limited(synthesize_file(source, seed=seed), args.limit_events)))
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    if len(developers) < args.developers:
        fail(f"{args.developers} developers need as many traces; found {len(developers)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm-router.log").write_bytes(b"")
    phases = asyncio.run(run_team(router, developers, parse_policy("proxy"), args.out, args.max_tokens,
                                  args.health_interval_ms))  # fmt: skip
    names = [str(p) for p in paths][: args.developers] + [f"synthetic typing of {s}" for s in sources][
        : max(0, args.developers - len(paths))
    ]
    notes = [
        "workers: 2 embedded llama.cpp servers (gemma-3-270m Q4_K_M, 2 slots, 1 thread, swa_full for prefix reuse), "
        "each behind a counting relay; router: vllm-router, health checked every 1 s; fallback: one more embedded "
        "server, shared by the developers (on their own machines each has one)",
        f"developers: {', '.join(names)} ({args.limit_events} edits each), proxies with default settings, "
        f"--upstream ROUTER --upstream LOCAL, health every {args.health_interval_ms} ms",
        "failed = completions the proxy answered with upstream_error; cached share = cached / prompt tokens over the "
        "requests that ran to their end (a cancelled stream carries no usage)",
    ]
    for path in team_report(phases, command_line(), notes, args.out):
        print(f"wrote {path}")


ROUTING_HEADER = "x-session-id"  # what the proxies send and vllm-router's consistent hashing reads
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Tap:
    """An HTTP relay in front of one worker: what it forwards, per routing key; `stop()` kills the worker
    for everyone in front of it (new connections are refused, open ones are cut)."""

    def __init__(self, name: str, target: str) -> None:
        self.name = name
        self.target = target
        self.by_key: dict[str, int] = {}
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self, port: int = 0) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self._runner = self._session = None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.method == "POST" and "completions" in request.path:
            key = request.headers.get(ROUTING_HEADER, "-")
            self.by_key[key] = self.by_key.get(key, 0) + 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                          data=await request.read()) as upstream:  # fmt: skip
            out = web.StreamResponse(status=upstream.status)
            out.content_type = upstream.content_type
            with contextlib.suppress(ConnectionResetError):  # the client (the router) went away
                await out.prepare(request)
                async for data in upstream.content.iter_any():
                    await out.write(data)
                await out.write_eof()
            return out


class Router:
    """`vllm-router` in a process of its own, on a fixed port so that it can be started again."""

    def __init__(self, binary: str, workers: Sequence[str], policy: str, log_path: Path) -> None:
        self.binary, self.workers, self.policy, self.log_path = binary, list(workers), policy, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, timeout_s: float = 60.0) -> float:
        """Start it and wait until it answers `/health`; the unix time it did."""
        command = [self.binary, "--host", "127.0.0.1", "--port", str(self.port), "--policy", self.policy,
                   "--worker-urls", *self.workers, "--health-check-interval-secs", "1",
                   "--health-failure-threshold", "1", "--prometheus-port", str(free_port())]  # fmt: skip
        with self.log_path.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                *command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"vllm-router exited ({self.process.returncode}); see {self.log_path}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                        if resp.status == 200:
                            return time.time()
                await asyncio.sleep(0.1)  # a process starting: nothing to wait on but its port
        raise RuntimeError(f"vllm-router did not answer /health within {timeout_s:g} s; see {self.log_path}")

    async def kill(self) -> float:
        """SIGKILL, the way a crashed router goes; the unix time it did."""
        if self.process is not None and self.process.returncode is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            killed = time.time()
            await self.process.wait()
            return killed
        return time.time()


PHASES = (  # name, vllm-router --policy, fault
    ("consistent hashing", "consistent_hash", None),
    ("round robin", "round_robin", None),
    ("worker-a killed", "consistent_hash", "worker"),
    ("router killed", "consistent_hash", "router"),
)


def workers_by_developer(taps: Sequence[Tap]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tap in taps:
        for key, count in tap.by_key.items():
            out.setdefault(key, {})[tap.name] = count
    return out


@contextlib.asynccontextmanager
async def embedded(threads: int, swa_full: bool) -> AsyncIterator[str]:
    from mellum_proxy.upstream.embedded import EmbeddedServer

    server = EmbeddedServer(ctx_tokens=4096, slots=2, threads=threads, swa_full=swa_full)
    url = await asyncio.to_thread(server.start)
    try:
        yield url
    finally:
        await asyncio.to_thread(server.stop)


async def run_team(
    router_bin: str,
    developers: Sequence[Sequence[Event]],
    policy: Policy,
    out: Path,
    max_tokens: int = 16,
    health_interval_ms: int = 500,
) -> list[Phase]:
    """The four phases, each a fresh router and fresh proxies over the same workers and fallback."""
    router_log = out / "vllm-router.log"
    phases: list[Phase] = []
    async with embedded(1, True) as worker_a, embedded(1, True) as worker_b, embedded(1, True) as local:
        for name, router_policy, fault in PHASES:
            taps = [Tap("worker-a", worker_a), Tap("worker-b", worker_b)]
            for tap in taps:
                await tap.start()
            router = Router(router_bin, [t.url or "" for t in taps], router_policy, router_log)
            await router.start()
            settings = {"upstream": [router.url, local], "health_interval_ms": str(health_interval_ms),
                        "upstream_model": "gemma-3-270m-q4_k_m"}  # fmt: skip
            phase = Phase(name, router_policy, [], {}, fallback=local)
            phase.events["replay start"] = time.time()
            duration_s = _replay_seconds(developers)
            injector = asyncio.create_task(_inject(fault, duration_s, taps, router, phase))
            phase.results = await run_developers(policy, developers, router.url, max_tokens=max_tokens,
                                                 settings=settings)  # fmt: skip
            await injector
            phase.workers = workers_by_developer(taps)
            if fault == "router":
                phase.notes = failover_times(phase.results, phase.events["router killed"],
                                             phase.events["router back"], local, router.url)  # fmt: skip
            if fault is not None:
                phase.notes += failures(phase.results, phase.events)
            await router.kill()
            for tap in taps:
                await tap.stop()
            phases.append(phase)
            print(f"## {name}\n" + developers_markdown(phase.results, phase.workers, local), flush=True)
    return phases


def _replay_seconds(developers: Sequence[Sequence[Event]], max_gap_ms: float = 2000) -> float:
    return max(schedule(list(events), max_gap_ms)[-1] for events in developers) / 1000


async def _inject(fault: str | None, duration_s: float, taps: Sequence[Tap], router: Router, phase: Phase) -> None:
    """The phase's fault: worker-a stopped at 40 % of the replay; or the router killed at 30 %, started
    again at 60 %. (The replay starts after each proxy's short warm-up, so the times are approximate.)"""
    if fault == "worker":
        await asyncio.sleep(0.4 * duration_s)
        await taps[0].stop()
        phase.events["worker-a killed"] = time.time()
    elif fault == "router":
        await asyncio.sleep(0.3 * duration_s)
        phase.events["router killed"] = await router.kill()
        await asyncio.sleep(0.3 * duration_s)
        phase.events["router back"] = await router.start()
