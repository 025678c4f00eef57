"""`CompletionService`: one completion from a normalized request to its `Answer`, with its record.

The steps, in order: typed-through reuse -> dispatch hold -> the guards (the comment/string skip) -> supersede
(per-session admission) -> deadline -> context budget -> global admission queue -> upstream stream
-> answer. Telemetry observes; the record is closed in `finally`. A request that a policy drops is
answered with an empty (or partial) completion and its outcome, never with an error. This module
knows no HTTP: the edge (`mellum_proxy.http`) adapts the `Answer` protocol to a response.

Each upstream request streams in a task of its own (`mellum_proxy.serving.flight`), which the service relays to its
client: so a newer keystroke can follow it, and a cancelled one keeps its slot until the server lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging

import anyio

from mellum_proxy.budget import ContextBudget
from mellum_proxy.errors import ProxyError
from mellum_proxy.models import Answer, BudgetedPrompt, Completion, NormalizedRequest, Outcome
from mellum_proxy.observe import Changes
from mellum_proxy.policies import (
    Deadline,
    Documents,
    Lease,
    QueueFullError,
    Ticket,
)
from mellum_proxy.serving.flight import Flights
from mellum_proxy.serving.policy_set import Policies, admitted
from mellum_proxy.serving.relay import FromStart, first_text, relay
from mellum_proxy.serving.typed_through import TypedThrough
from mellum_proxy.shaping.cleanup import Cleaner
from mellum_proxy.shaping.lines import LineGate
from mellum_proxy.telemetry import RequestRecord, Telemetry
from mellum_proxy.upstream.capabilities import CompletionSource, Wakes

log = logging.getLogger("mellum_proxy")

CLOSE_ANSWER_S = 1.0  # at shutdown, for the requests cut at the end of the grace to write their last event
WARM_AFTER_WAKE_S = 10.0  # the longest the other slots are held after a wake, waiting for the typing to pause
WARM_QUIET_S = 0.5  # no completion asked this long: the typing paused (a keystroke's gap is 100-300 ms)


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
        self.flights = Flights(upstream, policies.admission, budget, policies.clock, policies.keep_prefill,
                               takeover=policies.reuse is not None)  # fmt: skip
        self.typed_through = TypedThrough(policies, self.flights, telemetry, budget.settings.max_tokens)
        self.documents = Documents()  # a session for each document of a client that names none
        self.wakes = upstream if isinstance(upstream, Wakes) else None  # a server that may sleep
        self._wakes_warmed = 0  # the wakes after which the other slots were warmed
        self._newest: tuple[NormalizedRequest, BudgetedPrompt] | None = None  # the newest prompt while one wakes
        self._slots_held = False  # slots are held back after a wake, until the typing pauses
        self._last_arrival = 0.0  # the clock's time the newest completion request came (after a wake)
        self._arrivals_after_wake = 0
        self._arrived = Changes()
        self._open: set[anyio.CancelScope] = set()  # the requests being served
        self._arrivals = itertools.count()  # each request's place in arrival order (a session's newest is last)
        self._idle = Changes()  # notified when the last one ends

    async def complete(self, request: NormalizedRequest, answer: Answer, arrived: float | None = None) -> None:
        """Answer `request`; a `ProxyError` becomes `answer.fail`, never a raise. `arrived`: the clock's time it
        reached the edge, before its body was read (its record counts from then); None: now."""
        request = self.documents.assign(request)
        order = next(self._arrivals)
        if self._slots_held:  # after a wake: the pause the other slots wait for
            self._last_arrival = self.clock.now()
            self._arrivals_after_wake += 1
            self._arrived.notify()
        record = self.telemetry.start(request, arrived)
        record.arrived(self.policies.admission.depth, self.policies.admission.running)
        completion = Completion(id=f"cmpl-{request.id}")
        scope = anyio.CancelScope()  # the proxy's own: cut at the end of the shutdown grace (`close`)
        self._open.add(scope)
        try:
            with scope:
                outcome = await self._run(request, answer, completion, record, order)
            if scope.cancelled_caught:
                outcome = Outcome.SHUTDOWN
            record.ended(outcome)
            if completion.text_chunks:
                completion.count_usage(record.prompt_tokens_after or 0)
            await answer.finish(completion, outcome)
        except ProxyError as error:
            record.ended(Outcome.UPSTREAM_ERROR, error.upstream_status, error.kind)
            await answer.fail(completion, error)
        except (asyncio.CancelledError, ConnectionResetError):
            record.ended(Outcome.CLIENT_GONE)  # the editor went away: the upstream stream is closed
            raise
        except Exception as exc:  # a defect: answered in the dialect's shape (the stream ended), never re-raised
            log.exception("unhandled error serving request %s", request.id, exc_info=exc)
            record.ended(Outcome.INTERNAL_ERROR)
            await answer.fail(completion, ProxyError("internal proxy error (see the proxy's log)"))
        finally:
            self._open.discard(scope)
            if completion.has_text:
                self.documents.shown(request.session, completion)
            self.telemetry.finish(record, completion, request)
            if not self._open:
                self._idle.notify()

    async def drain(self) -> None:
        """Wait for the upstream requests still running (for tests and the bench)."""
        await self.flights.drain()

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
        await self.flights.close()

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
        self, request: NormalizedRequest, answer: Answer, completion: Completion, record: RequestRecord, order: int
    ) -> Outcome:
        """The policies in turn. `order`: its place in arrival order; a request that waited on a completion it typed
        through and comes to the hold after a newer keystroke of its session is replaced by that one, not the
        other way round."""
        policies, clock = self.policies, self.clock
        if request.warm_up:
            return await self._warm_up(request, answer, completion, record)
        if policies.reuse is not None:
            hit = policies.reuse.lookup(request)
            if hit is not None:
                outcome = await self.typed_through.answer(request, hit, answer, completion, record, order)
                if outcome is not None:
                    return outcome
        if not await self._hold(request, record, order):
            return Outcome.DEBOUNCED
        for guard in policies.guards:
            if (stopped := guard.stops(request)) is not None:
                return stopped
        with admitted(policies, request.session, order) as entry:
            prompt = await self.budget.apply(request)
            record.fitted(prompt)
            completion.truncated = prompt.truncated
            if self.wakes is not None:  # a sleeping server is woken first; the wait is superseded as any other
                await self._awake(request, prompt, record)
            waits = not policies.admission.has_free_slot()  # else the slot is taken without a wait
            queued_from = clock.now() if waits else 0.0
            try:
                lease = await policies.admission.acquire(entry.ticket.scope)
            except QueueFullError:
                return Outcome.QUEUE_FULL
            record.queued((clock.now() - queued_from) * 1000 if waits else 0.0)
            entry.ticket.running = True
            await self._stream(request, prompt, answer, completion, record, lease, entry.ticket, entry.deadline)
        return entry.cut or Outcome.OK

    async def _awake(self, request: NormalizedRequest, prompt: BudgetedPrompt, record: RequestRecord) -> None:
        """Wait for the upstream to be awake; a request that waited for a wake (or began one) says so.

        After a sleep every slot's prompt cache is empty, and the wake fills one. Until the typing pauses (no
        completion asked for `WARM_QUIET_S`), the others are held back, so every keystroke goes to the slot the
        wake warmed; then they are filled with the newest prompt in the background while the person reads the
        suggestion, and given back. (A keystroke that found the warmed slot busy paid a whole prefill on another:
        the pause's request waited 240-430 ms in the proxy for it; filling the others at once, or as soon as a
        keystroke was answered, took the one CPU the keystrokes needed.)"""
        wakes = self.wakes
        assert wakes is not None
        started = self.clock.now()
        self._newest = (request, prompt)
        try:
            waited = await wakes.awake(request, prompt)
        except BaseException:
            record.woke((self.clock.now() - started) * 1000)  # superseded or past its deadline while it woke
            raise
        if waited is None:
            return
        record.woke(waited)
        if wakes.wakes != self._wakes_warmed and wakes.cache_per_slot:
            self._wakes_warmed = wakes.wakes
            admission = self.policies.admission
            held = [await admission.acquire() for _ in range(admission.limit - 1) if admission.has_free_slot()]
            if held:
                self._slots_held, self._last_arrival = True, self.clock.now()
                self.flights.own(self._warm_after_pause(held))

    async def _warm_after_pause(self, held: list[Lease]) -> None:
        """Fill the slots `held` back after a wake with the newest prompt once the typing paused (at most
        `WARM_AFTER_WAKE_S` after the wake), each a prefill-only request that gives its slot back when done."""
        clock = self.clock
        until = clock.now() + WARM_AFTER_WAKE_S
        while (left := min(self._last_arrival + WARM_QUIET_S, until) - clock.now()) > 0:
            seen = self._arrivals_after_wake
            try:  # a newer request starts the quiet again
                await self._arrived.wait_for(lambda: self._arrivals_after_wake != seen, left)  # noqa: B023
            except TimeoutError:
                break
        self._slots_held = False
        assert self._newest is not None, "set before the wake"
        request, prompt = self._newest
        cold = dataclasses.replace(prompt, max_tokens=0)
        for slot, lease in enumerate(held, 1):
            warm = dataclasses.replace(request, id=f"{request.id}-warm{slot}", max_tokens=0)
            self.flights.start(warm, cold, Completion(id=warm.id), lease)  # ends on its own: it asks no token

    async def _hold(self, request: NormalizedRequest, record: RequestRecord, order: int) -> bool:
        """The hold the rule in force says; False when a newer request of the session replaced this one meanwhile."""
        policies = self.policies
        rule = policies.hold
        if rule is None:
            window = policies.debouncer.window_s
        else:
            busy = rule.reads_load and (
                not policies.admission.has_free_slot() or policies.supersede.admitted(request.session) > 0
            )
            window = rule.hold_for(request, busy)
        if window <= 0:  # nothing is held, and the clock (a system call on some machines) is not read
            go_on = await policies.debouncer.hold(request.session, 0, order)
            record.held(0.0)
            return go_on
        held_from = self.clock.now()
        go_on = await policies.debouncer.hold(request.session, window, order)
        record.held((self.clock.now() - held_from) * 1000)
        return go_on

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
        record.sent()
        flight = self.flights.start(request, prompt, completion, lease)
        if self.policies.reuse is not None and not request.warm_up:
            self.policies.reuse.remember(request, flight)
        # an edit-region answer repeats its region's lines and carries its markers: never cleaned
        clean = self.policies.postprocess and request.edit_region is None
        cleaner = Cleaner(request.prefix, request.suffix) if clean else None
        view = FromStart(LineGate(flight.capped), cleaner, first_text(self.telemetry, record, ticket, deadline))
        try:
            await relay(flight, view, answer, completion, own=True)
            if view.cleaned is not None:
                record.cleaned_by(view.cleaned)
        finally:
            timed_out = ticket is not None and ticket.scope.cancel_called and not ticket.superseded
            ended_early = view.cleaned is not None and not flight.ended
            self.flights.leave(flight, timed_out=timed_out and record.ttft_ms is None, drop=ended_early)
        if flight.error is not None and not ended_early:
            raise flight.error
        record.answered()
