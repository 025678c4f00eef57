"""Property-based test of the policies together, over random arrival and disconnect schedules.

Invariants: never more than max_concurrency requests upstream at once; every request that stays
connected gets exactly one response; the newest request of a session is never debounced; nothing
(task, upstream stream, queue place, held request) is left behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.budget import BudgetSettings, CharsEstimator, ContextBudget
from proxy.completion import CompletionService, Policies
from proxy.models import Chunk, Completion, NormalizedRequest, Outcome
from proxy.policies import AdmissionQueue, Debouncer, Supersede
from proxy.telemetry import RecentRecords, Telemetry


class MemoryUpstream:
    """Streams `tokens` chunks 1 ms apart and counts streams open at once."""

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.opened = 0
        self.closed = 0

    async def stream_completion(self, payload: dict[str, Any]) -> AsyncIterator[Chunk]:
        self.opened += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for _ in range(payload.get("max_tokens") or 3):
                await asyncio.sleep(0.001)
                yield Chunk(text="x")
            yield Chunk(text="", finish_reason="length")
        finally:
            self.active -= 1
            self.closed += 1


@dataclass
class CountingWriter:
    answers: list[Outcome | str] = field(default_factory=list)

    async def send_chunk(self, completion: Completion, chunk: Chunk) -> None:
        return None

    async def finish(self, completion: Completion, outcome: Outcome) -> Any:
        self.answers.append(outcome)

    async def fail(self, error: Exception) -> Any:
        self.answers.append(f"error: {error}")


arrival = st.tuples(
    st.integers(0, 15),  # ms after the previous arrival
    st.sampled_from("abc"),  # session
    st.one_of(st.none(), st.integers(0, 30)),  # disconnect after this many ms, or never
    st.integers(1, 8),  # tokens
)


options = st.fixed_dictionaries(
    {
        "debounce_ms": st.sampled_from([0, 3, 10]),
        "max_inflight": st.integers(1, 2),
        "max_concurrency": st.integers(1, 3),
        "max_queue": st.integers(0, 3),
        "timeout_ms": st.sampled_from([0, 8, 40]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.lists(arrival, min_size=1, max_size=14), options=options)
def test_policy_invariants(schedule: list[tuple[int, str, int | None, int]], options: dict[str, int]) -> None:
    asyncio.run(_run(schedule, **options))


async def _run(
    schedule: list[tuple[int, str, int | None, int]],
    debounce_ms: int,
    max_inflight: int,
    max_concurrency: int,
    max_queue: int,
    timeout_ms: int,
) -> None:
    upstream = MemoryUpstream()
    policies = Policies(
        Debouncer(debounce_ms / 1000),
        Supersede(max_inflight),
        AdmissionQueue(max_concurrency, max_queue),
        timeout_ms=timeout_ms,
    )
    budget = ContextBudget(BudgetSettings(max_context_tokens=1 << 20, max_tokens=1 << 10), CharsEstimator())
    service = CompletionService(upstream, policies, budget, Telemetry(RecentRecords()))  # type: ignore[arg-type]
    writers: list[CountingWriter] = []
    tasks: list[asyncio.Task[Any]] = []
    disconnects: list[asyncio.TimerHandle] = []
    loop = asyncio.get_running_loop()
    for i, (gap_ms, session, leave_ms, tokens) in enumerate(schedule):
        await asyncio.sleep(gap_ms / 1000)
        request = NormalizedRequest(id=str(i), dialect="test", session=session, prefix="p", max_tokens=tokens)
        writer = CountingWriter()
        task = asyncio.create_task(service.complete(request, writer))
        writers.append(writer)
        tasks.append(task)
        if leave_ms is not None:
            disconnects.append(loop.call_later(leave_ms / 1000, task.cancel))
    async with asyncio.timeout(10):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for handle in disconnects:
        handle.cancel()

    assert upstream.max_active <= max_concurrency
    gone = [isinstance(result, asyncio.CancelledError) for result in results]
    for writer, was_gone in zip(writers, gone, strict=True):
        assert len(writer.answers) == (0 if was_gone else 1), writer.answers
    last_of_session = {session: i for i, (_, session, _, _) in enumerate(schedule)}
    for i in last_of_session.values():
        assert gone[i] or writers[i].answers != [Outcome.DEBOUNCED]
    assert upstream.active == 0 and upstream.opened == upstream.closed
    assert policies.admission.running == 0 and policies.admission.depth == 0
    assert policies.debouncer.held() == 0
    assert policies.supersede.sessions() == {}
