"""`Supersede`: at most `max_inflight` admitted requests per session; a newer one cancels the oldest.

Admitted means queued for an upstream slot or running upstream. Each admitted request holds a
`Ticket` whose anyio `CancelScope` encloses its queue wait and its upstream stream: cancelling the
scope removes it from the queue or closes its upstream connection, so the server stops decoding.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterator
from contextlib import contextmanager

import anyio


class Ticket:
    """One admitted request: its cancel scope and whether a newer request superseded it."""

    __slots__ = ("order", "running", "scope", "superseded")

    def __init__(self, order: float = math.inf) -> None:
        self.order = order  # when its request arrived, in the session's order (inf: newer than any so far)
        self.scope = anyio.CancelScope()
        self.superseded = False
        self.running = False  # holds an upstream slot (else: queued)

    def supersede(self) -> None:
        self.superseded = True
        self.scope.cancel()  # safe before the scope is entered: it is then cancelled on entry


class Supersede:
    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self._tickets: dict[str, list[Ticket]] = {}

    def admitted(self, session: str) -> int:
        return len(self._tickets.get(session, ()))

    def sessions(self) -> dict[str, dict[str, int]]:
        """Admitted requests per session, split into running upstream and queued."""
        return {
            session: {
                "running": sum(t.running for t in tickets),
                "queued": sum(not t.running for t in tickets),
            }
            for session, tickets in self._tickets.items()
        }

    @contextmanager
    def admit(self, session: str, order: float = math.inf) -> Iterator[Ticket]:
        """Admit a request of `session`, cancelling the oldest admitted ones beyond `max_inflight`. `order`: when
        it arrived; one admitted after newer ones (it waited on something first) is the oldest, and may be the one
        superseded at once (its scope is then cancelled on entry)."""
        tickets = self._tickets.setdefault(session, [])
        ticket = Ticket(order)
        insort(tickets, ticket, key=lambda t: t.order)  # after any of the same order: the newest of them
        while len(tickets) > self.max_inflight:
            tickets.pop(0).supersede()
        try:
            yield ticket
        finally:
            if ticket in tickets:
                tickets.remove(ticket)
            if not tickets and self._tickets.get(session) is tickets:
                del self._tickets[session]
