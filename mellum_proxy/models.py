"""The one internal request shape, the pieces of an upstream answer, and request outcomes.

Every editor dialect parses into a `NormalizedRequest`; policies, the context budget and the
upstream client only ever see this object, never a wire format.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from mellum_proxy.errors import ProxyError


ANONYMOUS_SESSION = "default"  # the session of a client that names none (`default/<User-Agent>`)


class Outcome(enum.StrEnum):
    """How a client request ended. The names are stable: they appear in logs and headers."""

    OK = "ok"
    REUSED = "reused"  # answered from the session's previous completion, no upstream request
    DEBOUNCED = "debounced"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    QUEUE_FULL = "queue_full"
    CLIENT_GONE = "client_gone"
    SKIPPED = "skipped"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"  # a defect in the proxy: logged with its traceback, answered as a 500
    SHUTDOWN = "shutdown"  # still being served at the end of the shutdown grace: answered with what it had
    BAD_REQUEST = "bad_request"


@dataclass(frozen=True, slots=True)
class NormalizedRequest:
    """A completion request, independent of the dialect it arrived in.

    Attributes:
        id: the proxy's request id (also sent back as `X-Request-Id`).
        route: the name of the dialect's route it came in by (`openai`, `llamacpp-infill`, `ollama`, ...); the
            request log keeps it as `dialect`.
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
        edit_region: the edit-prediction format of a prompt the client built around an editable region
            (`zeta`, `zeta2`, `sweep`; `mellum_proxy.edit_region`): passed through untouched. None: a completion.
        keep_alive: how long the client asked an Ollama server to keep its model loaded (Ollama's `keep_alive`:
            a duration string or seconds), passed to a server that takes it; None: the `keep_alive` setting.
    """

    id: str
    route: str
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
    edit_region: str | None = None
    keep_alive: str | int | float | None = None

    @property
    def warm_up(self) -> bool:
        """A cache-warming request (`n_predict: 0`): fill the prompt cache, generate nothing."""
        return self.max_tokens == 0


class Chunk:
    """One streamed piece of an upstream completion.

    `raw` is its event's JSON as the upstream sent it (an OpenAI `text_completion` event). A plain
    text event (no finish reason, usage or error) may arrive unparsed (`text=None`): its text is read
    from `raw` only when someone asks, so a dialect that passes the event on as it came never parses it.
    """

    __slots__ = ("_text", "created", "finish_reason", "model", "raw", "timings", "upstream_id", "usage")

    def __init__(
        self,
        text: str | None = "",
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        timings: dict[str, Any] | None = None,
        model: str | None = None,
        created: int | None = None,
        upstream_id: str | None = None,
        raw: bytes | None = None,
    ) -> None:
        self._text = text
        self.finish_reason = finish_reason
        self.usage = usage
        self.timings = timings
        self.model = model
        self.created = created
        self.upstream_id = upstream_id
        self.raw = raw

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _event_text(self.raw or b"")
        return self._text

    @property
    def has_text(self) -> bool:
        """Whether the chunk carries text, without parsing an unparsed one (`"text":""` cannot occur
        inside a JSON string, where quotes are escaped)."""
        if self._text is None:
            return b'"text":""' not in (self.raw or b"")
        return bool(self._text)

    def __repr__(self) -> str:
        return f"Chunk(text={self._text!r}, finish_reason={self.finish_reason!r}, raw={len(self.raw or b'')} bytes)"


def _event_text(raw: bytes) -> str:
    """The first choice's text of an OpenAI event; "" when it has none (never raises: the event has
    already been passed on)."""
    try:
        text = orjson.loads(raw)["choices"][0]["text"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return ""
    return text if isinstance(text, str) else ""


@dataclass(slots=True)
class Origin:
    """What is known of the upstream request a completion comes from. Born in its flight (the task that streams
    it) and shared, not copied, with every request it answers: its own, one that took it over, a typed-through
    keystroke answered from it."""

    model: str = ""
    created: int = 0
    upstream_id: str | None = None  # the upstream's own id for it, if it gave one
    served_by: str | None = None  # which upstream answered (of several; `mellum_proxy.upstream.failover`)
    context_tokens: int = 0  # the context per request it was fitted to (llama.cpp's `n_ctx`)
    max_tokens: int = 0  # the most tokens it may generate (llama.cpp's `n_predict`)


@dataclass(slots=True)
class Completion:
    """What the upstream produced for one request so far (aggregated from chunks), and its `origin`.

    `text` is joined from the chunks when asked for, so unparsed chunks stay unparsed until then.
    """

    id: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    chunks: int = 0
    truncated: bool = False  # the context budget cut the prompt
    text_chunks: int = 0  # chunks that carried text: the tokens generated (servers stream a token an event)
    origin: Origin = field(default_factory=Origin)
    _pieces: list[Chunk] = field(default_factory=list, repr=False)

    # The origin's facts, read where the completion is encoded and recorded.
    model = property(lambda self: self.origin.model)
    created = property(lambda self: self.origin.created)
    upstream_id = property(lambda self: self.origin.upstream_id)
    served_by = property(lambda self: self.origin.served_by)
    context_tokens = property(lambda self: self.origin.context_tokens)
    max_tokens = property(lambda self: self.origin.max_tokens)

    @property
    def text(self) -> str:
        pieces = self._pieces
        if len(pieces) > 1:
            self._pieces = pieces = [Chunk("".join([chunk.text for chunk in pieces]))]
        return pieces[0].text if pieces else ""

    def count_usage(self, prompt_tokens: int, completion_tokens: int | None = None) -> None:
        """`usage` as the proxy counts it, when the upstream's never came (the proxy closed the stream first, or
        answered from an earlier completion): `completion_tokens` (default: the chunks with text), never 0
        after real text."""
        if self.usage is not None and self.usage.get("completion_tokens"):
            if "total_tokens" not in self.usage:  # a client may require it (Zed's edit predictions do)
                counts = [self.usage.get(name) for name in ("prompt_tokens", "completion_tokens")]
                self.usage["total_tokens"] = sum(c for c in counts if isinstance(c, int))
            return
        generated = self.text_chunks if completion_tokens is None else completion_tokens
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}  # fmt: skip

    @property
    def has_text(self) -> bool:
        """Whether any text was added (without parsing events that arrived unparsed)."""
        return any(chunk.has_text for chunk in self._pieces)

    def add(self, chunk: Chunk) -> None:
        """Fold one chunk into the aggregate."""
        self._pieces.append(chunk)
        self.chunks += 1
        self.text_chunks += chunk.has_text
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.timings is not None:
            self.timings = chunk.timings
        origin = self.origin
        if not origin.model and chunk.model:
            origin.model = chunk.model
        if not origin.created and chunk.created:
            origin.created = chunk.created
        if origin.upstream_id is None:
            origin.upstream_id = chunk.upstream_id


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
    context_tokens: int = 0  # the context per request it was fitted to (prompt + max_tokens stay within)


Batches = AsyncGenerator[list[Chunk], None]  # an upstream completion: the chunks of each network read


class Answer(Protocol):
    """Where the completion service sends one request's answer; the HTTP edge implements it.

    The service calls `send` with each batch of upstream chunks as it arrives (one network read's
    worth, already folded into `completion`), then exactly one of `finish` (with the outcome) or
    `fail` (with the error).
    """

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None: ...

    async def finish(self, completion: Completion, outcome: Outcome) -> None: ...

    async def fail(self, completion: Completion, error: ProxyError) -> None: ...
