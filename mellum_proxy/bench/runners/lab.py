"""The policy lab: the proxy's completion service, the simulated server and the editor in one event
loop, in virtual time (`looptime`), so `N policies x M traces` replay in seconds instead of hours.

Nothing is mocked inside the proxy: each run builds the real `CompletionService` with the real
policies from `Settings`, in front of `SimEngine` (llama.cpp's scheduling, see `mellum_proxy.bench.doubles.sim_engine`).
The editor is the same as in the real-time replay: one request per edit, the previous one cancelled
(`direct` sends them to the server itself). Only the HTTP hop is left out, and the time the proxy's
own code takes (tenths of a millisecond, `bench overhead`), which virtual time does not count.

What the model writes comes from the trace: with probability `accuracy` (a seeded draw per edit) the
completion is what the person really typed next, to the end of that line, else junk. That measures
typed-through reuse without a model, and `predicted_chars` — how many of the characters the person
typed next the shown suggestion had — for every run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mellum_proxy.assembly import build_service
from mellum_proxy.bench.doubles.sim import profile
from mellum_proxy.bench.doubles.sim_engine import SimEngine, SimRefused
from mellum_proxy.bench.reporting import lab_report
from mellum_proxy.bench.reporting.results import LabResult, Seen
from mellum_proxy.bench.reporting.writing import command, write_report
from mellum_proxy.bench.runners.playback import Clock, gaps_after, pause_starts, play
from mellum_proxy.bench.runners.policy import Policy, parse_policy
from mellum_proxy.bench.workloads.convert import load_trace
from mellum_proxy.bench.workloads.corpus import CODE_DIR, shipped_traces
from mellum_proxy.bench.workloads.editor import EditMark, RequestResult, account, window
from mellum_proxy.bench.workloads.synth import TYPISTS, synthesize
from mellum_proxy.bench.workloads.trace import Event, Trace, TraceError, limited, next_typed
from mellum_proxy.budget import CharsEstimator
from mellum_proxy.budget.templates import MELLUM, FimParts
from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, SHARE, fail
from mellum_proxy.errors import ProxyError, UpstreamStatusError
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from mellum_proxy.planner.server_profile import ServerProfile
from mellum_proxy.sections import sections
from mellum_proxy.serving import CompletionService
from mellum_proxy.telemetry import RecentRecords, Telemetry

JUNK = "\u00a4" * 1024
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


def _lab(args: argparse.Namespace) -> None:
    try:
        result = measure(args.traces, args.profile, args.policy, args.grid, args.accuracy, args.limit_events,
                         args.max_tokens, progress=print)  # fmt: skip
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    write_report(args.out, "lab", result, lab_report.render)
    lab_report.plot(result, args.out / "frontier.png")
    print(f"wrote {args.out}/frontier.png")


def measure(
    trace_paths: Sequence[Path], profiles: Sequence[str] | None, policy_texts: Sequence[str] | None, with_grid: bool,
    accuracy: float, limit_events: int, max_tokens: int, progress: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Every policy over every trace on every profile; the result `lab_report.render` shows."""
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
    return lab_report.summarize(runs, specs, accuracy, max_tokens, limit_events, gaps)


def default_traces() -> list[tuple[str, list[Event]]]:
    """The shipped traces, then the three synthetic typists typing `mellum_proxy/bench/code/inventory.py`."""
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


