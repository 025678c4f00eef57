"""The relay: a request's own flight is sent to its client from the producer's turn, each batch before the next
is read, and what that send meets (a client gone) is the request's to answer, not the producer's."""

from __future__ import annotations

from collections.abc import Sequence

from mellum_proxy.budget import BudgetSettings, CharsEstimator, ContextBudget
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from mellum_proxy.policies import AdmissionQueue, Debouncer, Supersede
from mellum_proxy.serving import CompletionService, Policies
from mellum_proxy.telemetry import RecentRecords, Telemetry
from tests.fakes import RecordingAnswer
from tests.virtual_time import run_virtual


class BurstUpstream:
    """Three batches with no wait between them (a server whose tokens all came in one network read); notes what
    the client had been sent each time a batch was asked for."""

    def __init__(self) -> None:
        self.sent_before: list[str] = []
        self.answer: RecordingAnswer | None = None
        self.finished = False

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        for text in ("a", "b", "c"):
            assert self.answer is not None
            self.sent_before.append(self.answer.sent)
            yield [Chunk(text)]
        yield [Chunk("", finish_reason="stop")]
        self.finished = True


class GoneAnswer(RecordingAnswer):
    """A client that left: every write fails as aiohttp's does."""

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None:
        raise ConnectionResetError("Cannot write to closing transport")


def _service(upstream: BurstUpstream) -> tuple[CompletionService, RecentRecords]:
    policies = Policies(Debouncer(0), Supersede(1), AdmissionQueue(1, 0))
    budget = ContextBudget(BudgetSettings(max_context_tokens=4096, max_tokens=64), CharsEstimator())
    records = RecentRecords()
    return CompletionService(upstream, policies, budget, Telemetry(records)), records


REQUEST = NormalizedRequest(id="1", route="test", session="s", prefix="p", suffix="s", max_tokens=8)


def test_each_batch_reaches_the_client_before_the_next_is_read() -> None:
    async def run() -> list[str]:
        upstream = BurstUpstream()
        service, _ = _service(upstream)
        upstream.answer = answer = RecordingAnswer()
        await service.complete(REQUEST, answer)
        assert answer.calls == [("finish", Outcome.OK, "abc")]
        return upstream.sent_before

    assert run_virtual(run()) == ["", "a", "ab"]


def test_a_client_gone_during_a_send_from_the_producers_turn_is_recorded_as_gone() -> None:
    async def run() -> None:
        upstream = BurstUpstream()
        service, records = _service(upstream)
        upstream.answer = answer = GoneAnswer()
        try:
            await service.complete(REQUEST, answer)
        except ConnectionResetError:
            pass  # the edge ends a closed connection quietly
        else:
            raise AssertionError("the failed write was not raised in the request")
        await service.drain()
        assert [record.outcome for record in records] == [Outcome.CLIENT_GONE]
        assert answer.calls == []
        assert service.policies.admission.running == 0  # the slot came back

    run_virtual(run())
