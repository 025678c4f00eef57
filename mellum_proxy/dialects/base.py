"""What every dialect is made of, and the helpers they share.

A `Dialect` owns its wire format end to end: the parsers of its completion routes (body ->
`NormalizedRequest`), its `Encoder` (completion -> the bytes the client reads), its error shape,
and the discovery calls its plugins make first. The HTTP edge (`mellum_proxy.http`) generates the routes
from the registry in `mellum_proxy.dialects`; nothing here knows about HTTP servers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from mellum_proxy.errors import InvalidRequestError, ProxyError
from mellum_proxy.models import ANONYMOUS_SESSION, Chunk, Completion, NormalizedRequest, Outcome

OUTCOME_HEADER = "X-Mellum-Outcome"

Parser = Callable[[Any, Mapping[str, str], str], NormalizedRequest]


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's text. Bytes that are not UTF-8 (which aiohttp keeps as lone surrogates, and no JSON
    encoder writes) become U+FFFD."""
    value = headers.get(name)
    if value is None or value.isascii():
        return value
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")


def session_key(headers: Mapping[str, str], user: str | None = None) -> str:
    """`X-Session-Id`, else the body's `user`, else `default` and the client's `User-Agent`: clients that say
    nothing of themselves do not share one session (its supersede, its typing rhythm, its reuse entries)."""
    named = header(headers, "X-Session-Id") or user
    if named:
        return named
    agent = header(headers, "User-Agent")
    return f"{ANONYMOUS_SESSION}/{agent[:64]}" if agent else ANONYMOUS_SESSION