class Writer:
    """What the simulated model writes for a request: the person's next line with probability `accuracy`."""

    def __init__(self, truth: dict[int, str], accuracy: float, seed: int = 0) -> None:
        self.truth = truth
        self.accuracy = accuracy
        self.seed = seed

    def text(self, edit: int, prompt: str) -> str:
        typed = self.truth.get(edit, "")
        draw = int(hashlib.sha256(f"{self.seed}:{edit}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if typed and draw < self.accuracy:
            line, newline, _ = typed.partition("\n")
            return line + newline if line or newline else typed
        return JUNK  # never what anyone types; as long as asked: the real model seldom stops early


class EngineSource:
    """The proxy's `CompletionSource` over the simulated server, with its exact `let_go`."""

    def __init__(self, engine: SimEngine, writer: Writer, edit_of: dict[str, int]) -> None:
        self.engine = engine
        self.writer = writer
        self.edit_of = edit_of  # request id -> edit index
        self.tasks: dict[str, Any] = {}

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        text = prompt.prompt + (prompt.suffix or "")
        try:
            task = self.engine.submit(text, prompt.max_tokens, self.writer.text(self.edit_of[request.id], text))
        except SimRefused as exc:  # llama.cpp's answer: the proxy fits the prompt again, harder, once
            raise UpstreamStatusError(400, str(exc), "exceed_context_size_error") from exc
        self.tasks[request.id] = task
        try:
            first = True
            async for pieces in task.stream():
                chunks = [Chunk(piece) for piece in pieces]
                if first:
                    chunks[0].upstream_id, first = f"lab-{request.id}", False
                yield chunks
            usage = {"prompt_tokens": task.prompt_tokens, "completion_tokens": task.completion_tokens}
            yield [Chunk("", finish_reason=task.finish_reason, usage=usage, upstream_id=f"lab-{request.id}")]
        finally:
            if not task.done:
                task.leave()

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        engine = self.engine
        try:
            await engine.changes.wait_for(lambda: accept(engine.held), timeout_s)
        except TimeoutError:
            return False
        return True


class CollectingAnswer:
    def __init__(self) -> None:
        self.text = ""
        self.outcome: Outcome | None = None
        self.source: str | None = None
        self.error: str | None = None

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None:
        return None

    async def finish(self, completion: Completion, outcome: Outcome) -> None:
        self.text, self.outcome, self.source = completion.text, outcome, completion.upstream_id

    async def fail(self, completion: Completion, error: ProxyError) -> None:
        self.error = str(error)


class LabEditor:
    """The simulated plugin in the lab: one request per edit, the previous one cancelled (if it cancels);
    `direct` sends the Mellum prompt to the engine itself, a policy hands the request to the service."""

    def __init__(self, policy: Policy, engine: SimEngine, source: EngineSource, service: CompletionService | None,
                 clock: Clock, max_tokens: int) -> None:  # fmt: skip
        self.policy, self.engine, self.source, self.service = policy, engine, source, service
        self.clock, self.max_tokens = clock, max_tokens
        self.results: list[RequestResult] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._open: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return sum(not task.done() for task in self.tasks)

    def typed_on(self) -> None:
        if self.policy.plugin_cancel and self._open is not None and not self._open.done():
            self._open.cancel()

    def on_edit(self, index: int, file: str, text: str, cursor: int) -> None:
        self.typed_on()
        prefix, suffix = window(text, cursor)
        result = RequestResult(index, file, self.clock.now_ms())
        self.results.append(result)
        if self.service is None:
            coro = self._direct(result, MELLUM.render(FimParts(prefix, suffix, file)))
        else:
            request = NormalizedRequest(id=str(index), dialect="lab", session="lab", prefix=prefix, suffix=suffix,
                                        max_tokens=self.max_tokens, file_path=file,
                                        params={"temperature": 0})  # fmt: skip
            self.source.edit_of[request.id] = index
            coro = self._proxied(result, request)
        self._open = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(self._open)
        self._open.add_done_callback(self.tasks.discard)

    async def _direct(self, result: RequestResult, prompt: str) -> None:
        writer = self.source.writer
        try:  # as the plugin sends it: not streamed; the oracle streams, so that its cancel stops the server
            task = self.engine.submit(prompt, self.max_tokens, writer.text(result.edit, prompt),
                                      stream=self.policy.oracle)  # fmt: skip
        except SimRefused as exc:
            result.error = str(exc)
            return
        self.source.tasks[str(result.edit)] = task
        try:
            await task.changes.wait_for(lambda: task.done, timeout_s=math.inf)
        except asyncio.CancelledError:
            task.leave()
            result.cancelled = True
            raise
        result.done_ms, result.text = self.clock.now_ms(), "".join(task.pieces)
        result.completion_tokens, result.outcome = task.completion_tokens, f"lab-{result.edit}"

    async def _proxied(self, result: RequestResult, request: NormalizedRequest) -> None:
        assert self.service is not None
        answer = CollectingAnswer()
        try:
            await self.service.complete(request, answer)
        except asyncio.CancelledError:
            result.cancelled = True
            raise
        result.done_ms, result.text, result.error = self.clock.now_ms(), answer.text, answer.error
        result.status = 200 if answer.error is None else 502
        result.outcome = answer.source or (answer.outcome.value if answer.outcome else None)
        result.completion_tokens = 0


async def _replay(
    policy: Policy,
    events: Sequence[Event],
    spec: ServerProfile,
    writer: Writer,
    max_gap_ms: float,
    max_tokens: int,
    pause_ms: float = 300,
) -> tuple[list[EditMark], list[RequestResult], SimEngine, dict[str, Any], RecentRecords | None]:
    engine = SimEngine(spec)
    source = EngineSource(engine, writer, {})
    service = records = None
    if policy.settings is not None:
        records = RecentRecords(size=1 << 20)
        tree = sections(Settings.model_validate(policy.settings))
        service = build_service(tree, source, CharsEstimator(), Telemetry(records), spec.slots)
    clock = Clock()
    editor = LabEditor(policy, engine, source, service, clock, max_tokens)
    marks = await play(
        events, max_gap_ms, editor, clock, only=pause_starts(events, max_gap_ms, pause_ms) if policy.oracle else None
    )
    if editor.tasks:
        await asyncio.wait(list(editor.tasks), timeout=30)
    if service is not None:
        await service.drain()
    await engine.idle()
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
    )  # fmt: skip


def grid(base: dict[str, Any], axes: dict[str, Sequence[Any]]) -> list[Policy]:
    """Every combination of `axes` over `base` settings, named by the values that vary."""
    combos: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        combos = [combo | {key: value} for combo in combos for value in values]
    return [Policy(",".join(f"{k}={v}" for k, v in combo.items()) or "defaults", base | combo) for combo in combos]
