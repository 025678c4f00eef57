"""A team on one machine: several developers' proxies in front of a router and its workers.

`run_developers` replays one trace per developer at once, each through a proxy of its own (its own
`developer_id`, the routing key); `bench replay --developers N` uses it against any upstream.

`bench team` (`run_team`) builds the whole setup from real parts: two embedded llama.cpp servers as
workers, each behind a `Tap` (a relay that counts which developer's requests reached that worker, and
whose stop is the worker dying), `vllm-router` in front of them, a local embedded server as every
developer's fallback (`--upstream ROUTER --upstream LOCAL`), and the proxies. Its phases:
consistent hashing, round robin, a worker killed mid-run, the router killed and started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.replay import Policy, PolicyResult, run_policy
from bench.trace import Event

log = logging.getLogger("mellum_proxy.bench")

ROUTING_HEADER = "x-session-id"  # what the proxies send and vllm-router's consistent hashing reads
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


async def run_developers(
    policy: Policy,
    developers: Sequence[Sequence[Event]],
    upstream: str,
    pause_ms: float = 300,
    max_gap_ms: float = 2000,
    max_tokens: int = 64,
    settings: dict[str, Any] | None = None,
) -> list[PolicyResult]:
    """Each developer's trace at once, each through its own proxy (`developer_id` dev-1, dev-2, ...)."""
    runs = []
    for number, events in enumerate(developers, start=1):
        name = f"dev-{number}"
        options = None if policy.settings is None else {**policy.settings, "developer_id": name, **(settings or {})}
        runs.append(run_policy(replace(policy, name=f"{policy.name}/{name}", settings=options), list(events),
                               upstream, pause_ms, max_gap_ms, max_tokens))  # fmt: skip
    return list(await asyncio.gather(*runs))


def cached_share(result: PolicyResult) -> float | None:
    """Of the prompt tokens the server was sent, the share it served from its cache."""
    if not result.record_prompt_tokens:
        return None
    return result.record_cached_tokens / result.record_prompt_tokens


def developers_markdown(
    results: Sequence[PolicyResult], workers: dict[str, dict[str, int]] | None = None, fallback: str | None = None
) -> str:
    """One row per developer: coverage, p95, failures, cache share, and where their requests went (the
    workers' own counts when known, and the answers of the fallback upstream)."""
    lines = ["| developer | edits | upstream requests | pause coverage | p95 ms | failed | cached share | served by |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        developer = r.policy.rpartition("/")[2]
        where = dict(workers.get(developer, {})) if workers is not None else dict(r.served_by)
        if fallback is not None and r.served_by.get(fallback):
            where["local fallback"] = r.served_by[fallback]
        served = ", ".join(f"{k}: {v}" for k, v in sorted((where or {}).items())) or "-"
        share = cached_share(r)
        lines.append(
            f"| {r.policy} | {r.edits} | {r.upstream_requests} | {(r.pause_coverage or 0):.0%} | "
            f"{r.latency_p95_ms or 0:.0f} | {r.upstream_errors} | "
            f"{'-' if share is None else f'{share:.0%}'} | {served} |"
        )
    return "\n".join(lines) + "\n"


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


@dataclass
class Phase:
    name: str
    router_policy: str
    results: list[PolicyResult]
    workers: dict[str, dict[str, int]]  # developer -> worker -> requests
    events: dict[str, float] = field(default_factory=dict)  # what happened when (unix seconds)
    notes: list[str] = field(default_factory=list)
    fallback: str | None = None


def workers_by_developer(taps: Sequence[Tap]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tap in taps:
        for key, count in tap.by_key.items():
            out.setdefault(key, {})[tap.name] = count
    return out


def failover_times(results: Sequence[PolicyResult], killed: float, back: float, local: str, router: str) -> list[str]:
    """Per developer: from the kill to its first request served by the local fallback, and from the
    router's return to its first request served by it again."""
    notes = []
    for r in results:
        served = [(at, upstream) for at, upstream, _, _ in r.upstream_series if upstream is not None]
        away = next((at for at, upstream in served if at >= killed and upstream == local), None)
        home = next((at for at, upstream in served if at >= back and upstream == router), None)
        local_count = sum(1 for at, upstream in served if upstream == local)
        to_local = "never" if away is None else f"{(away - killed) * 1000:.0f} ms after the kill"
        to_router = "never" if home is None else f"{(home - back) * 1000:.0f} ms after it was back"
        notes.append(f"{r.policy}: first answer from the local fallback {to_local}; first from the router "
                     f"again {to_router}; {local_count} answers from the fallback")  # fmt: skip
    return notes


def failures(results: Sequence[PolicyResult], events: dict[str, float]) -> list[str]:
    """Each failed completion, and whether it was in flight when the fault struck (it started before it
    and ended after it)."""
    faults = {what: at for what, at in events.items() if "killed" in what}
    notes = []
    for r in results:
        for at, _, outcome, total_ms in r.upstream_series:
            if outcome != "upstream_error":
                continue
            struck = [what for what, t in faults.items() if at <= t <= at + total_ms / 1000]
            when = f"in flight when {struck[0]}" if struck else "not in flight at a fault"
            notes.append(f"{r.policy}: failed completion at +{(at - events['replay start']) * 1000:.0f} ms, {when}")
    return notes or ["no failed completions"]


@contextlib.asynccontextmanager
async def embedded(threads: int, swa_full: bool) -> AsyncIterator[str]:
    from proxy.upstream.embedded import EmbeddedServer

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
    from bench.replay import schedule

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


def team_report(phases: Sequence[Phase], command: str, notes: Sequence[str], out: Path) -> list[Path]:
    lines = [f"`{command}`", "", *[f"- {note}" for note in notes], ""]
    for phase in phases:
        lines += [f"## {phase.name} (`--policy {phase.router_policy}`)", ""]
        lines.append(developers_markdown(phase.results, phase.workers, phase.fallback))
        start = phase.events.get("replay start", 0.0)
        lines += [f"- {what} at +{(at - start) * 1000:.0f} ms" for what, at in phase.events.items() if at != start]
        lines += [f"- {note}" for note in phase.notes]
        lines.append("")
    (out / "report.md").write_text("\n".join(lines))
    body = {
        "command": command,
        "notes": list(notes),
        "phases": [{"name": p.name, "router_policy": p.router_policy, "workers": p.workers, "events": p.events,
                    "notes": p.notes, "developers": [r.summary() for r in p.results]} for p in phases],
    }  # fmt: skip
    (out / "results.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
    return [out / "report.md", out / "results.json"]
