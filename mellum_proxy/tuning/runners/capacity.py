"""`bench lab --developers N[,N...]`: how many developers one server carries, direct against the proxy.

N developers type at once on one simulated server (virtual time, as the rest of the lab): developer i types
the lab's trace i mod T, starting `STAGGER_MS` x i later, each through a proxy of its own (`direct`: straight
to the server; the oracle too). Their pauses are pooled: the policy carries N developers when the
pause-to-suggestion p95 over all of them is at most `P95_LIMIT_MS` (the Mellum paper's target) and their mean
pause coverage at least `COVERAGE_SHARE` of what the same developers get alone on the server (N = 1 each).
N grows through the list until a step fails; `capacity` gives, per profile and policy, the largest N carried.
With `chat_share`, that share of the developers also runs a chat or agent beside their typing: one answer of
`CHAT_TOKENS` after another on the same server, through their proxy's bulk lane (direct: straight to it).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from mellum_proxy.assembly import build_service
from mellum_proxy.budget import CharsEstimator
from mellum_proxy.config import Settings
from mellum_proxy.sections import sections
from mellum_proxy.telemetry import RecentRecords, Telemetry
from mellum_proxy.telemetry.stats import percentile
from mellum_proxy.tuning.reporting.capacity_report import CapacityRun
from mellum_proxy.tuning.runners.lab_parts import EngineSource, LabEditor, Writer
from mellum_proxy.tuning.runners.playback import METRICS_PERIOD_S, Clock, pause_starts, play
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.sim.engine import SimEngine
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.editor import Accounting, account
from mellum_proxy.tuning.workloads.trace import Event, next_typed

P95_LIMIT_MS = 500.0
COVERAGE_SHARE = 0.9
STAGGER_MS = 1000.0
PAUSE_MS = 300.0
CHAT_TOKENS = 600  # each chat answer's tokens (4 s at the gpu profile's decode)


def parse_developers(text: str) -> list[int]:
    """`1,2,4,8`: ascending positive counts. Raises ValueError."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--developers '{text}': expected counts such as 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise ValueError(f"--developers '{text}': expected counts of at least 1")
    return counts


async def _team(
    policy: Policy, traces: Sequence[Sequence[Event]], spec: ServerProfile, accuracy: float, max_gap_ms: float,
    max_tokens: int, chat_share: float = 0.0,
) -> tuple[list[Accounting], int]:  # fmt: skip
    """Each developer's accounting, all typing at once on one engine; the engine's requests."""
    engine = SimEngine(spec)
    clock = Clock()
    chatting = round(chat_share * len(traces))

    async def chat(service: Any, typing: asyncio.Task[Any]) -> None:
        """Chat answers one after another while the developer types, through the proxy's bulk lane."""
        while not typing.done():
            lease = await service.policies.admission.acquire_bulk(None) if service is not None else None
            try:
                task = engine.submit("explain this module", CHAT_TOKENS, "tok" + " tok" * (CHAT_TOKENS - 1))
                async for _ in task.stream():
                    pass
            finally:
                if lease is not None:
                    lease.release()

    async def developer(index: int, events: Sequence[Event]) -> Accounting:
        await clock.until(STAGGER_MS * index)
        truth = next_typed(events)
        source = EngineSource(engine, Writer(truth, accuracy, seed=index), {})
        service = None
        if policy.settings is not None:
            tree = sections(Settings.model_validate(policy.settings))
            service = build_service(tree, source, CharsEstimator(), Telemetry(RecentRecords(size=16)), spec.slots)
        own = Clock()
        editor = LabEditor(policy, engine, source, service, own, max_tokens)
        only = pause_starts(events, max_gap_ms, PAUSE_MS) if policy.oracle else None
        typing = asyncio.ensure_future(play(events, max_gap_ms, editor, own, only=only))
        chatter = asyncio.ensure_future(chat(service, typing)) if index < chatting else None
        marks = await typing
        if chatter is not None:
            await chatter
        if editor.tasks:
            await asyncio.wait(list(editor.tasks), timeout=30)
        if service is not None:
            await service.drain()
        return account(marks, editor.results, PAUSE_MS, truth, last_look_ms=max_gap_ms)

    reader = asyncio.ensure_future(engine.read_metrics_every(METRICS_PERIOD_S))  # as `benchmarks capacity` reads it
    accounts = await asyncio.gather(*(developer(i, events) for i, events in enumerate(traces)))
    await engine.idle()
    reader.cancel()
    return list(accounts), engine.requests


