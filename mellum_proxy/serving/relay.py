"""The one relay loop: what a client is shown of a flight, as the upstream sends it.

A flight's batches arrive once, for every client that follows it; each client has a `View` of them. A fresh
request's view (`FromStart`) shows every batch, shaped as it streams (post-processing, then the gate that
holds back what follows a cut completion's last complete line), with plain text events passed on unparsed. A
request that typed through the flight's text (`AfterTyped`) is shown what comes after what was typed, within
its own limits (its `max_tokens` on the server's token boundaries, its stop strings), shaped as a completion
of its own. `relay` waits for new batches, asks the view what to show, and sends it; for a request's own flight
the producer sends each batch itself, in the turn it arrived (`Follower`), and the relay only ends the answer. The
caller owns the slot, the deadline and the record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from mellum_proxy.models import Answer, Chunk, Completion
from mellum_proxy.policies import Deadline, Ticket
from mellum_proxy.serving.flight import Flight
from mellum_proxy.serving.reuse import rest_end
from mellum_proxy.shaping.cleanup import Cleaner
from mellum_proxy.shaping.lines import LineGate
from mellum_proxy.telemetry import RequestRecord, Telemetry

Batches = Sequence[Sequence[Chunk]]


class View(Protocol):
    """One client's share of a flight."""

    def shown(self, flight: Flight, batches: Batches) -> Iterator[Sequence[Chunk]]:
        """For the batches that just arrived: what to send, a group of chunks per send."""
        ...

    def over(self, flight: Flight, caught_up: bool) -> bool:
        """Whether nothing more will be shown (`caught_up`: every batch the flight has was seen)."""
        ...

    def rest(self, flight: Flight, completion: Completion) -> str:
        """What is released once it is over (text held back until then)."""
        ...


async def relay(flight: Flight, view: View, answer: Answer, completion: Completion, own: bool = False) -> None:
    """Send `answer` what `view` shows of `flight` until it is over; `completion` holds what was sent. `own`: the
    flight is this request's own, and it is the only one following it yet: the producer sends each batch in its own
    turn (`Follower`), one event-loop turn sooner than this task would."""
    follower = Follower(flight, view, answer, completion)
    if own and flight.follower is None:
        flight.follower = follower
    try:
        while not follower.over:
            await flight.wait(follower.seen, follower)
            if follower.error is not None:
                raise follower.error
            await follower.catch_up()
    finally:
        if flight.follower is follower:
            flight.follower = None  # from now on the answer is its request's to end: the producer sends no more
    if rest := view.rest(flight, completion):
        chunk = Chunk(rest)
        completion.add(chunk)
        await answer.send(completion, [chunk])


class Follower:
    """One client's progress through a flight: the batches it has seen, and whether it is over. `catch_up` is
    called by the relay's task, or by the flight's producer right after a batch arrived (`from_producer`)."""

    def __init__(self, flight: Flight, view: View, answer: Answer, completion: Completion) -> None:
        self.flight, self.view, self.answer, self.completion = flight, view, answer, completion
        self.relaying = asyncio.current_task()  # the relay's task: once it is being cancelled, the answer is its
        self.seen = 0
        self.over = False
        self.busy = False  # a send is under way (one waiting for the client to read): no second one meanwhile
        self.error: BaseException | None = None  # what a send from the producer's turn raised, for the relay

    async def catch_up(self) -> None:
        """Send what the batches not seen yet show, and note whether nothing more will be shown."""
        if self.busy:
            return  # the other caller is sending (waiting for the client to read): the relay's loop sends the rest
        self.busy = True
        try:
            flight, view, completion = self.flight, self.view, self.completion
            batches = flight.batches[self.seen :]
            self.seen += len(batches)
            for shown in view.shown(flight, batches):
                for chunk in shown:
                    completion.add(chunk)  # what this client was sent, and nothing more
                await self.answer.send(completion, shown)
            self.over = view.over(flight, self.seen == len(flight.batches))
        finally:
            self.busy = False

    async def from_producer(self) -> None:
        """The producer's part: send at once; what it raises is the relay's to raise, in its own task. A relay being
        cancelled (a deadline, a newer keystroke, the client gone) is sent nothing more: its request ends it."""
        if self.relaying is not None and self.relaying.cancelling():
            return
        try:
            await self.catch_up()
        except Exception as error:
            self.error = error
            self.flight.follower = None
        if self.over or self.error is not None:
            self.flight.wake()  # the relay ends it


