"""`python -m benchmarks capacity`: how many developers one real server carries, direct against the proxy, beside
the lab's answer for the same server.

The lab's team (`mellum_proxy.tuning.runners.capacity`) typed on a real scheduler: N developers at once, developer
i typing trace i mod T from `STAGGER_MS` x i, each through a proxy of its own, all proxies and simulated plugins in
this one process, in real time (with `--pin-server` the embedded server keeps a core of its own and they take the
others). The same rule judges both: pooled pause-to-suggestion p95 at most `P95_LIMIT_MS`, mean pause coverage at
least `COVERAGE_SHARE` of the same developers' alone. N grows through the list until a step fails. The lab runs the
same traces and counts in virtual time on the server's profile: one file, or `measure` (this server, profiled
first, as `mellum-proxy profile` does).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.runners.calibration import MEASURE, keep_measured, measured_profile
from benchmarks.upstreams import PIN_HELP, upstream_for
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.tuning.reporting.capacity_report import CapacityReport, CapacityRun, render
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.runners.capacity import (
    COVERAGE_SHARE,
    P95_LIMIT_MS,
    PAUSE_MS,
    STAGGER_MS,
    judge,
    parse_developers,
)
from mellum_proxy.tuning.runners.capacity import measure as lab_capacity
from mellum_proxy.tuning.runners.lab import MAX_GAP_MS
from mellum_proxy.tuning.runners.policy import Policy, parse_policy
from mellum_proxy.tuning.runners.replay import run_developers
from mellum_proxy.tuning.sim.server import profile
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.trace import Event, TraceError, limited


def add_commands(commands: Any) -> None:
    capacity = command(commands, "capacity", "how many developers a real server carries, direct and through the "
                       "proxy, beside the lab's answer", _capacity, out="capacity")  # fmt: skip
    capacity.add_argument("traces", nargs="+", type=Path)
    capacity.add_argument("--upstream", default="fast", help="the real server: fast (the fast model), embedded, a URL "
                          "[default: fast]")  # fmt: skip
    capacity.add_argument("--pin-server", action="store_true", help=PIN_HELP)
    capacity.add_argument("--developers", default="1,2,4,8", metavar="N[,N...]",
                          help="the counts to try, ascending [default: 1,2,4,8]")  # fmt: skip
    capacity.add_argument("--policy", action="append", help="NAME[:key=value,...] [default: direct and defaults]")
    capacity.add_argument("--limit-events", type=POSITIVE, default=300, help="edits per trace [default: 300]")
    capacity.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    capacity.add_argument("--profile", default=MEASURE,
                          help="the lab's server: the JSON of `mellum-proxy profile`, a sim profile, or 'measure' "
                               "(profile this one first, kept as OUT/profile.json) [default: measure]")  # fmt: skip


def _capacity(args: argparse.Namespace) -> None:
    try:
        counts = parse_developers(args.developers)
        policies = [parse_policy(text) for text in args.policy or ("direct", "defaults")]
        traces = [list(limited(load_trace(path), args.limit_events)) for path in args.traces]
        spec = None if args.profile == MEASURE else profile(args.profile)
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))

    async def run() -> tuple[CapacityRun, str, ServerProfile]:
        async with upstream_for(args.upstream, args.pin_server) as (url, described):
            measured = spec or await measured_profile(url, described, args.upstream)
            return await measure(traces, url, policies, counts, args.max_tokens), described, measured

    real, described, measured = asyncio.run(run())
    lab = lab_capacity(traces, [measured], policies, counts, 0.0, MAX_GAP_MS, args.max_tokens)
    result: CapacityReport = {"upstream": described, **real, "lab_capacity": lab["capacity"],
                              "lab_curve": lab["capacity_curve"], "profile": repr(measured),
                              "traces": [path.name for path in args.traces], "edits": args.limit_events}  # fmt: skip
    write_report(args.out, "capacity", result, render)
    keep_measured(args.out, measured)


async def measure(
    traces: Sequence[Sequence[Event]], url: str, policies: Sequence[Policy], counts: Sequence[int], max_tokens: int,
    progress: Callable[[str], None] = print,
) -> CapacityRun:  # fmt: skip
    """Per policy, the team at each count in real time until a count is not carried: `capacity` (the largest N
    carried) and `capacity_curve` (every N tried), as the lab's capacity writes them."""
    capacity, curve = [], []
    for policy in policies:
        alone: list[float | None] = []
        for events in traces[: max(counts)]:  # each trace's developer alone: the coverage yardstick
            (result,) = await run_developers(policy, [events], url, PAUSE_MS, MAX_GAP_MS, max_tokens)
            alone.append(result.pause_coverage)
        carried: dict[str, Any] = {"policy": policy.name, "developers": 0, "p95_ms": None, "coverage": None}
        for n in counts:
            team = await run_developers(policy, [traces[i % len(traces)] for i in range(n)], url, PAUSE_MS,
                                        MAX_GAP_MS, max_tokens, stagger_ms=STAGGER_MS)  # fmt: skip
            point = judge([r.latencies_ms for r in team], [r.pause_coverage for r in team],
                          [alone[i % len(alone)] for i in range(n)])  # fmt: skip
            point |= {"upstream_requests": sum(r.upstream_requests for r in team),
                      "timeouts": sum(r.timeouts for r in team), "errors": sum(r.errors for r in team)}  # fmt: skip
            curve.append({"policy": policy.name, "developers": n, **point})
            progress(f"real {policy.name}, {n} at once: p95 {point['p95_ms'] or 0:.0f} ms, coverage "
                     f"{point['coverage']:.0%} (alone {point['alone_coverage']:.0%}), "
                     f"{'carried' if point['carried'] else 'not carried'}")  # fmt: skip
            if not point["carried"]:
                break
            carried |= {"developers": n, "p95_ms": point["p95_ms"], "coverage": point["coverage"]}
        capacity.append(carried)
    return {"capacity": capacity, "capacity_curve": curve,
            "capacity_rule": {"p95_limit_ms": P95_LIMIT_MS, "coverage_share": COVERAGE_SHARE,
                              "stagger_ms": STAGGER_MS, "counts": list(counts)}}  # fmt: skip