def run_team(policy: Policy, traces: Sequence[Sequence[Event]], spec: ServerProfile, accuracy: float,
             max_gap_ms: float, max_tokens: int, chat_share: float = 0.0) -> tuple[list[Accounting], int]:  # fmt: skip
    import looptime

    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(_team(policy, traces, spec, accuracy, max_gap_ms, max_tokens, chat_share))


def measure(
    traces: Sequence[Sequence[Event]], specs: Sequence[ServerProfile], policies: Sequence[Policy],
    counts: Sequence[int], accuracy: float, max_gap_ms: float, max_tokens: int,
    progress: Callable[[str], None] = print, chat_share: float = 0.0,
) -> CapacityRun:  # fmt: skip
    """`capacity` (the largest N carried, per profile and policy) and `capacity_curve` (every N tried); with
    `chat_share`, that share of each team also chats (its alone runs do not: the yardstick stays typing alone)."""
    capacity, curve = [], []
    for spec in specs:
        for policy in policies:
            alone = [run_team(policy, [traces[i % len(traces)]], spec, accuracy, max_gap_ms, max_tokens)[0][0]
                     for i in range(min(len(traces), max(counts)))]  # fmt: skip
            carried: dict[str, Any] = {"profile": spec.name, "policy": policy.name, "developers": 0,
                                       "p95_ms": None, "coverage": None}  # fmt: skip
            for n in counts:
                team, requests = run_team(policy, [traces[i % len(traces)] for i in range(n)], spec, accuracy,
                                          max_gap_ms, max_tokens, chat_share)  # fmt: skip
                point = _point(team, [alone[i % len(alone)] for i in range(n)]) | {"upstream_requests": requests}
                curve.append({"profile": spec.name, "policy": policy.name, "developers": n, **point})
                if not point["carried"]:
                    break
                carried |= {"developers": n, "p95_ms": point["p95_ms"], "coverage": point["coverage"]}
            capacity.append(carried)
            progress(f"{spec.name} / {policy.name}: {carried['developers']} developers")
    return {"capacity": capacity, "capacity_curve": curve,
            "capacity_rule": {"p95_limit_ms": P95_LIMIT_MS, "coverage_share": COVERAGE_SHARE,
                              "stagger_ms": STAGGER_MS, "counts": list(counts), "chat_share": chat_share,
                              "chat_tokens": CHAT_TOKENS}}  # fmt: skip


def _point(team: Sequence[Accounting], alone: Sequence[Accounting]) -> dict[str, Any]:
    return judge([acct.latencies_ms for acct in team], [acct.pause_coverage for acct in team],
                 [acct.pause_coverage for acct in alone])  # fmt: skip


def judge(
    latencies: Sequence[Sequence[float]], coverages: Sequence[float | None], alone: Sequence[float | None]
) -> dict[str, Any]:
    """The rule, for the lab's team and for a real one (`benchmarks capacity`): each developer's pause-to-suggestion
    times and pause coverage, and the same developers' coverage alone on the server."""
    pooled = [ms for each in latencies for ms in each]
    p95 = percentile(pooled, 95) if pooled else None
    coverage = statistics.fmean(c or 0.0 for c in coverages)
    alone_coverage = statistics.fmean(c or 0.0 for c in alone)
    carried = p95 is not None and p95 <= P95_LIMIT_MS and coverage >= COVERAGE_SHARE * alone_coverage
    return {"p95_ms": p95, "coverage": coverage, "alone_coverage": alone_coverage, "carried": carried}
