"""`CompletionService`: one completion from a normalized request to its `Answer`, with its record.

The steps, in order: typed-through reuse -> dispatch hold -> comment/string skip -> supersede
(per-session admission) -> deadline -> context budget -> global admission queue -> upstream stream
-> answer. Telemetry observes; the record is closed in `finally`. A request that a policy drops is
answered with an empty (or partial) completion and its outcome, never with an error. This module
knows no HTTP: the edge (`proxy.http`) adapts the `Answer` protocol to a response.

Each upstream request streams in a task of its own (a `Flight`) that holds its admission slot, so
that it can outlive the client request that started it:
- a newer keystroke that types through it follows it instead of cancelling it (reuse);
- a cancelled one keeps its slot until the server has really let it go (server-true admission:
  llama.cpp finishes a prefill it has started, and keeps a queued task until it would start);
- one past its first-token deadline is answered at once, but may finish its prefill while no one
  waits for the slot, so the next keystroke finds a warm prompt cache (`keep_prefill`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from proxy.budget import ContextBudget, cursor_in_comment_or_string
from proxy.clock import LOOP_CLOCK, Clock
from proxy.errors import ProxyError, UpstreamStatusError
from proxy.models import Answer, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from proxy.observe import Changes
from proxy.policies import AdmissionQueue, Deadline, Debouncer, Dispatch, Lease, QueueFullError, Supersede, Ticket
from proxy.policies.lines import LineGate
from proxy.policies.reuse import Flight, Hit, ReuseCache, rest_end
from proxy.telemetry import RequestRecord, Telemetry
from proxy.upstream.errors import context_overflow

log = logging.getLogger("mellum_proxy")

MAX_FLIGHT_BYTES = 1 << 20  # an upstream answer larger than this (128 tokens are ~1 KB) is cut
CLOSE_ANSWER_S = 1.0  # at shutdown, for the requests cut at the end of the grace to write their last event
KEEP_PREFILL_MAX_S = 2.0  # the longest a timed-out request may go on to finish its prefill
TAKEOVER_GRACE_S = 0.05  # how long an abandoned stream waits for a newer keystroke to take it over
LET_GO_TIMEOUT_S = 10.0  # the longest a cancelled request keeps its slot waiting for the server
TTFT_WEIGHT = 0.2  # of the newest first-token time, in the running estimate of the server's prefill


class CompletionSource(Protocol):
    """The one thing the service needs from a model server (`UpstreamClient` in production).

    It yields the completion in batches: the chunks that arrived together (one network read). A
    source may also offer `let_go(accept, timeout_s) -> bool`: wait until `accept(requests the server
    holds)` is true, True if the server said so (False: it cannot tell).
    """

    def stream_completion(
        self, request: NormalizedRequest, prompt: BudgetedPrompt
    ) -> AsyncGenerator[Sequence[Chunk], None]: ...


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
    dispatch: Dispatch | None = None  # None: the debouncer's fixed window
    reuse: ReuseCache | None = None
    keep_prefill: bool = False


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
        self.prefill_s: float | None = None  # running estimate of the time to first token
        self.sent_upstream = 0  # upstream requests sent and not yet let go by the server
        self._flights: set[asyncio.Task[None]] = set()
        self._open: set[anyio.CancelScope] = set()  # the requests being served
        self._idle = Changes()  # notified when the last one ends

    async def complete(self, request: NormalizedRequest, answer: Answer) -> None:
        """Answer `request`; a `ProxyError` becomes `answer.fail`, never a raise."""
        record = self.telemetry.start(request)
        record.queue_depth = self.policies.admission.depth
        record.inflight = self.policies.admission.running
        completion = Completion(id=f"cmpl-{request.id}")
        scope = anyio.CancelScope()  # the proxy's own: cut at the end of the shutdown grace (`close`)
        self._open.add(scope)
        try:
            with scope:
                outcome = await self._run(request, answer, completion, record)
            if scope.cancelled_caught:
                outcome = Outcome.SHUTDOWN
            record.outcome = outcome
            await answer.finish(completion, outcome)
        except ProxyError as error:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.upstream_status = error.upstream_status
            await answer.fail(completion, error)
        except (asyncio.CancelledError, ConnectionResetError):
            record.outcome = Outcome.CLIENT_GONE  # the editor went away: the upstream stream is closed
            raise
        except Exception as exc:  # a defect: answered in the dialect's shape (the stream ended), never re-raised
            log.exception("unhandled error serving request %s", request.id, exc_info=exc)
            record.outcome = Outcome.INTERNAL_ERROR
            await answer.fail(completion, ProxyError("internal proxy error (see the proxy's log)"))
        finally:
            self._open.discard(scope)
            self.telemetry.finish(record, completion)
            if not self._open:
                self._idle.notify()

    async def drain(self) -> None:
        """Wait for the upstream requests still running (for shutdown and tests)."""
        while self._flights:
            await asyncio.gather(*self._flights, return_exceptions=True)

    async def close(self, grace_s: float) -> None:
        """Shut down: the requests being served get `grace_s` to finish; then each is answered with what it
        has and its dialect's final event (outcome `shutdown`), and every task of the service (upstream
        requests, slot releases) is cancelled and awaited, so none outlives the upstream session."""
        with contextlib.suppress(TimeoutError):
            await self._idle.wait_for(lambda: not self._open, grace_s)
        for scope in list(self._open):
            scope.cancel()
        with contextlib.suppress(TimeoutError):
            await self._idle.wait_for(lambda: not self._open, CLOSE_ANSWER_S)  # their last events, then done
        while self._flights:
            for task in list(self._flights):
                task.cancel()
            await asyncio.gather(*self._flights, return_exceptions=True)

    async def _warm_up(
        self, request: NormalizedRequest, answer: Answer, completion: Completion, record: RequestRecord
    ) -> Outcome:
        """Cache-warming requests (`n_predict: 0`) warm exactly the start the next completions will send (the
        other files and the edited file's header), and only on a slot that is free right now.

        They are never queued, debounced or allowed to supersede: a warm-up that waits would delay the
        completions the user is waiting for, and it is stale by the time a slot frees up. One with nothing
        to warm is answered here (a prefix-only template has no place for other files).
        """
        prompt = await self.budget.warm_up(request)
        if prompt is None or not self.policies.admission.has_free_slot():
            return Outcome.SKIPPED  # nothing to warm (answered here), or no slot free now
        lease = await self.policies.admission.acquire()
        await self._stream(request, prompt, answer, completion, record, lease, None, None)
        return Outcome.OK

    async def _run(
        self, request: NormalizedRequest, answer: Answer, completion: Completion, record: RequestRecord
    ) -> Outcome:
        policies, clock = self.policies, self.clock
        if request.warm_up:
            return await self._warm_up(request, answer, completion, record)
        if policies.reuse is not None:
            hit = policies.reuse.lookup(request)
            if hit is not None:
                outcome = await self._reuse(request, hit, answer, completion, record)
                if outcome is not None:
                    return outcome
        if not await self._hold(request, record):
            return Outcome.DEBOUNCED
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
                    lease = await policies.admission.acquire(ticket.scope)
                except QueueFullError:
                    return Outcome.QUEUE_FULL
                record.queue_ms = (clock.now() - queued_from) * 1000 if waits else 0.0
                ticket.running = True
                await self._stream(request, prompt, answer, completion, record, lease, ticket, deadline)
            if ticket.scope.cancelled_caught:
                return Outcome.CANCELLED if ticket.superseded else Outcome.TIMEOUT
        return Outcome.OK

    async def _hold(self, request: NormalizedRequest, record: RequestRecord) -> bool:
        """The dispatch hold; False when a newer request of the session replaced this one meanwhile."""
        policies = self.policies
        dispatch = policies.dispatch
        if dispatch is None:
            window = policies.debouncer.window_s
        else:
            busy = not policies.admission.has_free_slot() or policies.supersede.admitted(request.session) > 0
            window = dispatch.hold_s(request.session, busy)
        if window <= 0:  # nothing is held, and the clock (a system call on some machines) is not read
            await policies.debouncer.hold(request.session, 0)
            record.debounce_ms = 0.0
            return True
        held_from = self.clock.now()
        go_on = await policies.debouncer.hold(request.session, window)
        record.debounce_ms = (self.clock.now() - held_from) * 1000
        return go_on

    async def _reuse(
        self, request: NormalizedRequest, hit: Hit, answer: Answer, completion: Completion, record: RequestRecord
    ) -> Outcome | None:
        """Answer from an earlier completion the person typed through; None when it turned out not to fit
        before anything was sent (the request then goes on as usual)."""
        policies = self.policies
        flight = hit.entry.flight
        source = flight.completion
        completion.model, completion.created = source.model, source.created
        completion.upstream_id = source.upstream_id  # whose completion this is the rest of
        completion.context_tokens, completion.max_tokens = source.context_tokens, source.max_tokens
        max_tokens, stops = self._asked(request)
        if flight.done:
            rest = hit.rest(cut=flight.cut)
            if rest is None:
                return None
            finish: str | None = (source.finish_reason or "stop") if flight.finished else "length"
            end, why = rest_end(flight, len(hit.typed), max_tokens, stops)
            if end is not None and end - len(hit.typed) < len(rest):
                rest, finish = rest[: end - len(hit.typed)], why
            if not rest:
                return None
            return await self._send_reused(completion, answer, record, rest, finish)
        # Still streaming: follow it (a newer keystroke supersedes this request as it would any other).
        flight.listeners += 1
        sent = 0
        try:
            with policies.supersede.admit(request.session) as ticket:
                deadline = Deadline.start(self.clock, policies.ttft_timeout_ms, policies.timeout_ms)
                ticket.scope.deadline = deadline.first_token
                with ticket.scope:
                    seen = taken = 0
                    gate = LineGate()
                    limited: str | None = None  # the finish reason of this request's own limits, once reached
                    while True:
                        await flight.wait(seen)
                        seen = len(flight.batches)
                        text = source.text
                        if not (text.startswith(hit.typed) or hit.typed.startswith(text)):
                            break  # it wrote something else than what was typed
                        end, limited = rest_end(flight, len(hit.typed), max_tokens, stops)
                        if end is not None:
                            text = text[:end]
                        new = text[len(hit.typed) + taken :] if len(text) > len(hit.typed) + taken else ""
                        taken += len(new)
                        piece = gate.feed(new) if new else ""
                        if (flight.done and not flight.cut) or limited:
                            piece += gate.flush()
                        if piece:
                            if not sent:
                                self.telemetry.first_token(record)
                                ticket.scope.deadline = deadline.total
                            sent += len(piece)
                            chunk = Chunk(piece)
                            completion.add(chunk)
                            await answer.send(completion, [chunk])
                        if flight.done or limited:
                            break
                if ticket.scope.cancelled_caught:
                    return Outcome.CANCELLED if ticket.superseded else Outcome.TIMEOUT
        finally:
            self._leave(flight)
        if not sent:
            return None
        completion.finish_reason = limited or ((source.finish_reason or "stop") if flight.finished else "length")
        return Outcome.REUSED

    def _asked(self, request: NormalizedRequest) -> tuple[int | None, list[str]]:
        """What this request's own answer may hold: at most this many tokens, up to these stop strings."""
        cap = self.budget.settings.max_tokens
        max_tokens = cap if request.max_tokens is None else min(request.max_tokens, cap)
        stop = request.params.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
        return max_tokens, stops

    async def _send_reused(
        self, completion: Completion, answer: Answer, record: RequestRecord, rest: str, finish: str | None
    ) -> Outcome:
        chunk = Chunk(rest, finish_reason=finish or "stop")
        completion.add(chunk)
        self.telemetry.first_token(record)
        await answer.send(completion, [chunk])
        return Outcome.REUSED

    async def _stream(
        self,
        request: NormalizedRequest,
        prompt: BudgetedPrompt,
        answer: Answer,
        completion: Completion,
        record: RequestRecord,
        lease: Lease,
        ticket: Ticket | None,
        deadline: Deadline | None,
    ) -> None:
        """Start the upstream request in its own task (it owns `lease`) and relay it to `answer`."""
        record.reached_upstream = True
        completion.context_tokens, completion.max_tokens = prompt.context_tokens, prompt.max_tokens
        relayed = Completion(id=completion.id, truncated=completion.truncated,
                             context_tokens=prompt.context_tokens, max_tokens=prompt.max_tokens)  # fmt: skip
        flight = Flight(relayed, prompt)
        flight.capped = request.max_tokens is None or prompt.max_tokens < request.max_tokens
        producer = asyncio.get_running_loop().create_task(self._produce(request, flight, lease))
        self._flights.add(producer)
        producer.add_done_callback(self._flights.discard)
        if self.policies.reuse is not None and not request.warm_up:
            self.policies.reuse.remember(request, flight)
        flight.producer = producer
        seen = 0
        capped = request.max_tokens is None or prompt.max_tokens < request.max_tokens
        gate = LineGate(capped)  # a cut completion ends at a complete line
        try:
            while True:
                await flight.wait(seen)
                for batch in flight.batches[seen:]:
                    seen += 1
                    shown = gate.pass_batch(batch)
                    for chunk in shown:
                        completion.add(chunk)  # what this client was sent, and nothing more
                    if record.ttft_ms is None and any(chunk.has_text for chunk in batch):
                        self.telemetry.first_token(record)
                        if ticket is not None and deadline is not None:
                            ticket.scope.deadline = deadline.total  # the first-token deadline is met
                    if shown:
                        await answer.send(completion, shown)
                if flight.done and seen == len(flight.batches):
                    break
            rest = gate.flush() if not flight.cut else ""
            if rest:
                chunk = Chunk(rest)
                completion.add(chunk)
                await answer.send(completion, [chunk])
        finally:
            timed_out = ticket is not None and ticket.scope.cancel_called and not ticket.superseded
            self._leave(flight, timed_out=timed_out and record.ttft_ms is None)
            completion.served_by = flight.completion.served_by
        if flight.error is not None:
            raise flight.error
        record.upstream_status = 200

    def _leave(self, flight: Flight, timed_out: bool = False) -> None:
        """One relay of `flight` is done; the upstream request is dropped when no one follows it any more,
        unless it is past its first-token deadline and may finish its prefill (see `keep_prefill`)."""
        flight.listeners -= 1
        producer = flight.producer
        if flight.listeners > 0 or producer is None or producer.done():
            return
        admission = self.policies.admission
        if timed_out and self.policies.keep_prefill and admission.depth == 0:
            flight.stop_at_first_token = True
            watcher = asyncio.get_running_loop().create_task(self._cancel_when_needed(producer))
            self._flights.add(watcher)
            watcher.add_done_callback(self._flights.discard)
            return
        if self.policies.reuse is not None and admission.depth == 0:
            # The plugin cancels its request first and sends the next keystroke's right after: that one
            # may type through this completion and take it over, so it goes on a moment longer.
            self.clock.call_later(TAKEOVER_GRACE_S, _cancel_unfollowed, flight, producer)
            return
        producer.cancel()

    async def _cancel_when_needed(self, producer: asyncio.Task[None]) -> None:
        """Drop a prefill-only upstream request as soon as another request waits for its slot, or after
        `KEEP_PREFILL_MAX_S` (a prefill that long is not worth a slot)."""
        admission = self.policies.admission
        with contextlib.suppress(TimeoutError):
            await admission.changes.wait_for(lambda: admission.depth > 0 or producer.done(), KEEP_PREFILL_MAX_S)
        producer.cancel()

    async def _produce(self, request: NormalizedRequest, flight: Flight, lease: Lease) -> None:
        """The upstream request: fold its batches into the flight; then give the slot back once the server
        has let the request go."""
        completion = flight.completion
        sent_at = self.clock.now()
        finished = False
        size = 0  # bytes the upstream sent: kept for every listener, so bounded
        self.sent_upstream += 1
        served_by = getattr(self.upstream, "served_by", None)  # which of several upstreams answers
        try:
            async with aclosing(self._upstream_batches(request, flight)) as batches:
                async for batch in batches:
                    if served_by is not None and completion.served_by is None:
                        completion.served_by = served_by(request.id)
                    has_text = False
                    for chunk in batch:
                        completion.add(chunk)
                        has_text = has_text or chunk.has_text
                    if has_text and flight.first_text_at is None:
                        flight.first_text_at = self.clock.now()
                        self._learn_prefill(flight.first_text_at - sent_at)
                    flight.push(list(batch))
                    if has_text and flight.stop_at_first_token:
                        break  # the prefill is in the cache: that is all it was kept for
                    size += sum(len(chunk.raw) if chunk.raw is not None else len(chunk.text) for chunk in batch)
                    if size > MAX_FLIGHT_BYTES:  # a server that ignores max_tokens: cut, as at the cap
                        flight.push([Chunk("", finish_reason="length")])
                        break
                else:
                    finished = flight.finished = True
            if served_by is not None and completion.served_by is None:
                completion.served_by = served_by(request.id)  # an answer without a chunk
            prompt_tokens = (completion.usage or {}).get("prompt_tokens")
            if finished and isinstance(prompt_tokens, int) and flight.prompt is not None:
                self.budget.observe(flight.prompt.prompt, prompt_tokens)  # calibrates the `chars` estimate
            flight.end()
        except ProxyError as error:
            flight.end(error)
            finished = True  # the server answered (with an error): it holds nothing
        except Exception as error:  # unexpected: raised again in the relay, where the client is answered
            flight.end(error)
        except BaseException:
            flight.end()
            raise
        finally:
            flight.prompt = None  # reuse keeps the flight, not the prompt it sent
            if finished:
                self.sent_upstream -= 1
                lease.release()
            else:
                releaser = asyncio.get_running_loop().create_task(self._release_when_let_go(lease, sent_at))
                self._flights.add(releaser)
                releaser.add_done_callback(self._flights.discard)

    async def _upstream_batches(
        self, request: NormalizedRequest, flight: Flight
    ) -> AsyncGenerator[Sequence[Chunk], None]:
        """The upstream's batches for `flight.prompt`; a prompt it refuses as over its context is fitted again,
        harder, once (a count-only tokenizer's estimate, or a tokenizer that disagrees with the server, can
        overshoot), and becomes the flight's prompt."""
        prompt = flight.prompt
        assert prompt is not None, "a flight's prompt is dropped only once it has ended"
        try:
            async with aclosing(self.upstream.stream_completion(request, prompt)) as batches:
                async for batch in batches:
                    yield batch
            return
        except UpstreamStatusError as error:
            counted = context_overflow(error)
            if counted is None or flight.batches:  # only a refusal before anything streamed is asked again
                raise
        flight.prompt = prompt = await self.budget.refit(request, prompt, counted)
        async with aclosing(self.upstream.stream_completion(request, prompt)) as batches:
            async for batch in batches:
                yield batch

    def _learn_prefill(self, seconds: float) -> None:
        old = self.prefill_s
        self.prefill_s = seconds if old is None else old + TTFT_WEIGHT * (seconds - old)

    async def _release_when_let_go(self, lease: Lease, sent_at: float) -> None:
        """Keep a dropped request's slot until the server holds no more than the proxy's other requests.

        With a server that can say (`let_go`: llama.cpp's `/metrics` or `/slots`), until it says so;
        otherwise until the typical time to first token has passed since it was sent (the prefill the
        server will finish anyway). At most `LET_GO_TIMEOUT_S`.
        """
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.sent_upstream -= 1
                lease.release()

        def accept(held: int) -> bool:
            # Compared with the proxy's other requests the server has (a slot taken for a request not sent
            # yet does not count), and released in the same step, so two cancelled requests cannot both
            # count one let-go.
            if held <= self.sent_upstream - 1:
                release()
                return True
            return False

        try:
            let_go = getattr(self.upstream, "let_go", None)
            if let_go is not None and await let_go(accept, LET_GO_TIMEOUT_S):
                return
            if self.prefill_s is not None:
                wait = min(LET_GO_TIMEOUT_S, sent_at + self.prefill_s - self.clock.now())
                if wait > 0:
                    await asyncio.sleep(wait)
        finally:
            release()


def _cancel_unfollowed(flight: Flight, producer: asyncio.Task[None]) -> None:
    if flight.listeners == 0 and not producer.done():
        producer.cancel()
