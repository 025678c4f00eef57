"""The contract between the completion service and a dialect's response shape, and shared helpers.

The service calls `send_chunk` for each upstream chunk as it arrives, then exactly one of `finish`
(with the outcome) or `fail` (with an error). `StreamWriter` implements that lifecycle once: a
streaming answer sends its headers with the first event, so an outcome decided before any token
(debounced, queue full, ...) still reaches the `X-Mellum-Outcome` header; a dialect only says how
its events, its final event and its whole-body answer look.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from aiohttp import web

from proxy.errors import InvalidRequestError, ProxyError
from proxy.models import Chunk, Completion, NormalizedRequest, Outcome

OUTCOME_HEADER = "X-Mellum-Outcome"


class ResponseWriter(Protocol):
    async def send_chunk(self, completion: Completion, chunk: Chunk) -> None: ...

    async def finish(self, completion: Completion, outcome: Outcome) -> web.StreamResponse: ...

    async def fail(self, error: ProxyError) -> web.StreamResponse: ...


def error_body(error: ProxyError) -> dict[str, Any]:
    """The OpenAI error shape, used by every endpoint that has no shape of its own."""
    return {"error": {"message": error.message, "type": error.type}}


def finish_reason(completion: Completion, outcome: Outcome) -> str:
    """Why the answer ended: the upstream's reason, else `length` for a timeout, `stop` otherwise."""
    return completion.finish_reason or ("length" if outcome is Outcome.TIMEOUT else "stop")


class StreamWriter:
    """One answer in a dialect's shape: events while streaming, or one JSON body at the end."""

    content_type = "text/event-stream"

    def __init__(self, http_request: web.Request, request: NormalizedRequest, body: Any = None) -> None:
        """`body` is the client's parsed JSON, for dialects whose answer depends on it."""
        self.http_request = http_request
        self.request = request
        self.response: web.StreamResponse | None = None

    # --- what a dialect defines -----------------------------------------------------------
    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        """A streamed piece that does not end the answer."""
        raise NotImplementedError

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        """The piece that ends the answer with `text`; with the whole text, also the non-streamed body."""
        raise NotImplementedError

    # --- derived from those -----------------------------------------------------------------
    def event(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        if chunk.finish_reason is not None:
            return self.final(completion, Outcome.OK, chunk.text)
        return self.partial(completion, chunk)

    def last_event(self, completion: Completion, outcome: Outcome) -> dict[str, Any] | None:
        """The closing event when the answer ended early (the upstream sent no final chunk)."""
        return self.final(completion, outcome, "")

    def body(self, completion: Completion, outcome: Outcome) -> dict[str, Any]:
        return self.final(completion, outcome, completion.text)

    @classmethod
    def error(cls, error: ProxyError) -> dict[str, Any]:
        return error_body(error)

    def frame(self, payload: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    end_of_stream = b"data: [DONE]\n\n"

    # --- the lifecycle ----------------------------------------------------------------------
    async def _start(self, outcome: Outcome | None) -> web.StreamResponse:
        if self.response is None:
            response = web.StreamResponse(headers={"Content-Type": self.content_type, "Cache-Control": "no-cache"})
            if outcome is not None:
                response.headers[OUTCOME_HEADER] = outcome.value
            await response.prepare(self.http_request)
            self.response = response
        return self.response

    async def send_chunk(self, completion: Completion, chunk: Chunk) -> None:
        if self.request.stream:
            response = await self._start(None)
            await response.write(self.frame(self.event(completion, chunk)))

    async def finish(self, completion: Completion, outcome: Outcome) -> web.StreamResponse:
        if not self.request.stream:
            return web.Response(
                body=orjson.dumps(self.body(completion, outcome)),
                content_type="application/json",
                headers={OUTCOME_HEADER: outcome.value},
            )
        response = await self._start(outcome)
        if completion.finish_reason is None:  # ended early: close the answer as the client expects
            last = self.last_event(completion, outcome)
            if last is not None:
                await response.write(self.frame(last))
        if self.end_of_stream:
            await response.write(self.end_of_stream)
        await response.write_eof()
        return response

    async def fail(self, error: ProxyError) -> web.StreamResponse:
        if self.response is None:
            return web.Response(
                body=orjson.dumps(self.error(error)), status=error.status, content_type="application/json"
            )
        # Headers are gone: the status cannot change. End the stream with an error event.
        await self.response.write(self.frame(self.error(error)))
        if self.end_of_stream:
            await self.response.write(self.end_of_stream)
        await self.response.write_eof()
        return self.response


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
        """Fields not read so far (passed through to the upstream unchanged), less `drop`."""
        return {key: value for key, value in self.body.items() if key not in self.used and key not in drop}


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body
