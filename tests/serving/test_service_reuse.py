"""The completion service with reuse, server-true admission and kept prefills, in virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mellum_proxy.budget import BudgetSettings, CharsEstimator, ContextBudget
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, NormalizedRequest, Outcome
from mellum_proxy.observe import Changes
from mellum_proxy.policies import AdmissionQueue, Debouncer, Supersede
from mellum_proxy.serving import CompletionService, Policies
from mellum_proxy.serving.reuse import ReuseCache
from mellum_proxy.telemetry import RecentRecords, Telemetry
from tests.fakes import RecordingAnswer
from tests.virtual_time import run_virtual

TEXT = "compute(1)\n"


class TextUpstream:
    """Writes TEXT a character every 10 ms after a 100 ms prefill; `held` is what it still works on."""

    def __init__(self, prefill_s: float = 0.1) -> None:
        self.prefill_s = prefill_s
        self.opened = 0
        self.held = 0
        self.let_go_asked = 0
        self.changes = Changes()

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        self.opened += 1
        self.held += 1
        try:
            await asyncio.sleep(self.prefill_s)
            for char in TEXT:
                await asyncio.sleep(0.01)
                yield [Chunk(char)]
            yield [Chunk("", finish_reason="stop")]
        finally:
            asyncio.get_running_loop().call_later(self.prefill_s, self._free)  # the server lets go later

    def _free(self) -> None:
        self.held -= 1
        self.changes.notify()

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        self.let_go_asked += 1
        await self.changes.wait_for(lambda: accept(self.held), timeout_s)
        return True


def _service(upstream: TextUpstream, **options: object) -> CompletionService:
    policies = Policies(Debouncer(0), Supersede(1), AdmissionQueue(1, 4), reuse=ReuseCache(), **options)  # type: ignore[arg-type]
    budget = ContextBudget(BudgetSettings(max_context_tokens=4096, max_tokens=64), CharsEstimator())
    return CompletionService(upstream, policies, budget, Telemetry(RecentRecords()))


def _request(i: int, prefix: str) -> NormalizedRequest:
    return NormalizedRequest(id=str(i), route="test", session="s", prefix=prefix, suffix="\n", max_tokens=32,
                             file_path="a.py")  # fmt: skip


def test_typing_through_a_finished_completion_is_answered_from_it() -> None:
    async def run() -> None:
        upstream = TextUpstream()
        service = _service(upstream)
        first = RecordingAnswer()
        await service.complete(_request(0, "x = "), first)
        assert first.calls == [("finish", Outcome.OK, TEXT)]
        for i, typed in enumerate(["c", "com", "co", ""], 1):  # typing, a backspace, back at the start
            answer = RecordingAnswer()
            await service.complete(_request(i, "x = " + typed), answer)
            assert answer.calls == [("finish", Outcome.REUSED, TEXT[len(typed) :])]
            assert answer.sent == TEXT[len(typed) :]
        other = RecordingAnswer()
        await service.complete(_request(9, "x = q"), other)  # typed something else: a new completion
        assert other.calls[0][1] is Outcome.OK
        assert upstream.opened == 2
        outcomes = [r.outcome for r in service.telemetry.records]
        assert outcomes == ["ok", "reused", "reused", "reused", "reused", "ok"]
        assert not any(r.reached_upstream for r in list(service.telemetry.records)[1:5])

    run_virtual(run())


def test_a_newer_keystroke_takes_over_the_stream_it_types_through() -> None:
    async def run() -> None:
        upstream = TextUpstream()
        service = _service(upstream)
        first, second = RecordingAnswer(), RecordingAnswer()
        a = asyncio.create_task(service.complete(_request(0, "x = "), first))
        await asyncio.sleep(0.13)  # three characters have arrived
        a.cancel()  # the plugin cancels its request as the person types on
        b = asyncio.create_task(service.complete(_request(1, "x = co"), second))
        await asyncio.gather(a, b, return_exceptions=True)
        assert second.calls == [("finish", Outcome.REUSED, TEXT[2:])]
        assert upstream.opened == 1  # the stream went on for the newer keystroke

    run_virtual(run())


def test_a_cancelled_request_keeps_its_slot_until_the_server_lets_it_go() -> None:
    async def run() -> None:
        upstream = TextUpstream()
        service = _service(upstream)
        admission = service.policies.admission
        a = asyncio.create_task(service.complete(_request(0, "a = "), RecordingAnswer()))
        await asyncio.sleep(0.05)  # in prefill
        a.cancel()
        await asyncio.gather(a, return_exceptions=True)
        assert admission.running == 1 and upstream.held == 1  # the server is still on it
        await admission.changes.wait_for(lambda: admission.running == 0)
        assert upstream.held == 0 and upstream.let_go_asked == 1
        await service.drain()

    run_virtual(run())


def test_a_timed_out_request_finishes_its_prefill_only_while_no_one_waits() -> None:
    async def run() -> None:
        upstream = TextUpstream(prefill_s=0.5)
        service = _service(upstream, ttft_timeout_s=0.1, keep_prefill=True)
        answer = RecordingAnswer()
        await service.complete(_request(0, "a = "), answer)
        assert answer.calls[0][1] is Outcome.TIMEOUT
        flight = next(iter(service.policies.reuse._sessions["s"])).flight  # type: ignore[union-attr]
        await service.drain()
        assert flight.first_text_at is not None  # it ran to its first token: the prompt is cached
        assert len(flight.completion.text) == 1  # and stopped there

    run_virtual(run())


def test_an_answer_is_cut_at_the_cap_even_when_one_read_brings_many_chunks() -> None:
    from mellum_proxy.serving.flight import MAX_FLIGHT_BYTES

    class Flood:
        """A server that ignores max_tokens and sends 20 chunks of 64 KiB in each network read."""

        async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
            while True:
                await asyncio.sleep(0.001)
                yield [Chunk("x" * 65536) for _ in range(20)]

    async def run() -> None:
        policies = Policies(Debouncer(0), Supersede(1), AdmissionQueue(1, 4))
        budget = ContextBudget(BudgetSettings(max_context_tokens=4096, max_tokens=64), CharsEstimator())
        service = CompletionService(Flood(), policies, budget, Telemetry(RecentRecords()))
        answer = RecordingAnswer()
        await service.complete(_request(0, "x = "), answer)
        (call,) = answer.calls
        assert call[0] == "finish" and 0 < len(call[2]) <= MAX_FLIGHT_BYTES  # before: one whole read over it

    run_virtual(run())
