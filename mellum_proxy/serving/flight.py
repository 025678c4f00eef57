"""Flights: each upstream request streams in a task of its own (a `Flight`), which holds its admission slot,
so that it can outlive the client request that started it:
- a newer keystroke that types through it follows it instead of cancelling it (reuse);
- a cancelled one keeps its slot until the server has really let it go (server-true admission:
  llama.cpp finishes a prefill it has started, and keeps a queued task until it would start);
- one past its first-token deadline is answered at once, but may finish its prefill while no one
  waits for the slot, so the next keystroke finds a warm prompt cache (`keep_prefill`).

`Flights` owns these tasks (the producers, the watchers of kept prefills, the slot releases) and closes
them; the completion service (`mellum_proxy.serving.service`) starts flights and relays them to its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from mellum_proxy.budget import ContextBudget
from mellum_proxy.clock import Clock
from mellum_proxy.errors import ProxyError, UpstreamStatusError
from mellum_proxy.models import BudgetedPrompt, Chunk, Completion, NormalizedRequest
from mellum_proxy.policies import AdmissionQueue, Lease
from mellum_proxy.upstream.capabilities import CompletionSource, SaysWhatItHolds, SaysWhoServed
from mellum_proxy.upstream.servers import context_overflow

MAX_FLIGHT_BYTES = 1 << 20  # an upstream answer larger than this (128 tokens are ~1 KB) is cut
KEEP_PREFILL_MAX_S = 2.0  # the longest a timed-out request may go on to finish its prefill
TAKEOVER_GRACE_S = 0.05  # how long an abandoned stream waits for a newer keystroke to take it over
LET_GO_TIMEOUT_S = 10.0  # the longest a cancelled request keeps its slot waiting for the server
TTFT_WEIGHT = 0.2  # of the newest first-token time, in the running estimate of the server's prefill


class Follows(Protocol):
    """A client following a flight, sent each batch from the producer's own turn (`mellum_proxy.serving.relay`)."""

    over: bool
    error: BaseException | None

    async def from_producer(self) -> None: ...


@dataclass(eq=False, slots=True)
class Flight:
    """One upstream completion as it streams: its batches, its end, and who follows it.

    `listeners` counts the requests relaying it to a client (its own request, and any that took it
    over); the upstream request is dropped when the last one leaves.
    """

    completion: Completion
    prompt: BudgetedPrompt | None  # what the upstream is asked; dropped once it ends (reuse keeps the flight)
    batches: list[list[Chunk]] = field(default_factory=list)
    ended: bool = False  # the upstream request is over (answered, cut or failed)
    error: BaseException | None = None
    listeners: int = 1
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    producer: asyncio.Task[None] | None = None  # the task streaming it from the upstream
    stop_at_first_token: bool = False  # kept only to finish its prefill
    first_text_at: float | None = None
    ended_on_its_own: bool = False  # the upstream ended it (not a deadline, a cancel or an error)
    capped: bool = False  # the proxy asked for fewer tokens than the client did
    follower: Follows | None = None  # its own request's relay, sent each batch by the producer as it comes

    def push(self, batch: list[Chunk]) -> None:
        self.batches.append(batch)
        if self.follower is None or self.listeners > 1:
            self.wake()  # else the producer sends it (`Follows.from_producer`): no task to wake

    def end(self, error: BaseException | None = None) -> None:
        self.ended, self.error = True, error
        self.wake()

    def wake(self) -> None:
        self.changed.set()  # wakes every waiter: each has its own future, already resolved by `clear`
        self.changed.clear()

    async def wait(self, seen: int, follower: Follows | None = None) -> None:
        """Return once there are more than `seen` batches, or it has ended (or `follower` is over or failed)."""
        while not self.ended and len(self.batches) <= seen:
            if follower is not None and (follower.over or follower.error is not None):
                return
            await self.changed.wait()

    @property
    def ended_clean(self) -> bool:
        """Over, and without an error."""
        return self.ended and self.error is None

    def token_ends(self) -> list[int]:
        """Where each token of the text ends: the upstream streams a token an event (a server that answered
        in one body counts as one token)."""
        ends, at = [], 0
        for batch in self.batches:
            for chunk in batch:
                if chunk.has_text:
                    at += len(chunk.text)
                    ends.append(at)
        return ends

    @property
    def cut_short(self) -> bool:
        """Cut short: by a deadline, a cancel or an error, or by the upstream at the proxy's `max_tokens` cap."""
        return not self.ended_on_its_own or (self.capped and self.completion.finish_reason == "length")