class ServedModels(Protocol):
    """What a plugin's discovery calls (`/api/tags`, `/api/show`) may ask of the proxy: the models it serves and
    the context a request gets (not `mellum_proxy.discovery.Discovery`, which finds them out)."""

    max_context_tokens: int

    async def model_ids(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class CompletionRoute:
    """`POST path` parsed by `parse`; `name` is the record's `dialect` field."""

    path: str
    name: str
    parse: Parser


@dataclass(frozen=True, slots=True)
class DiscoveryRoute:
    """A call plugins make before completing (model lists, versions), answered as JSON by the proxy."""

    method: str
    path: str
    answer: Callable[[ServedModels, Any], Awaitable[Any]]  # (discovery, parsed body or None) -> JSON


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    completions: tuple[CompletionRoute, ...]
    encoder: Callable[[NormalizedRequest], Encoder]
    error_body: Callable[[ProxyError], Any]
    discovery: tuple[DiscoveryRoute, ...] = ()
    passthrough: tuple[tuple[str, str], ...] = ()  # (method, path) forwarded to the upstream unchanged


def openai_error(error: ProxyError) -> dict[str, Any]:
    """The OpenAI error shape, used by every endpoint that has no shape of its own."""
    return {"error": {"message": error.message, "type": error.type}}


def finish_reason(completion: Completion, outcome: Outcome) -> str:
    """Why the answer ended: the upstream's reason, else `length` for a completion that was cut (a timeout, or
    a cancel after some text: a cut completion never says `stop`), `stop` otherwise."""
    if completion.finish_reason:
        return completion.finish_reason
    if outcome is Outcome.TIMEOUT or (outcome in (Outcome.CANCELLED, Outcome.SHUTDOWN) and completion.chunks):
        return "length"
    return "stop"


class Encoder:
    """One answer in a dialect's shape: events while streaming, or one JSON body at the end.

    A dialect defines `partial` and `final` (and its framing); the rest is derived.
    """

    content_type = "text/event-stream"
    end_of_stream = b"data: [DONE]\n\n"

    def __init__(self, request: NormalizedRequest) -> None:
        self.request = request

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        """A streamed piece that does not end the answer."""
        raise NotImplementedError

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        """The piece that ends the answer with `text`; with the whole text, also the non-streamed body."""
        raise NotImplementedError

    def stream_error(self, error: ProxyError) -> Any:
        """The event that reports an error once the stream has started (its status is already sent)."""
        return openai_error(error)

    def frame(self, payload: Any) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def event(self, completion: Completion, chunk: Chunk) -> bytes:
        if chunk.finish_reason is not None:
            return self.frame(self.final(completion, Outcome.OK, chunk.text))
        return self.frame(self.partial(completion, chunk))

    def events(self, completion: Completion, chunks: Sequence[Chunk]) -> bytes:
        """A batch of chunks as one write."""
        if len(chunks) == 1:
            return self.event(completion, chunks[0])
        return b"".join([self.event(completion, chunk) for chunk in chunks])

    def closing(self, completion: Completion, outcome: Outcome) -> bytes:
        """What ends a started stream: the final event when the upstream sent none, then the end marker."""
        last = b"" if completion.finish_reason is not None else self.frame(self.final(completion, outcome, ""))
        return last + self.end_of_stream

    def failing(self, completion: Completion, error: ProxyError, final_sent: bool = False) -> bytes:
        """What ends a started stream that failed: the error event, then the dialect's own end (the final
        event unless it was sent already, and the end marker), so that a client waiting for the end sees it."""
        try:
            last = b"" if final_sent else self.frame(self.final(completion, Outcome.OK, ""))
        except Exception:  # the last resort: when the final event is what failed, the stream ends without it
            last = b""
        return self.frame(self.stream_error(error)) + last + self.end_of_stream

    def body(self, completion: Completion, outcome: Outcome) -> bytes:
        """The whole non-streamed answer."""
        return orjson.dumps(self.final(completion, outcome, completion.text))


class FieldReader:
    """Typed access to a JSON object's fields; wrong types raise `InvalidRequestError` naming the field."""

    def __init__(self, body: dict[str, Any], prefix: str = "") -> None:
        self.body = body
        self.prefix = prefix
        self.used: set[str] = set()

    def _name(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def raw(self, name: str) -> Any:
        self.used.add(name)
        return self.body.get(name)

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise InvalidRequestError(f"'{self._name(name)}' must be a string")
        return value

    def integer(self, name: str, minimum: int | None = None) -> int | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"'{self._name(name)}' must be an integer")
        if minimum is not None and value < minimum:
            raise InvalidRequestError(f"'{self._name(name)}' must be >= {minimum}")
        return value

    def number(self, name: str) -> float | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"'{self._name(name)}' must be a number")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidRequestError(f"'{self._name(name)}' must be a boolean")
        return value

    def stop(self, name: str) -> str | list[str] | None:
        value = self.raw(name)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        raise InvalidRequestError(f"'{self._name(name)}' must be a string or a list of strings")

    def sampling(self, names: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p")) -> dict[str, Any]:
        """The numeric sampling parameters that are present, validated."""
        params: dict[str, Any] = {}
        for name in names:
            value = self.number(name)
            if value is not None:
                params[name] = value
        seed = self.integer("seed")
        if seed is not None:
            params["seed"] = seed
        stop = self.stop("stop")
        if stop is not None:
            params["stop"] = stop
        return params

    def rest(self, drop: tuple[str, ...] = ()) -> dict[str, Any]:
        """Fields not read so far (passed through to the upstream unchanged), less `drop` and `SERVER_OWNED`.

        `stream_options` is passed through too, but the proxy adds to it, so it must be an object.
        """
        options = self.body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise InvalidRequestError(f"'{self._name('stream_options')}' must be an object")
        rest = {
            key: value for key, value in self.body.items()
            if key not in self.used and key not in drop and key not in SERVER_OWNED
        }  # fmt: skip
        for key, value in rest.items():
            if isinstance(value, dict | list) and too_deep(value, MAX_NESTING):
                raise InvalidRequestError(f"'{self._name(key)}' is nested more than {MAX_NESTING} levels deep")
        return rest


# What the proxy owns on the server, never a client's to set: fields that would lift its token cap or pin the
# server's resources (llama.cpp's tools/server `params_from_json_cmpl`, vLLM's `CompletionRequest`). Dropped from
# what is passed on; `n_predict` and `max_completion_tokens` may only lower `max_tokens` (`capped_max_tokens`).
SERVER_OWNED = frozenset(
    {
        "n_predict",  # llama.cpp reads it before `max_tokens`: it would lift the proxy's cap
        "max_completion_tokens",
        "id_slot",
        "slot_id",  # pins one of the slots the proxy shares among sessions
        "n_cmpl",
        "n",
        "best_of",  # several completions for one (the proxy streams and reads one)
        "min_tokens",
        "ignore_eos",  # decodes past the end the model chose
        "n_keep",
        "t_max_prompt_ms",
        "priority",  # the server's cache, time and queue order are the proxy's to set
    }
)


def capped_max_tokens(fields: FieldReader, max_tokens: int | None, *names: str) -> int | None:
    """`max_tokens` lowered to any of `names` the client also sent (never raised by one)."""
    for name in names:
        other = fields.integer(name, minimum=-1)
        if other is not None and other >= 0:
            max_tokens = other if max_tokens is None else min(max_tokens, other)
    return max_tokens


MAX_NESTING = 64  # of a field passed on; orjson writes at most 254 levels, and no sampling option needs many


def too_deep(value: Any, limit: int) -> bool:
    """Whether lists and objects inside `value` nest deeper than `limit` (no recursion)."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            inner for outer in level for inner in (outer.values() if isinstance(outer, dict) else outer)
            if isinstance(inner, dict | list)
        ]  # fmt: skip
        if not level:
            return False
    return True


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body
