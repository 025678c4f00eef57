"""What the serving room may ask of a model server, as protocols its implementations in this room satisfy:
`UpstreamClient` (one server) and `Upstreams` (several in order) stream completions; a server that can say
what it still holds (llama.cpp's `/metrics`) lets a cancelled request keep its slot until it is let go."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol, runtime_checkable

from mellum_proxy.models import BudgetedPrompt, Chunk, NormalizedRequest


class CompletionSource(Protocol):
    """The one thing the service needs from a model server (`UpstreamClient`, `Upstreams` in production).

    It yields the completion in batches: the chunks that arrived together (one network read).
    """

    def stream_completion(
        self, request: NormalizedRequest, prompt: BudgetedPrompt
    ) -> AsyncGenerator[Sequence[Chunk], None]: ...


@runtime_checkable
class SaysWhatItHolds(Protocol):
    """A server that can say how many requests it still holds (llama.cpp's `/metrics` or `/slots`)."""

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        """Wait until `accept(requests the server holds)` is true; True if the server said so (False: it
        cannot tell)."""
        ...


@runtime_checkable
class SaysWhoServed(Protocol):
    """Several servers behind one source (`Upstreams`): which one answered a request."""

    def served_by(self, request_id: str) -> str | None: ...


@runtime_checkable
class Wakes(Protocol):
    """A server that may sleep (unload its model when idle): woken before a completion is sent (`Upstreams`)."""

    @property
    def wakes(self) -> int:
        """How many times it was woken so far."""
        ...

    @property
    def cache_per_slot(self) -> bool:
        """Each of its slots keeps a prompt cache of its own (llama.cpp), all empty after a sleep."""
        ...

    async def awake(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> float | None:
        """Wait until it is awake, waking it if it sleeps; the milliseconds waited (None: it was awake)."""
        ...