@dataclass(eq=False)
class Flights:
    """The upstream requests in flight, and every task they need, owned here and closed by `close`."""

    upstream: CompletionSource
    admission: AdmissionQueue
    budget: ContextBudget
    clock: Clock
    keep_prefill: bool = False
    takeover: bool = False  # a newer keystroke may take an abandoned flight over (reuse is on)
    prefill_s: float | None = field(default=None, init=False)  # running estimate of the time to first token
    sent_upstream: int = field(default=0, init=False)  # upstream requests sent and not yet let go by the server
    letting_go: int = field(default=0, init=False)  # of those, dropped ones the proxy waits for the server to let go
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        upstream = self.upstream
        self.holds = upstream if isinstance(upstream, SaysWhatItHolds) else None
        self.serves = upstream if isinstance(upstream, SaysWhoServed) else None

    def start(self, request: NormalizedRequest, prompt: BudgetedPrompt, completion: Completion, lease: Lease) -> Flight:
        """The upstream request for `prompt`, streaming in a task of its own that owns `lease`."""
        relayed = Completion(id=completion.id, truncated=completion.truncated, origin=completion.origin)
        relayed.origin.context_tokens, relayed.origin.max_tokens = prompt.context_tokens, prompt.max_tokens
        flight = Flight(relayed, prompt)
        flight.capped = request.max_tokens is None or prompt.max_tokens < request.max_tokens
        flight.producer = self._own(self._produce(request, flight, lease))
        return flight

    def own(self, work: Any) -> asyncio.Task[None]:
        """Run `work` in a task these flights own: cancelled and awaited at `close`."""
        return self._own(work)

    def _own(self, work: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait for the upstream requests still running (for tests and the bench)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel and await every task: none outlives the upstream session."""
        while self._tasks:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def leave(self, flight: Flight, timed_out: bool = False, drop: bool = False) -> None:
        """One relay of `flight` is done; the upstream request is dropped when no one follows it any more,
        unless it is past its first-token deadline and may finish its prefill (see `keep_prefill`). `drop`:
        the relay ended it (a post-processing rule): dropped at once, so the server stops decoding."""
        flight.listeners -= 1
        producer = flight.producer
        if flight.listeners > 0 or producer is None or producer.done():
            return
        if drop:
            producer.cancel()
            return
        admission = self.admission
        if timed_out and self.keep_prefill and admission.depth == 0:
            flight.stop_at_first_token = True
            self._own(self._cancel_when_needed(producer))
            return
        if self.takeover and admission.depth == 0:
            # The plugin cancels its request first and sends the next keystroke's right after: that one
            # may type through this completion and take it over, so it goes on a moment longer.
            self.clock.call_later(TAKEOVER_GRACE_S, _cancel_unfollowed, flight, producer)
            return
        producer.cancel()

    async def _cancel_when_needed(self, producer: asyncio.Task[None]) -> None:
        """Drop a prefill-only upstream request as soon as another request waits for its slot, or after
        `KEEP_PREFILL_MAX_S` (a prefill that long is not worth a slot)."""
        admission = self.admission
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
        served_by = self.serves.served_by if self.serves is not None else None  # which of several answered
        try:
            async with aclosing(self._upstream_batches(request, flight)) as batches:
                async for whole in batches:
                    if served_by is not None and completion.served_by is None:
                        completion.origin.served_by = served_by(request.id)
                    batch, over = _within(whole, MAX_FLIGHT_BYTES - size)
                    size += sum(_size(chunk) for chunk in batch)
                    has_text = False
                    for chunk in batch:
                        completion.add(chunk)
                        has_text = has_text or chunk.has_text
                    if has_text and flight.first_text_at is None:
                        flight.first_text_at = self.clock.now()
                        self._learn_prefill(flight.first_text_at - sent_at)
                    flight.push(list(batch))
                    if (follower := flight.follower) is not None:
                        await follower.from_producer()
                    if has_text and flight.stop_at_first_token:
                        break  # the prefill is in the cache: that is all it was kept for
                    if over:  # a server that ignores max_tokens: cut, as at the cap
                        flight.push([Chunk("", finish_reason="length")])
                        break
                else:
                    finished = flight.ended_on_its_own = True
            if served_by is not None and completion.served_by is None:
                completion.origin.served_by = served_by(request.id)  # an answer without a chunk
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
                self._own(self._release_when_let_go(lease, sent_at))

    async def _upstream_batches(
        self, request: NormalizedRequest, flight: Flight
    ) -> AsyncGenerator[Sequence[Chunk], None]:
        """The upstream's batches for `flight.prompt`; a prompt it refuses as over its context is fitted again,
        harder, once (a count-only tokenizer's estimate, or a tokenizer that disagrees with the server, can
        overshoot), and becomes the flight's prompt. An edit-region prompt goes as the client sized it: fitting it
        again would send the same bytes, so its refusal is the answer."""
        prompt = flight.prompt
        assert prompt is not None, "a flight's prompt is dropped only once it has ended"
        try:
            async with aclosing(self.upstream.stream_completion(request, prompt)) as batches:
                async for batch in batches:
                    yield batch
            return
        except UpstreamStatusError as error:
            counted = context_overflow(error)
            if counted is None or flight.batches or request.edit_region is not None:  # asked again: only a refusal
                # before anything streamed, of a prompt the proxy fitted
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
        self.letting_go += 1

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.sent_upstream -= 1
                self.letting_go -= 1
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
            if self.holds is not None and await self.holds.let_go(accept, LET_GO_TIMEOUT_S):
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


def _size(chunk: Chunk) -> int:
    return len(chunk.raw) if chunk.raw is not None else len(chunk.text)


def _within(batch: Sequence[Chunk], room: int) -> tuple[Sequence[Chunk], bool]:
    """The chunks of `batch` that fit in `room` bytes, and whether any did not (one network read can hold many:
    the answer never grows past `MAX_FLIGHT_BYTES`)."""
    for index, chunk in enumerate(batch):
        room -= _size(chunk)
        if room < 0:
            return batch[:index], True
    return batch, False
