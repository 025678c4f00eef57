"""`CompletionService`: one completion from a normalized request to its `Answer`, with its record.

The steps, in order: debounce -> comment/string skip -> supersede (per-session admission) ->
deadline -> context budget -> global admission queue -> upstream stream -> answer. Telemetry
observes; the record is closed in `finally`. A request that a policy drops is answered with an
empty (or partial) completion and its outcome, never with an error. This module knows no HTTP:
the edge (`proxy.http`) adapts the `Answer` protocol to a response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from proxy.budget import ContextBudget, cursor_in_comment_or_string
from proxy.clock import LOOP_CLOCK, Clock
from proxy.errors import ProxyError
from proxy.models import Answer, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from proxy.policies import AdmissionQueue, Deadline, Debouncer, QueueFullError, Supersede, Ticket
from proxy.telemetry import RequestRecord, Telemetry


class CompletionSource(Protocol):
    """The one thing the service needs from a model server (`UpstreamClient` in production).

    It yields the completion in batches: the chunks that arrived together (one network read).
    """

    def stream_completion(
        self, request: NormalizedRequest, prompt: BudgetedPrompt
    ) -> AsyncIterator[Sequence[Chunk]]: ...


@dataclass(slots=True)
class Policies:
    """The policy objects one proxy shares between all its requests."""

    debouncer: Debouncer
    supersede: Supersede
    admission: AdmissionQueue
    ttft_timeout_ms: int = 0
    timeout_ms: int = 0
    complete_in_comments: bool = True
    clock: Clock = field(default=LOOP_CLOCK)


class CompletionService:
    """Serves completions against one upstream under the policies, and records each request."""

    def __init__(
        self, upstream: CompletionSource, policies: Policies, budget: ContextBudget, telemetry: Telemetry
    ) -> None:
        self.upstream = upstream
        self.policies = policies
        self.budget = budget
        self.telemetry = telemetry
        self.clock = policies.clock

    async def complete(self, request: NormalizedRequest, answer: Answer) -> None:
        """Answer `request`; a `ProxyError` becomes `answer.fail`, never a raise."""
        record = self.telemetry.start(request)
        record.queue_depth = self.policies.admission.depth
        record.inflight = self.policies.admission.running
        completion = Completion(id=f"cmpl-{request.id}")
        try:
            outcome = await self._run(request, answer, completion, record)
            record.outcome = outcome
            await answer.finish(completion, outcome)
        except ProxyError as error:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.upstream_status = error.status
            await answer.fail(error)
        except (asyncio.CancelledError, ConnectionResetError):
            record.outcome = Outcome.CLIENT_GONE  # the editor went away: the upstream stream is closed
            raise
        finally:
            self.telemetry.finish(record, completion)

    async def _warm_up(
        self, request: NormalizedRequest, answer: Answer, completion: Completion, record: RequestRecord
    ) -> Outcome:
        """Cache-warming requests (`n_predict: 0`) run only on a slot that is free right now.

        They are never queued, debounced or allowed to supersede: a warm-up that waits would delay the
        completions the user is waiting for, and it is stale by the time a slot frees up.
        """
        prompt = await self.budget.apply(request)
        if not self.policies.admission.has_free_slot():
            return Outcome.SKIPPED
        async with self.policies.admission.slot():
            await self._stream(request, prompt, answer, completion, record, None, None)
        return Outcome.OK

    async def _run(
        self, request: NormalizedRequest, answer: Answer, completion: Completion, record: RequestRecord
    ) -> Outcome:
        policies, clock = self.policies, self.clock
        if request.warm_up:
            return await self._warm_up(request, answer, completion, record)
        if policies.debouncer.window_s > 0:
            held_from = clock.now()
            go_on = await policies.debouncer.hold(request.session)
            record.debounce_ms = (clock.now() - held_from) * 1000
            if not go_on:
                return Outcome.DEBOUNCED
        else:  # no window: nothing is held, and the clock (a system call on some machines) is not read
            await policies.debouncer.hold(request.session)
            record.debounce_ms = 0.0
        if not policies.complete_in_comments and request.suffix is not None:
            inside = cursor_in_comment_or_string(request.prefix, request.suffix, request.file_path, request.language)
            if inside:
                return Outcome.SKIPPED
        with policies.supersede.admit(request.session) as ticket:
            deadline = Deadline.start(clock, policies.ttft_timeout_ms, policies.timeout_ms)
            ticket.scope.deadline = deadline.first_token
            with ticket.scope:
                prompt = await self.budget.apply(request)
                record.prompt_tokens_before = prompt.tokens_before
                record.prompt_tokens_after = prompt.tokens_after
                record.truncated = completion.truncated = prompt.truncated
                record.tokenizer = prompt.method
                waits = not policies.admission.has_free_slot()  # else the slot is taken without a wait
                queued_from = clock.now() if waits else 0.0
                try:
                    async with policies.admission.slot(ticket.scope):
                        record.queue_ms = (clock.now() - queued_from) * 1000 if waits else 0.0
                        ticket.running = True
                        await self._stream(request, prompt, answer, completion, record, ticket, deadline)
                except QueueFullError:
                    return Outcome.QUEUE_FULL
            if ticket.scope.cancelled_caught:
                return Outcome.CANCELLED if ticket.superseded else Outcome.TIMEOUT
        return Outcome.OK

    async def _stream(
        self,
        request: NormalizedRequest,
        prompt: BudgetedPrompt,
        answer: Answer,
        completion: Completion,
        record: RequestRecord,
        ticket: Ticket | None,
        deadline: Deadline | None,
    ) -> None:
        record.reached_upstream = True
        async with aclosing(self.upstream.stream_completion(request, prompt)) as batches:
            async for batch in batches:
                has_text = False
                for chunk in batch:
                    completion.add(chunk)
                    has_text = has_text or chunk.has_text
                if has_text and record.ttft_ms is None:
                    self.telemetry.first_token(record)
                    if ticket is not None and deadline is not None:
                        ticket.scope.deadline = deadline.total  # the first-token deadline is met
                await answer.send(completion, batch)
        record.upstream_status = 200
        prompt_tokens = (completion.usage or {}).get("prompt_tokens")
        if isinstance(prompt_tokens, int):
            self.budget.observe(prompt.prompt, prompt_tokens)  # calibrates the `chars` estimate
