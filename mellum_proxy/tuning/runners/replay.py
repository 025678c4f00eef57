"""`mellum-proxy bench replay`: the same typing, the same server, one policy after another.

Each policy is a set of proxy settings (`debounce_ms`, `max_inflight`, `timeout_ms`, ...) plus the
simulated plugin's own options (`plugin_cancel`, `plugin_debounce_ms`); `direct` sends the plugin's
requests straight to the upstream, the baseline everyone has today. Every policy gets a fresh proxy
in-process and a short warm-up; the trace is typed out in real time (`mellum_proxy.tuning.runners.playback`). What the
upstream did is read from its own `/metrics` (llama.cpp's names; the simulator speaks them too).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from mellum_proxy.console import POSITIVE, command, fail, real
from mellum_proxy.http import POLICIES, RECORDS
from mellum_proxy.tuning.reporting import replay_report
from mellum_proxy.tuning.reporting.replay_report import developers_markdown
from mellum_proxy.tuning.reporting.results import PolicyResult, Seen, ms_per_token
from mellum_proxy.tuning.reporting.writing import command_line, progress_bar
from mellum_proxy.tuning.runners.playback import METRICS_PERIOD_S, Clock, pause_starts, play
from mellum_proxy.tuning.runners.policy import Policy, parse_policy, proxy_for
from mellum_proxy.tuning.runners.upstreams import PIN_HELP, upstream_for
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.editor import Plugin, account
from mellum_proxy.tuning.workloads.trace import Documents, Edit, Event, TraceError, limited, next_typed
from mellum_proxy.upstream.metrics import by_name
from mellum_proxy.upstream.servers.llamacpp import metrics as llamacpp_metrics


def add_commands(commands: Any) -> None:
    replay = command(commands, "replay", "replay traces under several policies against one upstream", _replay)
    replay.add_argument("traces", nargs="+", type=Path)
    replay.add_argument("--upstream", required=True, help="URL, 'embedded', or 'sim[:PROFILE]' (embedded-cpu, fast)")
    replay.add_argument("--pin-server", action="store_true", help=PIN_HELP)
    replay.add_argument(
        "--policy", action="append", required=True, help="NAME[:key=value,...]; 'direct' is the baseline"
    )
    replay.add_argument("--out", type=Path, required=True)
    replay.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=True,
                        help="also replay the oracle (one request per pause, sent the moment typing stops), the "
                             "yardstick each policy is read against [default: on]")  # fmt: skip
    replay.add_argument("--limit-events", type=POSITIVE, help="stop after this many edits")
    replay.add_argument("--pause-ms", type=real(0), default=300, help="a gap this long is a pause [default: 300]")
    replay.add_argument("--max-gap-ms", type=real(0), default=2000, help="shorten longer gaps to this [default: 2000]")
    replay.add_argument("--max-tokens", type=POSITIVE, default=64, help="what the plugin asks for [default: 64]")
    replay.add_argument("--developers", type=POSITIVE, default=1,
                        help="replay the traces at once as this many developers, each with its own proxy "
                             "(trace i for developer i, round robin) [default: 1: one after another]")  # fmt: skip


def _replay(args: argparse.Namespace) -> None:
    try:
        policies = [parse_policy(text) for text in args.policy]
        if args.oracle and not any(policy.oracle for policy in policies):
            policies.append(parse_policy("oracle"))
        events: list[Event] = []
        traces = [list(limited(load_trace(path), args.limit_events)) for path in args.traces]
        for trace in traces:  # several traces play one after another
            offset = events[-1].t_ms + 2000 if events else 0
            events += [replace(e, t_ms=e.t_ms + offset) for e in trace]
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    if args.developers > 1:
        developers = [traces[i % len(traces)] for i in range(args.developers)]
        asyncio.run(_run_developers(args, policies, developers))
        return
    asyncio.run(_run_all(args, policies, events))


async def _run_all(args: argparse.Namespace, policies: list[Policy], events: list[Event]) -> None:
    async with upstream_for(args.upstream, args.pin_server) as (url, described):
        print(f"upstream: {described}")
        print("order: " + " -> ".join(p.name for p in policies))
        results = []
        for policy in policies:
            results.append(await run_policy(policy, events, url, args.pause_ms, args.max_gap_ms, args.max_tokens,
                                            progress_bar(policy.name, len(events))))  # fmt: skip
            r = results[-1]
            print(f"{policy.name}: {r.upstream_requests} upstream requests, {r.shown} shown, coverage "
                  f"{(r.pause_coverage or 0):.0%}, p95 {r.latency_p95_ms or 0:.0f} ms")  # fmt: skip
    timing = (
        f"{results[0].edits} edits; pauses are gaps >= {args.pause_ms:g} ms; gaps > {args.max_gap_ms:g} ms shortened"
    )
    notes = [f"upstream: {described}", timing, "policy order: " + " -> ".join(p.name for p in policies)]
    for path in replay_report.write(results, args.out, command_line(), notes):
        print(f"wrote {path}")


async def _run_developers(args: argparse.Namespace, policies: list[Policy], developers: list[list[Event]]) -> None:
    results = []
    async with upstream_for(args.upstream, args.pin_server) as (url, described):
        print(f"upstream: {described}; {len(developers)} developers at once, each with its own proxy")
        for policy in policies:
            group = await run_developers(policy, developers, url, args.pause_ms, args.max_gap_ms, args.max_tokens)
            print(developers_markdown(group), end="")
            results += group
    notes = [f"upstream: {described}", f"{len(developers)} developers at once (trace i for developer i)"]
    for path in replay_report.write(results, args.out, command_line(), notes):
        print(f"wrote {path}")
    with (args.out / "report.md").open("a") as sink:
        sink.write("\n" + developers_markdown(results))


async def run_developers(
    policy: Policy, developers: Sequence[Sequence[Event]], upstream: str, pause_ms: float = 300,
    max_gap_ms: float = 2000, max_tokens: int = 64, settings: dict[str, Any] | None = None, stagger_ms: float = 0.0,
) -> list[PolicyResult]:  # fmt: skip
    """Each developer's trace at once, each through its own proxy (`developer_id` dev-1, dev-2, ...), all in this
    process; developer i starts typing `stagger_ms` x i after the first (the lab's capacity staggers so)."""
    async with aiohttp.ClientSession() as session:
        await wait_idle(session, upstream)
    runs = []
    for number, events in enumerate(developers, start=1):
        name = f"dev-{number}"
        options = None if policy.settings is None else {**policy.settings, "developer_id": name, **(settings or {})}
        runs.append(run_policy(replace(policy, name=f"{policy.name}/{name}", settings=options), list(events),
                               upstream, pause_ms, max_gap_ms, max_tokens,
                               start_after_ms=stagger_ms * (number - 1)))  # fmt: skip
    return list(await asyncio.gather(*runs))


async def read_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The server's `llamacpp:` metrics now (empty when it has none)."""
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            found = by_name(await resp.text())
            return llamacpp_metrics(found) if found is not None else {}
    except (aiohttp.ClientError, TimeoutError):
        return {}


async def count_unmetered(session: aiohttp.ClientSession, url: str, results: list[Any]) -> None:
    """The tokens of each answer that came without `usage` (a completion the proxy ended early: post-processing,
    a deadline cut), counted with the server's own `/tokenize`, so that its shown tokens are not taken for
    waste. Left at 0 where the server cannot count."""
    for result in results:
        if result.status != 200 or not result.text or result.completion_tokens:
            continue
        try:
            body = {"content": result.text, "add_special": False}
            async with session.post(url + "/tokenize", json=body, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return
                tokens = (await resp.json()).get("tokens")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        if isinstance(tokens, list):
            result.completion_tokens = len(tokens)


async def run_policy(
    policy: Policy,
    events: list[Event],
    upstream: str,
    pause_ms: float = 300,
    max_gap_ms: float = 2000,
    max_tokens: int = 64,
    progress: Callable[[int, int], None] | None = None,
    start_after_ms: float | None = None,
) -> PolicyResult:
    """One policy over `events`, typed in real time once the server is idle; with `start_after_ms` (one of
    several developers at once), typed that long after the call instead, the server's idleness not awaited."""
    idle_wait_s = None
    if start_after_ms is None:
        async with aiohttp.ClientSession() as session:
            idle_wait_s = await wait_idle(session, upstream)
    async with aiohttp.ClientSession() as session, proxy_for(policy, upstream) as (url, app):
        plugin = Plugin(session, url + "/v1/completions", cancels=policy.plugin_cancel,
                        debounce_ms=policy.plugin_debounce_ms, max_tokens=max_tokens, stream=policy.oracle)  # fmt: skip
        started = asyncio.get_running_loop().time()
        await _warm_up(plugin, events)
        if start_after_ms:  # the workload's own schedule: this developer begins later
            await asyncio.sleep(max(0.0, started + start_after_ms / 1000 - asyncio.get_running_loop().time()))
        before = await read_metrics(session, upstream)
        samples: list[tuple[float, float, float]] = []
        clock = Clock()
        plugin.now_ms = clock.now_ms
        plugin.results.clear()
        sampler = asyncio.create_task(_sample(session, upstream, clock, samples))
        only = pause_starts(events, max_gap_ms, pause_ms) if policy.oracle else None
        marks = await play(events, max_gap_ms, plugin, clock, progress, only)
        await plugin.drain()
        duration = clock.now_ms() / 1000
        # the server's counters are read once it has finished every request of this policy, not when the
        # client side is done: a backlog still decoding is the policy's waste too
        drain_s = await wait_idle(session, upstream)
        await count_unmetered(session, upstream, plugin.results)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        after = await read_metrics(session, upstream)
        acct = account(marks, plugin.results, pause_ms, next_typed(events), last_look_ms=max_gap_ms)
        kept = app[RECORDS] if app is not None else None
        records = list(kept) if kept is not None else []
        admission = app[POLICIES].admission if app is not None else None
    predicted = _delta(before, after, "tokens_predicted_total")
    upstream_requests = sum(r.reached_upstream for r in records) if app is not None else len(plugin.results)
    timeouts = sum(r.outcome == "timeout" for r in records) + sum(r.error == "TimeoutError" for r in plugin.results)
    peaks = [r.vram_peak_mib for r in records if r.vram_peak_mib is not None]
    served_by: dict[str, int] = {}
    for record in records:
        if record.upstream is not None:
            served_by[record.upstream] = served_by.get(record.upstream, 0) + 1
    counted = [r for r in records if r.prompt_tokens is not None and r.cached_tokens is not None]
    drafted = [r for r in records if r.draft_n is not None]
    reached = [r for r in records if r.reached_upstream]
    return PolicyResult(
        policy=policy.name, **Seen.of(acct), client_requests=acct.requests, upstream_requests=upstream_requests,
        shown=acct.shown, upstream_prompt_tokens=_delta(before, after, "prompt_tokens_total"),
        upstream_completion_tokens=predicted, shown_completion_tokens=acct.shown_completion_tokens,
        wasted_completion_tokens=None if predicted is None else max(0.0, predicted - acct.shown_completion_tokens),
        timeouts=timeouts, errors=sum(1 for r in plugin.results if r.error and r.error != "TimeoutError"),
        max_queue_depth=int(max([admission.max_depth_seen if admission else 0, *(s[2] for s in samples)])),
        max_inflight=int(max([0, *(s[1] + s[2] for s in samples)])),
        vram_peak_mib=max(peaks) if peaks else None, duration_s=duration, inflight_series=samples,
        idle_wait_s=idle_wait_s, drain_s=drain_s, served_by=served_by,
        upstream_errors=sum(r.outcome == "upstream_error" for r in records),
        record_prompt_tokens=sum(r.prompt_tokens or 0 for r in counted),
        record_cached_tokens=sum(r.cached_tokens or 0 for r in counted),
        upstream_series=[(r.received_at, r.upstream, str(r.outcome), r.total_ms or 0.0) for r in reached],
        decode_ms_per_token=ms_per_token(_delta(before, after, "tokens_predicted_seconds_total"), predicted),
        draft_n=sum(r.draft_n or 0 for r in drafted) if drafted else None,
        draft_n_accepted=sum(r.draft_n_accepted or 0 for r in drafted) if drafted else None,
    )  # fmt: skip


async def wait_idle(session: aiohttp.ClientSession, upstream: str, timeout_s: float = 120.0) -> float | None:
    """Wait until the server reports nothing running or queued; the seconds that took (None: it cannot say)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < timeout_s:
        metrics = await read_metrics(session, upstream)
        if "requests_processing" not in metrics:
            return None
        if metrics["requests_processing"] + metrics.get("requests_deferred", 0) == 0:
            return loop.time() - start
        await asyncio.sleep(0.05)  # polling the server's own gauges: it has no event to wait on
    return loop.time() - start


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> float | None:
    return after[key] - before[key] if key in before and key in after else None


async def _warm_up(plugin: Plugin, events: list[Event]) -> None:
    """Three requests before the clock starts, so model load and first-use costs are not measured."""
    documents = Documents()
    for event in events:
        documents.apply(event)
        if isinstance(event, Edit):
            break
    for name, text in list(documents.texts.items())[:1]:
        for _ in range(3):
            plugin.on_edit(-1, name, text, documents.cursor[name])
            await plugin.drain()


async def _sample(
    session: aiohttp.ClientSession, upstream: str, clock: Clock, out: list[tuple[float, float, float]]
) -> None:
    """Requests the upstream holds, running and queued (its own gauges), every 100 ms."""
    while True:
        metrics = await read_metrics(session, upstream)
        if metrics:
            out.append((clock.now_ms() / 1000, metrics.get("requests_processing", 0),
                        metrics.get("requests_deferred", 0)))  # fmt: skip
        await asyncio.sleep(METRICS_PERIOD_S)