def first_text(
    telemetry: Telemetry, record: RequestRecord, ticket: Ticket | None, deadline: Deadline | None
) -> Callable[[], None]:
    """What the first text shown does: the record's first token, and the deadline from first to total."""

    def first() -> None:
        telemetry.first_token(record)
        if ticket is not None and deadline is not None:
            ticket.scope.deadline = deadline.total  # the first-token deadline is met

    return first


class FromStart:
    """A fresh request's view: every batch, post-processed (`cleaner`) and gated as it streams."""

    def __init__(self, gate: LineGate, cleaner: Cleaner | None, on_text: Callable[[], None]) -> None:
        self.gate, self.cleaner, self.on_text = gate, cleaner, on_text
        self.saw_text = False

    @property
    def cleaned(self) -> str | None:
        """The post-processing rule that ended it, if one did."""
        return self.cleaner.stopped if self.cleaner is not None else None

    def shown(self, flight: Flight, batches: Batches) -> Iterator[Sequence[Chunk]]:
        for batch in batches:
            if not self.saw_text and any(chunk.has_text for chunk in batch):
                self.saw_text = True
                self.on_text()
            shown = self.gate.pass_batch(batch if self.cleaner is None else self.cleaner.pass_batch(batch))
            if shown:
                yield shown
            if self.cleaned is not None:
                return

    def over(self, flight: Flight, caught_up: bool) -> bool:
        return self.cleaned is not None or (flight.ended and caught_up)

    def rest(self, flight: Flight, completion: Completion) -> str:
        return self.gate.flush() if not flight.cut_short or completion.finish_reason == "stop" else ""


class AfterTyped:
    """A typed-through request's view of a flight still streaming: what follows the `typed` text, up to this
    request's own `max_tokens` and `stops`, cleaned and gated as a completion of its own."""

    def __init__(
        self, typed: str, max_tokens: int | None, stops: Sequence[str], cleaner: Cleaner | None,
        on_text: Callable[[], None],
    ) -> None:  # fmt: skip
        self.typed, self.max_tokens, self.stops, self.cleaner, self.on_text = typed, max_tokens, stops, cleaner, on_text
        self.gate = LineGate()
        self.taken = 0  # characters of the flight's text after `typed` taken so far
        self.sent = 0  # characters shown
        self.limited: str | None = None  # the finish reason of this request's own limits, once reached
        self.diverged = False  # the flight wrote something else than what was typed

    def shown(self, flight: Flight, batches: Batches) -> Iterator[Sequence[Chunk]]:
        text, typed = flight.completion.text, self.typed
        if not (text.startswith(typed) or typed.startswith(text)):
            self.diverged = True
            return
        end, self.limited = rest_end(flight, len(typed), self.max_tokens, self.stops)
        if end is not None:
            text = text[:end]
        new = text[len(typed) + self.taken :] if len(text) > len(typed) + self.taken else ""
        self.taken += len(new)
        cleaner = self.cleaner
        if cleaner is not None:
            new = cleaner.feed(new)
            if flight.ended and not flight.cut_short and cleaner.stopped is None:
                new += cleaner.finish()
            if cleaner.stopped is not None:
                self.limited = "stop"
        piece = self.gate.feed(new) if new else ""
        if (flight.ended and not flight.cut_short) or self.limited:
            piece += self.gate.flush()
        if piece:
            if not self.sent:
                self.on_text()
            self.sent += len(piece)
            yield [Chunk(piece)]

    def over(self, flight: Flight, caught_up: bool) -> bool:
        return self.diverged or flight.ended or self.limited is not None

    def rest(self, flight: Flight, completion: Completion) -> str:
        return ""  # released as it came
