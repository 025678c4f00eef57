"""The contract between the completion service and a dialect's response shape.

The service calls `send_chunk` for each upstream chunk as it arrives, then exactly one of
`finish` (with the outcome) or `fail` (with an error). A streaming writer sends its headers with
the first chunk, so an outcome decided before any token (debounced, queue full, ...) still
reaches the `X-Mellum-Outcome` header.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from proxy.errors import InvalidRequestError, ProxyError
from proxy.models import Chunk, Completion, Outcome

OUTCOME_HEADER = "X-Mellum-Outcome"


class ResponseWriter(Protocol):
    async def send_chunk(self, completion: Completion, chunk: Chunk) -> None: ...

    async def finish(self, completion: Completion, outcome: Outcome) -> web.StreamResponse: ...

    async def fail(self, error: ProxyError) -> web.StreamResponse: ...


def error_body(error: ProxyError) -> dict[str, Any]:
    """The OpenAI error shape, used by every endpoint that has no shape of its own."""
    return {"error": {"message": error.message, "type": error.type}}


class FieldReader:
    """Typed access to a JSON object's fields; wrong types raise `InvalidRequestError` naming the field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.used: set[str] = set()

    def _get(self, name: str) -> Any:
        self.used.add(name)
        return self.body.get(name)

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise InvalidRequestError(f"'{name}' must be a string")
        return value

    def integer(self, name: str, minimum: int | None = None) -> int | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"'{name}' must be an integer")
        if minimum is not None and value < minimum:
            raise InvalidRequestError(f"'{name}' must be >= {minimum}")
        return value

    def number(self, name: str) -> float | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"'{name}' must be a number")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidRequestError(f"'{name}' must be a boolean")
        return value

    def stop(self, name: str) -> str | list[str] | None:
        value = self._get(name)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        raise InvalidRequestError(f"'{name}' must be a string or a list of strings")

    def rest(self) -> dict[str, Any]:
        """Fields not read so far (passed through to the upstream unchanged)."""
        return {key: value for key, value in self.body.items() if key not in self.used}
