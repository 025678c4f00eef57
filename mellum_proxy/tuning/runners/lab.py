"""The policy lab: the proxy's completion service, the simulated server and the editor in one event
loop, in virtual time (`looptime`), so `N policies x M traces` replay in seconds instead of hours.

Nothing is mocked inside the proxy: each run builds the real `CompletionService` with the real
policies from `Settings`, in front of `SimEngine` (llama.cpp's scheduling, see `mellum_proxy.tuning.sim.engine`).
The editor is the same as in the real-time replay: one request per edit, the previous one cancelled
(`direct` sends them to the server itself). Only the HTTP hop is left out, and the time the proxy's
own code takes (tenths of a millisecond, `benchmarks overhead`), which virtual time does not count.

What the model writes comes from the trace: with probability `accuracy` (a seeded draw per edit) the
completion is what the person really typed next, to the end of that line, else junk. That measures
typed-through reuse without a model, and `predicted_chars` — how many of the characters the person
typed next the shown suggestion had — for every run.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mellum_proxy.assembly import build_service
from mellum_proxy.budget import CharsEstimator
from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, SHARE, command, fail
from mellum_proxy.models import Outcome
from mellum_proxy.sections import sections
from mellum_proxy.telemetry import RecentRecords, Telemetry
from mellum_proxy.tuning.reporting import lab_report
from mellum_proxy.tuning.reporting.capacity_report import plot_capacity
from mellum_proxy.tuning.reporting.lab_report import Lab
from mellum_proxy.tuning.reporting.results import LabResult, Seen, ms_per_token
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.runners.lab_parts import EngineSource, LabEditor, Writer
from mellum_proxy.tuning.runners.playback import METRICS_PERIOD_S, Clock, gaps_after, pause_starts, play
from mellum_proxy.tuning.runners.policy import Policy, parse_policy
from mellum_proxy.tuning.sim.engine import SimEngine
from mellum_proxy.tuning.sim.server import profile
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.corpus import CODE_DIR, shipped_traces
from mellum_proxy.tuning.workloads.editor import EditMark, RequestResult, account
from mellum_proxy.tuning.workloads.synth import TYPISTS, synthesize
from mellum_proxy.tuning.workloads.trace import Event, Trace, TraceError, limited, next_typed

SYNTH_SOURCE = CODE_DIR / "inventory.py"
DEFAULT_PROFILES = ("embedded-cpu", "gpu", "h100", "mac-m4", "laptop-m3")
MAX_GAP_MS = 2000  # gaps longer than this are played as this (a pause stays a pause)
GRID_AXES: dict[str, Sequence[Any]] = {
    "hold_busy_max_ms": (0, 75, 150, 300),
    "hold_idle_max_ms": (0, 50),
    "hold_min_ms": (0, 2, 10),
    "reuse": (True, False),
}
FIXED = (0, 150, 300)  # debounce_ms of the fixed rule, for comparison
ORACLE = Policy("oracle", None, oracle=True)  # the yardstick: one request per pause, the moment typing stops


def add_commands(commands: Any) -> None:
    about = "policies x traces x servers in virtual time: targets, grid and frontier"
    lab = command(commands, "lab", about, _lab, out="lab")
    lab.add_argument("traces", nargs="*", type=Path,
                     help="traces [default: the two shipped ones and three synthetic typists]")  # fmt: skip
    lab.add_argument("--profile", action="append", help=f"sim profile(s) [default: {', '.join(DEFAULT_PROFILES)}]")
    lab.add_argument("--policy", action="append", help="NAME[:key=value,...] [default: direct and defaults]")
    lab.add_argument("--grid", action="store_true", help="also search the adaptive-dispatch settings")
    lab.add_argument("--accuracy", type=SHARE, default=0.3,
                     help="share of completions that are what the person typed next [default: 0.3]")  # fmt: skip
    lab.add_argument("--limit-events", type=POSITIVE, default=1500, help="edits per trace [default: 1500]")
    lab.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    lab.add_argument("--developers", metavar="N[,N...]",
                     help="also: how many developers one server carries, trying these counts (capacity)")  # fmt: skip
    lab.add_argument("--chat-share", type=SHARE, default=0.0,
                     help="with --developers: the share of them that also chat [default: 0]")  # fmt: skip


def _lab(args: argparse.Namespace) -> None:
    from mellum_proxy.tuning.runners import capacity

    try:
        counts = capacity.parse_developers(args.developers) if args.developers else None
        result = measure(args.traces, args.profile, args.policy, args.grid, args.accuracy, args.limit_events,
                         args.max_tokens, progress=print, developers=counts, chat_share=args.chat_share)  # fmt: skip
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    write_report(args.out, "lab", result, lab_report.render)
    lab_report.plot(result, args.out / "frontier.png")
    print(f"wrote {args.out}/frontier.png")
    if counts:
        plot_capacity(result, args.out / "capacity.png")
        print(f"wrote {args.out}/capacity.png")


def measure(
    trace_paths: Sequence[Path], profiles: Sequence[str] | None, policy_texts: Sequence[str] | None, with_grid: bool,
    accuracy: float, limit_events: int, max_tokens: int, progress: Callable[[str], None] = print,
    developers: Sequence[int] | None = None, chat_share: float = 0.0,
) -> Lab:  # fmt: skip
    """Every policy over every trace on every profile; the result `lab_report.render` shows. `developers`: also
    the capacity (`mellum_proxy.tuning.runners.capacity`) at these counts."""
    specs = [profile(name) for name in profiles or DEFAULT_PROFILES]
    if trace_paths:
        traces = [(path.name, list(load_trace(path).events)) for path in trace_paths]
    else:
        traces = default_traces()
    traces = [(name, list(limited(Trace(events), limit_events))) for name, events in traces]
    policies = _policies(policy_texts, with_grid)
    runs: list[LabResult] = []
    for spec in specs:
        for name, events in traces:
            for policy in policies:
                runs.append(run_lab(policy, events, spec, name, accuracy, max_tokens=max_tokens))
            progress(f"{spec.name} / {name}: {len(policies)} policies")
    gaps = {name: list(gaps_after(events, MAX_GAP_MS).values()) for name, events in traces}
    result = lab_report.summarize(runs, specs, accuracy, max_tokens, limit_events, gaps)
    if developers:
        from mellum_proxy.tuning.runners import capacity

        team = capacity.measure([events for _, events in traces], specs, policies, developers, accuracy,
                                MAX_GAP_MS, max_tokens, progress, chat_share)  # fmt: skip
        result["capacity"], result["capacity_curve"] = team["capacity"], team["capacity_curve"]
        result["capacity_rule"] = team["capacity_rule"]
    return result


def default_traces() -> list[tuple[str, list[Event]]]:
    """The shipped traces, then the three synthetic typists typing `mellum_proxy/tuning/code/inventory.py`."""
    traces = [(path.name.removesuffix(".json.gz"), list(load_trace(path).events)) for path in shipped_traces()]
    source = SYNTH_SOURCE.read_text()
    traces += [(f"synth-{typist}", synthesize(source, SYNTH_SOURCE.name, 0, None, typist).events) for typist in TYPISTS]
    return traces


def _policies(texts: Sequence[str] | None, with_grid: bool) -> list[Policy]:
    chosen = (
        [parse_policy(text) for text in texts] if texts else [Policy("direct", None), ORACLE, Policy("defaults", {})]
    )
    if any(policy.plugin_debounce_ms for policy in chosen):
        raise ValueError("the lab does not simulate the plugin's own debounce (plugin_debounce_ms): use bench replay")
    if with_grid:
        chosen += grid({"dispatch": "adaptive"}, GRID_AXES)
        chosen += [Policy(f"fixed={ms}", {"dispatch": "fixed", "debounce_ms": ms}) for ms in FIXED]
    return chosen


async def _replay(
    policy: Policy,
    events: Sequence[Event],
    spec: ServerProfile,
    writer: Writer,
    max_gap_ms: float,
    max_tokens: int,
    pause_ms: float = 300,
) -> tuple[list[EditMark], list[RequestResult], SimEngine, dict[str, Any], RecentRecords | None]:
    engine = SimEngine(spec, seed=writer.seed)  # the server's luck and the model's, from one seed
    source = EngineSource(engine, writer, {})
    service = records = None
    if policy.settings is not None:
        records = RecentRecords(size=1 << 20)
        tree = sections(Settings.model_validate(policy.settings))
        service = build_service(tree, source, CharsEstimator(), Telemetry(records), spec.slots)
    clock = Clock()
    editor = LabEditor(policy, engine, source, service, clock, max_tokens)
    reader = asyncio.ensure_future(engine.read_metrics_every(METRICS_PERIOD_S))  # as `bench replay` reads a server
    marks = await play(
        events, max_gap_ms, editor, clock, only=pause_starts(events, max_gap_ms, pause_ms) if policy.oracle else None
    )
    if editor.tasks:
        await asyncio.wait(list(editor.tasks), timeout=30)
    if service is not None:
        await service.drain()
    await engine.idle()
    reader.cancel()
    return marks, editor.results, engine, source.tasks, records


def run_lab(
    policy: Policy, events: Sequence[Event], spec: ServerProfile, trace_name: str, accuracy: float = 0.3,
    pause_ms: float = 300, max_gap_ms: float = MAX_GAP_MS, max_tokens: int = 16, seed: int = 0,
) -> LabResult:  # fmt: skip
    """One policy over one trace on one simulated server, in virtual time."""
    import looptime  # the bench extra's

    truth = next_typed(events)
    writer = Writer(truth, accuracy, seed)
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        marks, results, engine, tasks, records = runner.run(
            _replay(policy, events, spec, writer, max_gap_ms, max_tokens, pause_ms)
        )
    acct = account(marks, results, pause_ms, truth, last_look_ms=max_gap_ms)
    shown_sources = {r.outcome for r in results if r.edit in acct.shown_edits}
    used_tokens = sum(task.completion_tokens for key, task in tasks.items() if f"lab-{key}" in shown_sources)
    outcomes = [r.outcome for r in records] if records is not None else []
    return LabResult(
        policy=policy.name, **Seen.of(acct), trace=trace_name, profile=spec.name, accuracy=accuracy,
        upstream_requests=engine.requests, requests_per_edit=engine.requests / acct.edits if acct.edits else 0.0,
        completion_tokens=engine.tokens_predicted, wasted_completion_tokens=engine.tokens_predicted - used_tokens,
        prompt_tokens_computed=engine.prompt_tokens,
        reused=sum(o == Outcome.REUSED for o in outcomes), timeouts=sum(o == Outcome.TIMEOUT for o in outcomes),
        errors=sum(1 for r in results if r.error), peak_held=engine.peak_held, settings=policy.settings,
        decode_ms_per_token=ms_per_token(engine.decode_seconds, engine.tokens_predicted),
    )  # fmt: skip


def grid(base: dict[str, Any], axes: dict[str, Sequence[Any]]) -> list[Policy]:
    """Every combination of `axes` over `base` settings, named by the values that vary."""
    combos: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        combos = [combo | {key: value} for combo in combos for value in values]
    return [Policy(",".join(f"{k}={v}" for k, v in combo.items()) or "defaults", base | combo) for combo in combos]
