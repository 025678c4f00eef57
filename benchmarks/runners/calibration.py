"""`python -m benchmarks calibrate`: the same trace on the real embedded llama.cpp server (real time) and
in the lab on `sim:embedded-cpu` (virtual time), for `direct` and the defaults (and the oracle, with `--oracle`),
side by side.

The simulator is trusted for a policy choice only where the two agree: within 15 % on pause coverage,
pause->shown p95, upstream requests and the server's peak held requests (running + queued, from its own
`/metrics`). One real run differs from the next on a busy machine by more than that, so `--runs N` replays each
policy N times (the policies taking turns) and the lab N times too (seeds 0..N-1: a measured profile's `spread`
gives each simulated request its own luck), median held to median, each side's range beside it.
Beside them, each side's decode time a token (the server's own `/metrics`: `tokens_predicted_seconds_total` over
`tokens_predicted_total`; the simulator counts as llama.cpp does), shown, not held: how fast the server really ran
against the profile the lab ran on.
The simulated model's accuracy defaults to 0: the embedded gemma-3-270m was not trained for
fill-in-the-middle, and its suggestions (almost) never begin with what the person typed next — the
real run's `predicted chars` says how often they did.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.reporting.calibration_report import METRICS, Calibration, CalibrationRow, render
from benchmarks.upstreams import PIN_HELP, upstream_for
from mellum_proxy.console import POSITIVE, SHARE, command, fail
from mellum_proxy.planning.profile import Profile, ProfileError
from mellum_proxy.planning.profile import profile as measure_server
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.runners.lab import ORACLE, run_lab
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.runners.replay import run_policy
from mellum_proxy.tuning.sim.server import profile
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.trace import Event, TraceError, limited


def add_commands(commands: Any) -> None:
    calibrate = command(commands, "calibrate", "one trace on the real embedded server and on the lab's simulator",
                        _calibrate, out="calibration")  # fmt: skip
    calibrate.add_argument("trace", type=Path)
    calibrate.add_argument("--limit-events", type=POSITIVE, default=300, help="edits [default: 300]")
    calibrate.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    calibrate.add_argument("--profile", default="embedded-cpu",
                           help="the lab's server: a sim profile, the JSON of `mellum-proxy profile`, or 'measure' "
                                "(profile the real server before each turn, as `mellum-proxy profile` does, lab run i "
                                "on turn i's profile; kept as OUT/profile.json, profile-2.json, ...) "
                                "[default: embedded-cpu]")  # fmt: skip
    calibrate.add_argument("--runs", type=POSITIVE, default=1,
                           help="real replays of each policy, taking turns, and as many lab runs (seeds); median held "
                                "to median [default: 1]")  # fmt: skip
    calibrate.add_argument("--upstream", default="embedded",
                           help="the real server: embedded, fast (the fast model), a URL")  # fmt: skip
    calibrate.add_argument("--pin-server", action="store_true", help=PIN_HELP)
    calibrate.add_argument("--oracle", action="store_true",
                           help="the oracle too (one request per pause, sent the moment typing stops), taking its "
                                "turn after the defaults [default: off]")  # fmt: skip
    calibrate.add_argument("--accuracy", type=SHARE, default=0.0,
                           help="the simulated model's (gemma is not a FIM model) [default: 0]")  # fmt: skip


def _calibrate(args: argparse.Namespace) -> None:
    try:
        events = list(limited(load_trace(args.trace), args.limit_events))
        spec = None if args.profile == MEASURE else profile(args.profile)
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))

    taken: list[ServerProfile] = []

    async def run() -> Calibration:
        async with upstream_for(args.upstream, args.pin_server) as (url, described):

            async def each_turn() -> ServerProfile:
                if not taken:  # the first: a server that cannot be profiled stops the run before it starts
                    taken.append(await measured_profile(url, described, args.upstream))
                else:  # a later one's ProfileError is `measure`'s to take
                    taken.append(await measure_server(url, described, print, shown_as=args.upstream))
                return taken[-1]

            return await measure(events, args.trace.name, url, described, args.max_tokens, args.accuracy, spec=spec,
                                 runs=args.runs, profile_turn=None if spec else each_turn,
                                 policies=POLICIES + ((ORACLE,) if args.oracle else ()))  # fmt: skip

    result = asyncio.run(run())
    write_report(args.out, "calibration", result, render)
    for turn, measured in enumerate(taken):
        keep_measured(args.out, measured, "profile.json" if turn == 0 else f"profile-{turn + 1}.json")


async def measured_profile(url: str, described: str, upstream: str) -> Profile:
    """The real server measured as `mellum-proxy profile` measures one (`--profile measure`)."""
    try:
        return await measure_server(url, described, print, shown_as=upstream)  # its source: `--upstream fast`
    except ProfileError as exc:
        fail(f"--profile measure: {exc}")


def keep_measured(out: Path, measured: ServerProfile, name: str = "profile.json") -> None:
    """A profile `--profile measure` took, kept beside the report as `profile.json` (a named one is not)."""
    if isinstance(measured, Profile):
        (out / name).write_bytes(measured.as_json())
        print(f"wrote {out / name}")


MEASURE = "measure"
POLICIES: tuple[Policy, ...] = (Policy("direct", None), Policy("defaults", {}))


async def measure(
    events: Sequence[Event], trace: str, url: str, described: str, max_tokens: int, accuracy: float,
    progress: Callable[[str], None] = print, spec: ServerProfile | None = None, runs: int = 1,
    profile_turn: Callable[[], Awaitable[ServerProfile]] | None = None, policies: Sequence[Policy] = POLICIES,
) -> Calibration:  # fmt: skip
    """Each policy `runs` times on the real server (taking turns) and `runs` times in the lab (seeds 0.., each its
    own luck where the profile has a `spread`); per metric each side's runs and their median.

    `profile_turn`: the server measured afresh before each turn, and lab run i on turn i's profile, so the lab's
    server moves with the machine as the real one does and its median is over as many profiles as the real median
    is over runs (one profile taken at a slow moment moved the lab's p95 by 15-20 %); else `spec` for every run."""
    specs: list[ServerProfile] = []
    real_runs: dict[str, list[dict[str, Any]]] = {policy.name: [] for policy in policies}
    for turn in range(runs):
        if profile_turn is not None:
            try:
                specs.append(await profile_turn())
            except ProfileError as exc:
                if not specs:
                    raise
                progress(
                    f"turn {turn + 1} could not be profiled ({exc}): its lab run takes the turn before's profile"
                )  # fmt: skip (the turns already run are kept)
                specs.append(specs[-1])
        for policy in policies:
            name = policy.name
            real = await run_policy(policy, list(events), url, max_tokens=max_tokens)
            progress(f"real {name} ({turn + 1}/{runs}): coverage {real.pause_coverage or 0:.0%}, "
                     f"p95 {real.latency_p95_ms or 0:.0f} ms, {real.upstream_requests} requests")  # fmt: skip
            real_runs[name].append({"pause_coverage": real.pause_coverage, "latency_p95_ms": real.latency_p95_ms,
                                    "peak_held": real.max_inflight, "upstream_requests": real.upstream_requests,
                                    "predicted_chars": real.predicted_chars,
                                    "decode_ms_per_token": real.decode_ms_per_token})  # fmt: skip
    specs = specs or [spec or profile("embedded-cpu")] * runs
    rows: list[CalibrationRow] = []
    for policy in policies:
        name = policy.name
        labs = [
            await asyncio.to_thread(
                run_lab,
                policy,
                events,
                specs[seed],
                trace,
                accuracy,
                max_tokens=max_tokens,
                seed=seed,
            )
            for seed in range(runs)
        ]  # fmt: skip (its own virtual-time loop; a seed is a run's luck)
        sims = [{key: getattr(lab, key) for key, _, _ in METRICS} for lab in labs]
        rows.append(CalibrationRow(policy=name, real=_medians(real_runs[name]), runs=real_runs[name],
                                   sim=_medians(sims), sim_runs=sims))  # fmt: skip
    turns = [_summary(s) for s in specs] if profile_turn is not None else []
    return Calibration(trace=trace, edits=sum(1 for e in events if hasattr(e, "offset")), upstream=described,
                       profile=repr(specs[0]), rows=rows, max_tokens=max_tokens, accuracy=accuracy,
                       turn_profiles=turns)  # fmt: skip


def _summary(spec: ServerProfile) -> dict[str, float]:
    """What a turn's profile said, in the figures that move from one profile to the next."""
    return {"idle_slowdown": spec.idle_slowdown, "decode_tps": spec.decode_tps, "prefill_tps": spec.prefill_tps,
            "spread": spec.spread, "overhead_ms": spec.overhead_ms}  # fmt: skip


def _medians(runs: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    return {key: _median([run[key] for run in runs]) for key, _, _ in METRICS}


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
