"""The policy lab: the proxy's completion service, the simulated server and the editor in one event
loop, in virtual time (`looptime`), so `N policies x M traces` replay in seconds instead of hours.

Nothing is mocked inside the proxy: each run builds the real `CompletionService` with the real
policies from `Settings`, in front of `SimEngine` (llama.cpp's scheduling, see `bench.sim_engine`).
The editor is the same as in the real-time replay: one request per edit, the previous one cancelled
(`direct` sends them to the server itself). Only the HTTP hop is left out, and the time the proxy's
own code takes (tenths of a millisecond, `bench overhead`), which virtual time does not count.

What the model writes comes from the trace: with probability `accuracy` (a seeded draw per edit) the
completion is what the person really typed next, to the end of that line, else junk. That measures
typed-through reuse without a model, and `predicted_chars` — how many of the characters the person
typed next the shown suggestion had — for every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import looptime

from bench.editor import EditMark, RequestResult, account
from bench.sim_engine import SimEngine, SimProfile, SimRefused
from bench.trace import Documents, Edit, Event, next_typed
from proxy.assembly import budget_settings, build_policies
from proxy.budget import CharsEstimator, ContextBudget
from proxy.budget.templates import MELLUM, FimParts
from proxy.completion import CompletionService
from proxy.config import Settings
from proxy.errors import ProxyError, UpstreamStatusError
from proxy.models import BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from proxy.sections import sections
from proxy.telemetry import RecentRecords, Telemetry

JUNK = "\u00a4" * 1024
PREFIX_LINES, SUFFIX_LINES = 100, 30  # what the simulated plugin sends, as in bench/editor.py


@dataclass(frozen=True)
class LabPolicy:
    name: str
    settings: dict[str, Any] | None  # proxy settings; None: direct to the server
    plugin_cancel: bool = True


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

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt):
        text = prompt.prompt + (prompt.suffix or "")
        try:
            task = self.engine.submit(text, prompt.max_tokens, self.writer.text(self.edit_of[request.id], text))
        except SimRefused as exc:
            raise UpstreamStatusError(503, str(exc), "out_of_memory") from exc
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


@dataclass
class LabResult:
    policy: str
    trace: str
    profile: str
    accuracy: float
    edits: int
    pauses: int
    pause_coverage: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    upstream_requests: int
    requests_per_edit: float
    completion_tokens: int
    wasted_completion_tokens: int
    prompt_tokens_computed: int
    predicted_chars: int
    reused: int
    timeouts: int
    errors: int
    peak_held: int
    settings: dict[str, Any] | None = None
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("latencies_ms")
        return data


def _window(text: str, cursor: int) -> tuple[str, str]:
    prefix = "".join(text[:cursor].splitlines(keepends=True)[-PREFIX_LINES:])
    suffix = "".join(text[cursor:].splitlines(keepends=True)[:SUFFIX_LINES])
    return prefix, suffix


async def _replay(
    policy: LabPolicy, events: Sequence[Event], spec: SimProfile, writer: Writer, pause_ms: float, max_gap_ms: float,
    max_tokens: int,
) -> tuple[list[EditMark], list[RequestResult], SimEngine, dict[str, Any], RecentRecords | None]:  # fmt: skip
    loop = asyncio.get_running_loop()
    engine = SimEngine(spec)
    edit_of: dict[str, int] = {}
    source = EngineSource(engine, writer, edit_of)
    service = records = None
    if policy.settings is not None:
        tree = sections(Settings.model_validate(policy.settings))
        policies = build_policies(tree.policies, spec.slots)
        records = RecentRecords(size=1 << 20)
        budget = ContextBudget(budget_settings(tree.budget), CharsEstimator())
        service = CompletionService(source, policies, budget, Telemetry(records))
    results: list[RequestResult] = []
    marks: list[EditMark] = []
    open_task: asyncio.Task[None] | None = None
    tasks: set[asyncio.Task[None]] = set()
    start = loop.time()

    def now_ms() -> float:
        return (loop.time() - start) * 1000

    async def direct(result: RequestResult, prompt: str) -> None:
        try:
            task = engine.submit(prompt, max_tokens, writer.text(result.edit, prompt), stream=False)  # as the plugin
        except SimRefused as exc:
            result.error = str(exc)
            return
        source.tasks[str(result.edit)] = task
        try:
            await task.changes.wait_for(lambda: task.done, timeout_s=math.inf)
        except asyncio.CancelledError:
            task.leave()
            result.cancelled = True
            raise
        result.done_ms, result.text = now_ms(), "".join(task.pieces)
        result.completion_tokens, result.outcome = task.completion_tokens, f"lab-{result.edit}"

    async def proxied(result: RequestResult, request: NormalizedRequest) -> None:
        assert service is not None
        answer = CollectingAnswer()
        try:
            await service.complete(request, answer)
        except asyncio.CancelledError:
            result.cancelled = True
            raise
        result.done_ms, result.text, result.error = now_ms(), answer.text, answer.error
        result.status = 200 if answer.error is None else 502
        result.outcome = answer.source or (answer.outcome.value if answer.outcome else None)
        result.completion_tokens = 0

    documents = Documents()
    last_in: float | None = None
    at = 0.0
    for index, event in enumerate(events):
        if last_in is not None:
            at += min(event.t_ms - last_in, max_gap_ms)
        last_in = event.t_ms
        await asyncio.sleep(max(0.0, start + at / 1000 - loop.time()))
        documents.apply(event)
        if not isinstance(event, Edit):
            continue
        marks.append(EditMark(index, event.file, now_ms()))
        if policy.plugin_cancel and open_task is not None and not open_task.done():
            open_task.cancel()
        prefix, suffix = _window(documents.texts[event.file], documents.cursor[event.file])
        result = RequestResult(index, event.file, now_ms())
        results.append(result)
        if service is None:
            coro = direct(result, MELLUM.render(FimParts(prefix, suffix, event.file)))
        else:
            request = NormalizedRequest(
                id=str(index),
                dialect="lab",
                session="lab",
                prefix=prefix,
                suffix=suffix,
                max_tokens=max_tokens,
                file_path=event.file,
                params={"temperature": 0},
            )
            edit_of[request.id] = index
            coro = proxied(result, request)
        open_task = loop.create_task(coro)
        tasks.add(open_task)
        open_task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(list(tasks), timeout=30)
    if service is not None:
        await service.drain()
    await engine.idle()
    return marks, results, engine, source.tasks, records


def run_lab(
    policy: LabPolicy, events: Sequence[Event], spec: SimProfile, trace_name: str, accuracy: float = 0.3,
    pause_ms: float = 300, max_gap_ms: float = 2000, max_tokens: int = 16, seed: int = 0,
) -> LabResult:  # fmt: skip
    """One policy over one trace on one simulated server, in virtual time."""
    truth = next_typed(events)
    writer = Writer(truth, accuracy, seed)
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        marks, results, engine, tasks, records = runner.run(
            _replay(policy, events, spec, writer, pause_ms, max_gap_ms, max_tokens)
        )
    acct = account(marks, results, pause_ms, truth)
    shown_sources = {r.outcome for r in results if r.edit in acct.shown_edits}
    used_tokens = sum(task.completion_tokens for key, task in tasks.items() if f"lab-{key}" in shown_sources)
    outcomes = [r.outcome for r in records] if records is not None else []
    return LabResult(
        policy=policy.name, trace=trace_name, profile=spec.name, accuracy=accuracy, edits=acct.edits,
        pauses=acct.pauses, pause_coverage=acct.pause_coverage, latency_p50_ms=acct.latency(50),
        latency_p95_ms=acct.latency(95), upstream_requests=engine.requests,
        requests_per_edit=engine.requests / acct.edits if acct.edits else 0.0,
        completion_tokens=engine.tokens_predicted, wasted_completion_tokens=engine.tokens_predicted - used_tokens,
        prompt_tokens_computed=engine.prompt_tokens, predicted_chars=acct.predicted_chars,
        reused=sum(o == Outcome.REUSED for o in outcomes), timeouts=sum(o == Outcome.TIMEOUT for o in outcomes),
        errors=sum(1 for r in results if r.error), peak_held=engine.peak_held, settings=policy.settings,
        latencies_ms=acct.latencies_ms,
    )  # fmt: skip


def meets_targets(candidate: LabResult, direct: LabResult) -> dict[str, bool]:
    """The issue's bar for the defaults against `direct` on one trace."""
    cov, base = candidate.pause_coverage or 0.0, direct.pause_coverage or 0.0
    return {
        "coverage": cov >= base - 0.01,
        "p95": (candidate.latency_p95_ms or math.inf) <= (direct.latency_p95_ms or math.inf),
        "requests": candidate.upstream_requests * 3 <= direct.upstream_requests,
        "waste": candidate.wasted_completion_tokens * 5 <= direct.wasted_completion_tokens,
    }


def pareto(results: Sequence[LabResult]) -> list[LabResult]:
    """The results no other beats on all three: fewer requests per edit, more coverage, lower p95."""

    def key(r: LabResult) -> tuple[float, float, float]:
        return (r.requests_per_edit, -(r.pause_coverage or 0.0), r.latency_p95_ms or math.inf)

    front = []
    for r in results:
        a = key(r)
        if not any(all(x <= y for x, y in zip(key(o), a, strict=True)) and key(o) != a for o in results):
            front.append(r)
    return sorted(front, key=key)


def grid(base: dict[str, Any], axes: dict[str, Sequence[Any]]) -> list[LabPolicy]:
    """Every combination of `axes` over `base` settings, named by the values that vary."""
    combos: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        combos = [combo | {key: value} for combo in combos for value in values]
    return [LabPolicy(",".join(f"{k}={v}" for k, v in combo.items()) or "defaults", base | combo) for combo in combos]


ProgressFn = Callable[[str], None]
