"""What a kind of model server is to the proxy: a `ServerKind`, one per module of this package, registered in
`servers/__init__.py` as each editor dialect is in `dialects/`.

A kind owns how it is recognised (`probe`), what discovery asks it and reads back (`discover`), its completion
wire (`wire`), what it says it holds (`held_gauges`, and llama.cpp's `/slots`), its `/tokenize` shape, how it
says a prompt was over its context, and the flags that start it with a context, a batch and a KV cache type.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from mellum_proxy.models import BudgetedPrompt, Chunk, NormalizedRequest
from mellum_proxy.upstream.servers.startup_log import StartupLog


class Transport(Protocol):
    """What a kind asks of the connection to its server (`UpstreamClient`)."""

    model: str | None

    async def get_json(self, path: str, timeout_s: float = 2.0) -> Any: ...

    async def post_json(self, path: str, body: Any, timeout_s: float = 2.0) -> Any: ...


@dataclass(frozen=True, slots=True)
class Found:
    """What the proxy learned about its upstream (None: it did not say)."""

    kind: str
    model: str | None
    context: int | None
    slots: int | None

    def describe(self) -> str:
        context = f"{self.context} tokens per request" if self.context else "context per request unknown"
        slots = f"{self.slots} slots" if self.slots else "slots unknown"
        return f"kind {self.kind}, model {self.model or 'not named'}, {context}, {slots}"


class Wire(Protocol):
    """How completions are asked of a server and read back."""

    path: str
    answers_at_once: bool  # its status and headers come before the prefill (so a silent one is down)

    def body(
        self, request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None, defaults: dict[str, Any]
    ) -> dict[str, Any]: ...

    def read(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[Chunk]]: ...


@dataclass(frozen=True, slots=True)
class TokenizeShape:
    """A server's `POST /tokenize`: the body it takes, and each token's text and id from its answer."""

    name: str
    body: Callable[[str, bool, bool, str | None], dict[str, Any]]  # text, special tokens, with pieces, model
    pieces: Callable[[Any, str], list[Any] | None]  # each token's text; None: the answer does not give it
    ids: Callable[[Any], list[int]]
    vocabulary: bool = False  # the pieces are the vocabulary's strings (`Ġdef`, `▁def`), not the text itself


@dataclass(frozen=True, slots=True)
class Overflow:
    """How a kind says a prompt was over its context (an upstream 400): its phrases, and where it counts."""

    phrases: tuple[str, ...]  # lowercase
    counted: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True, slots=True)
class Memory:
    """What the VRAM planning tools need of a kind that loads the model itself (`sweep`, `fit`, `inspect-log`)."""

    overhead_gib: float  # beyond weights and KV cache (CUDA context, compute buffers, graphs), from its own logs
    read_log_line: Callable[[StartupLog, str], None]  # what one line of its start-up log says it allocated
    # (tokens per sequence, sequences) its KV cache was sized for, from the log's facts and text
    kv_extent: Callable[[dict[str, Any], str], tuple[int, int] | None]
    window_extra_tokens: int = 0  # a sliding-window layer keeps this many tokens beyond its window
    command_words: tuple[str, ...] = ()  # a start command (`fit --server-cmd`) naming one of these starts it


@dataclass(frozen=True, slots=True)
class ServerKind:
    name: str  # the `upstream_kind` setting's value
    title: str  # how people write it
    discover: Callable[[Transport], Awaitable[Found]]
    wire: Wire
    probe: tuple[str, Callable[[Any], bool]] | None = None  # GET this path; its JSON says it is this kind
    held_gauges: tuple[str, ...] = ()  # `/metrics` gauges whose sum is what it runs and queues
    holds_in_slots: bool = False  # `/slots` `is_processing` (llama.cpp), when `/metrics` is off
    count_slots: Callable[[Transport], Awaitable[int | None]] | None = None  # only llama.cpp says
    default_slots: int | None = None  # requests at once when it cannot say
    tokenize: TokenizeShape | None = None
    overflow: Overflow | None = None
    start_flags: Callable[[int, int, str], str] | None = None  # context per request, batch, KV cache type
    # Whether its model is unloaded now (True: asleep; None: it cannot say), read without waking it or keeping it
    # awake; and its cheapest request that loads the model again (None: a prefill-only completion of the prompt,
    # which also fills its prompt cache for the keystrokes after it).
    asleep: Callable[[Transport], Awaitable[bool | None]] | None = None
    wake: Callable[[Transport], Awaitable[None]] | None = None
    keep_alive: bool = False  # it takes `keep_alive` (how long to keep the model loaded) on every completion
    # Its slots' prompt caches saved to its disk before it sleeps, and restored by the wake (llama.cpp with
    # `--slot-save-path`): `save_slots` says how many it saved (raising where it cannot save at all).
    save_slots: Callable[[Transport], Awaitable[int]] | None = None
    restore_slots: Callable[[Transport], Awaitable[int]] | None = None
    cache_per_slot: bool = False  # each slot keeps its own prompt cache (all empty after a sleep)
    memory: Memory | None = None  # for the planning tools; None: it does not load models itself
