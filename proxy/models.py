"""The one internal request shape, the pieces of an upstream answer, and request outcomes.

Every editor dialect parses into a `NormalizedRequest`; policies, the context budget and the
upstream client only ever see this object, never a wire format.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.errors import ProxyError


class Outcome(enum.StrEnum):
    """How a client request ended. The names are stable: they appear in logs and headers."""

    OK = "ok"
    DEBOUNCED = "debounced"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    QUEUE_FULL = "queue_full"
    CLIENT_GONE = "client_gone"
    SKIPPED = "skipped"
    UPSTREAM_ERROR = "upstream_error"
    BAD_REQUEST = "bad_request"


@dataclass(frozen=True, slots=True)
class NormalizedRequest:
    """A completion request, independent of the dialect it arrived in.

    Attributes:
        id: the proxy's request id (also sent back as `X-Request-Id`).
        dialect: the wire format it came in (`openai`, later `llamacpp-infill`, `ollama`, ...).
        session: key that groups requests of one editor (debounce and cancellation are per session).
        prefix: text before the cursor (for OpenAI: the `prompt`).
        suffix: text after the cursor, or None when the client sent none.
        stream: whether the client wants the answer streamed.
        max_tokens: tokens the client asked for, None when it did not say.
        params: other generation parameters (temperature, top_p, stop, seed, ...) and unknown
            fields, passed to the upstream unchanged.
        file_path: path of the edited file when the dialect carries one.
        language: the editor's language id when the dialect carries one.
        context_files: other files' text the plugin sent along, as (path, text), nearest last.
        context_tokens: the client's own context limit (Ollama `num_ctx`), when it gave one.
        response_fields: the answer fields the client asked for (llama.cpp `response_fields`), if any.
    """

    id: str
    dialect: str
    session: str
    prefix: str
    suffix: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    file_path: str | None = None
    language: str | None = None
    context_files: tuple[tuple[str, str], ...] = ()
    context_tokens: int | None = None
    response_fields: tuple[str, ...] | None = None

    @property
    def warm_up(self) -> bool:
        """A cache-warming request (`n_predict: 0`): fill the prompt cache, generate nothing."""
        return self.max_tokens == 0


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed piece of an upstream completion."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    model: str | None = None
    created: int | None = None
    upstream_id: str | None = None


@dataclass(slots=True)
class Completion:
    """What the upstream produced for one request so far (aggregated from chunks)."""

    id: str
    model: str = ""
    created: int = 0
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    chunks: int = 0
    truncated: bool = False  # the context budget cut the prompt

    def add(self, chunk: Chunk) -> None:
        """Fold one chunk into the aggregate."""
        self.text += chunk.text
        self.chunks += 1
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.timings is not None:
            self.timings = chunk.timings
        self.model = self.model or chunk.model or ""
        self.created = self.created or chunk.created or 0


@dataclass(frozen=True, slots=True)
class BudgetedPrompt:
    """A request fitted to the context budget: `prompt` (and `suffix` only for template `none`)."""

    prompt: str
    suffix: str | None
    max_tokens: int
    stops: tuple[str, ...]
    tokens_before: int
    tokens_after: int
    truncated: bool
    method: str


class Answer(Protocol):
    """Where the completion service sends one request's answer; the HTTP edge implements it.

    The service calls `send` for each upstream chunk as it arrives, then exactly one of `finish`
    (with the outcome) or `fail` (with the error).
    """

    async def send(self, completion: Completion, chunk: Chunk) -> None: ...

    async def finish(self, completion: Completion, outcome: Outcome) -> None: ...

    async def fail(self, error: ProxyError) -> None: ...
