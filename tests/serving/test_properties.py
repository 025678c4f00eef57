"""Property-based test of the policies together, over random arrival and disconnect schedules,
in virtual time (each example costs no real time and does not depend on an idle machine).

Invariants: never more than max_concurrency requests upstream at once; every request that stays
connected gets exactly one answer, and that answer is right for its outcome (a whole completion for
`ok`, nothing for `debounced`/`queue_full`, a prefix of the completion for `cancelled`/`timeout`, for
`reused` exactly the earlier completion minus what was typed, never an error); outcomes only come from
policies that are switched on; the newest request of a session is never debounced or cancelled; nothing
(task, upstream stream, queue place, held request) is left behind. Each schedule runs with the fixed
or the adaptive hold, with and without typed-through reuse and kept prefills.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mellum_proxy.budget import BudgetSettings, CharsEstimator, ContextBudget
from mellum_proxy.models import NormalizedRequest, Outcome
from mellum_proxy.policies import AdmissionQueue, Debouncer, Dispatch, Supersede
from mellum_proxy.serving import CompletionService, Policies
from mellum_proxy.serving.reuse import ReuseCache
from mellum_proxy.telemetry import RecentRecords, Telemetry
from tests.fakes import MemoryUpstream, RecordingAnswer
from tests.virtual_time import run_virtual

arrival = st.tuples(
    st.integers(0, 15),  # ms after the previous arrival
    st.sampled_from("abc"),  # session
    st.one_of(st.none(), st.integers(0, 30)),  # disconnect after this many ms, or never
    st.integers(1, 8),  # tokens
    st.integers(0, 4),  # characters typed through ("x"s after the prefix "p")
)


options = st.fixed_dictionaries(
    {
        "debounce_ms": st.sampled_from([0, 3, 10]),
        "max_inflight": st.integers(1, 2),
        "max_concurrency": st.integers(1, 3),
        "max_queue": st.integers(0, 3),
        "timeout_ms": st.sampled_from([0, 8, 40]),
        "adaptive": st.booleans(),
        "reuse": st.booleans(),
        "keep_prefill": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.lists(arrival, min_size=1, max_size=14), options=options)
@example(  # found by this test: request 8 followed a completion it typed through, came to the hold after 9, newer,
    # of its session, and replaced it (9, the newest, was debounced)
    schedule=[(0, "a", None, 1, 0)] * 5 + [(3, "c", None, 1, 0), (7, "a", None, 1, 0), (3, "a", None, 1, 0),
                                           (0, "c", None, 1, 1), (1, "c", None, 1, 1)],
    options={"debounce_ms": 10, "max_inflight": 1, "max_concurrency": 1, "max_queue": 0, "timeout_ms": 0,
             "adaptive": False, "reuse": True, "keep_prefill": False},
)  # fmt: skip
@example(  # the same with no debounce: 8, admitted after 9, must not cancel it
    schedule=[(0, "a", None, 1, 0)] * 5 + [(3, "c", None, 1, 0), (7, "a", None, 1, 0), (3, "a", None, 1, 0),
                                           (0, "c", None, 1, 1), (1, "c", None, 1, 1)],
    options={"debounce_ms": 0, "max_inflight": 1, "max_concurrency": 1, "max_queue": 0, "timeout_ms": 0,
             "adaptive": False, "reuse": True, "keep_prefill": False},
)  # fmt: skip
@example(  # found by this test: the producer sent a request its whole text in its own turn after the request's
    # deadline had cut it (its relay was being cancelled): a timed-out answer must be a strict prefix
    schedule=[(0, "a", None, 1, 0)] * 7 + [(2, "a", None, 8, 0)],
    options={"debounce_ms": 0, "max_inflight": 1, "max_concurrency": 1, "max_queue": 0, "timeout_ms": 8,
             "adaptive": False, "reuse": False, "keep_prefill": False},
)  # fmt: skip
def test_policy_invariants(schedule: list[tuple[int, str, int | None, int, int]], options: dict[str, Any]) -> None:
    run_virtual(_run(schedule, **options))


async def _run(
    schedule: list[tuple[int, str, int | None, int, int]],
    debounce_ms: int,
    max_inflight: int,
    max_concurrency: int,
    max_queue: int,
    timeout_ms: int,
    adaptive: bool,
    reuse: bool,
    keep_prefill: bool,
) -> None:
    upstream = MemoryUpstream()
    dispatch = Dispatch(hold_busy_max_s=debounce_ms / 1000, hold_min_s=debounce_ms / 3000) if adaptive else None
    policies = Policies(
        Debouncer(0 if adaptive else debounce_ms / 1000),
        Supersede(max_inflight),
        AdmissionQueue(max_concurrency, max_queue),
        timeout_s=timeout_ms / 1000 or None,
        ttft_timeout_s=timeout_ms // 2 / 1000 or None,
        hold=dispatch,
        reuse=ReuseCache() if reuse else None,
        keep_prefill=keep_prefill,
    )
    budget = ContextBudget(BudgetSettings(max_context_tokens=1 << 20, max_tokens=1 << 10), CharsEstimator())
    service = CompletionService(upstream, policies, budget, Telemetry(RecentRecords()))
    answers: list[RecordingAnswer] = []
    tasks: list[asyncio.Task[Any]] = []
    disconnects: list[asyncio.TimerHandle] = []
    loop = asyncio.get_running_loop()
    for i, (gap_ms, session, leave_ms, tokens, typed) in enumerate(schedule):
        await asyncio.sleep(gap_ms / 1000)  # the arrival schedule, in virtual time
        request = NormalizedRequest(id=str(i), route="test", session=session, prefix="p" + "x" * typed,
                                    suffix="s", max_tokens=tokens)  # fmt: skip
        answer = RecordingAnswer()
        tasks.append(asyncio.create_task(service.complete(request, answer)))
        answers.append(answer)
        if leave_ms is not None:
            disconnects.append(loop.call_later(leave_ms / 1000, tasks[-1].cancel))
    async with asyncio.timeout(10):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for handle in disconnects:
        handle.cancel()
    await service.drain()  # upstream requests that outlive their client: kept prefills, awaited let-go

    assert upstream.max_active <= max_concurrency
    gone = [isinstance(result, asyncio.CancelledError) for result in results]
    last_of_session = {session: i for i, (_, session, _, _, _) in enumerate(schedule)}
    for i, (answer, was_gone) in enumerate(zip(answers, gone, strict=True)):
        if was_gone:
            assert answer.calls == []
            continue
        assert len(answer.calls) == 1, answer.calls
        kind, outcome, text = answer.calls[0]
        full = "x" * schedule[i][3]
        assert kind == "finish", answer.calls  # policies never turn into errors
        assert text == answer.sent  # the answer holds exactly what was streamed
        if outcome is Outcome.OK:
            assert text == full
        elif outcome in (Outcome.DEBOUNCED, Outcome.QUEUE_FULL):
            assert text == ""
        elif outcome in (Outcome.CANCELLED, Outcome.TIMEOUT):
            assert (full.startswith(text) and text != full) or reuse  # a request following a stream: its rest
            assert set(text) <= {"x"}
        elif outcome is Outcome.REUSED:
            assert reuse and text and set(text) == {"x"}  # the rest of an earlier completion of all "x"
        else:
            raise AssertionError(f"unexpected outcome {outcome}")
        assert outcome is not Outcome.DEBOUNCED or debounce_ms > 0
        assert outcome is not Outcome.TIMEOUT or timeout_ms > 0
        assert outcome is not Outcome.QUEUE_FULL or max_queue < len(schedule)
        if i == last_of_session[schedule[i][1]]:
            assert outcome not in (Outcome.DEBOUNCED, Outcome.CANCELLED), (i, outcome)
    assert upstream.active == 0 and upstream.opened == upstream.closed
    assert policies.admission.running == 0 and policies.admission.depth == 0
    assert policies.debouncer.held() == 0
    assert policies.supersede.sessions() == {}
