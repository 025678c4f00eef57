"""`CompletionService`: one completion from a normalized request to the writer, with its record.

The steps, in order: debounce -> supersede (per-session admission) -> deadline -> global admission
queue -> upstream stream -> dialect writer. Telemetry observes; the record is closed in `finally`.
A request that a policy drops is answered with an empty (or partial) completion and its outcome,
never with an error.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass

import anyio
from aiohttp import web

from proxy.budget import BudgetedPrompt, ContextBudget, cursor_in_comment_or_string
from proxy.dialects.base import ResponseWriter
from proxy.errors import ProxyError
from proxy.models import Completion, NormalizedRequest, Outcome
from proxy.policies import AdmissionQueue, Deadline, Debouncer, QueueFullError, Supersede, Ticket
from proxy.telemetry import RequestRecord, Telemetry
from proxy.upstream import UpstreamClient, completion_payload


@dataclass(slots=True)
class Policies:
    """The policy objects one proxy shares between all its requests."""

    debouncer: Debouncer
    supersede: Supersede
    admission: AdmissionQueue
    ttft_timeout_ms: int = 0
    timeout_ms: int = 0
    complete_in_comments: bool = True


class CompletionService:
    """Serves completions against one upstream under the policies, and records each request."""

    def __init__(
        self, upstream: UpstreamClient, policies: Policies, budget: ContextBudget, telemetry: Telemetry
    ) -> None:
        self.upstream = upstream
        self.policies = policies
        self.budget = budget
        self.telemetry = telemetry

    async def complete(self, request: NormalizedRequest, writer: ResponseWriter) -> web.StreamResponse:
        """Answer `request` through `writer`; a `ProxyError` becomes `writer.fail`, never a raise."""
        record = self.telemetry.start(request)
        record.queue_depth = self.policies.admission.depth
        record.inflight = self.policies.admission.running
        completion = Completion(id=f"cmpl-{request.id}")
        try:
            outcome = await self._run(request, writer, completion, record)
            record.outcome = outcome
            return await writer.finish(completion, outcome)
        except ProxyError as error:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.upstream_status = error.status
            return await writer.fail(error)
        except (asyncio.CancelledError, ConnectionResetError):
            record.outcome = Outcome.CLIENT_GONE  # the editor went away: the upstream stream is closed
            raise
        finally:
            self.telemetry.finish(record, completion)

    def reject(self, request: NormalizedRequest, error: ProxyError) -> None:
        """Record a request the dialect could not parse (outcome `bad_request`)."""
        record = self.telemetry.start(request)
        record.outcome = Outcome.BAD_REQUEST
        record.upstream_status = error.status
        self.telemetry.finish(record, Completion(id=f"cmpl-{request.id}"))

    async def _warm_up(
        self, request: NormalizedRequest, writer: ResponseWriter, completion: Completion, record: RequestRecord
    ) -> Outcome:
        """Cache-warming requests (`n_predict: 0`) run only on a slot that is free right now.

        They are never queued, debounced or allowed to supersede: a warm-up that waits would delay the
        completions the user is waiting for, and it is stale by the time a slot frees up.
        """
        prompt = await self.budget.apply(request)
        if not self.policies.admission.has_free_slot():
            return Outcome.SKIPPED
        async with self.policies.admission.slot():
            await self._stream(request, prompt, writer, completion, record, None, None)
        return Outcome.OK

    async def _run(
        self,
        request: NormalizedRequest,
        writer: ResponseWriter,
        completion: Completion,
        record: RequestRecord,
    ) -> Outcome:
        policies = self.policies
        if request.warm_up:
            return await self._warm_up(request, writer, completion, record)
        held_from = anyio.current_time()
        go_on = await policies.debouncer.hold(request.session)
        record.debounce_ms = (anyio.current_time() - held_from) * 1000
        if not go_on:
            return Outcome.DEBOUNCED
        if not policies.complete_in_comments and request.suffix is not None:
            inside = cursor_in_comment_or_string(request.prefix, request.suffix, request.file_path, request.language)
            if inside:
                return Outcome.SKIPPED
        with policies.supersede.admit(request.session) as ticket:
            deadline = Deadline.start(policies.ttft_timeout_ms, policies.timeout_ms)
            ticket.scope.deadline = deadline.first_token
            with ticket.scope:
                prompt = await self.budget.apply(request)
                record.prompt_tokens_before = prompt.tokens_before
                record.prompt_tokens_after = prompt.tokens_after
                record.truncated = completion.truncated = prompt.truncated
                record.tokenizer = prompt.method
                queued_from = anyio.current_time()
                try:
                    async with policies.admission.slot(ticket.scope):
                        record.queue_ms = (anyio.current_time() - queued_from) * 1000
                        ticket.running = True
                        await self._stream(request, prompt, writer, completion, record, ticket, deadline)
                except QueueFullError:
                    return Outcome.QUEUE_FULL
            if ticket.scope.cancelled_caught:
                return Outcome.CANCELLED if ticket.superseded else Outcome.TIMEOUT
        return Outcome.OK

    async def _stream(
        self,
        request: NormalizedRequest,
        prompt: BudgetedPrompt,
        writer: ResponseWriter,
        completion: Completion,
        record: RequestRecord,
        ticket: Ticket | None,
        deadline: Deadline | None,
    ) -> None:
        record.reached_upstream = True
        async with aclosing(self.upstream.stream_completion(completion_payload(request, prompt))) as chunks:
            async for chunk in chunks:
                if chunk.text and record.ttft_ms is None:
                    record.mark_first_token()
                    if ticket is not None and deadline is not None:
                        ticket.scope.deadline = deadline.total  # the first-token deadline is met
                completion.add(chunk)
                await writer.send_chunk(completion, chunk)
        record.upstream_status = 200
        prompt_tokens = (completion.usage or {}).get("prompt_tokens")
        if isinstance(prompt_tokens, int):
            self.budget.observe(prompt.prompt, prompt_tokens)  # calibrates the `chars` estimate
