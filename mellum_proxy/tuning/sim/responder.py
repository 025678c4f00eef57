"""The one OpenAI `/v1/completions` answer every fake server writes (bench's and the tests'): an event per
piece and a last event with the finish reason and usage, then `[DONE]`, when the client asked to stream;
else one `text_completion` object with the whole text. What a fake does between pieces (wait, stall,
count, fail) is its own."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from mellum_proxy.dialects.openai import DONE, sse, text_completion


class Responder:
    """One answer to one completion request.

    Usage: `await answer.start()` (sends the headers when streaming), `await answer.write(pieces)` any
    number of times, `return await answer.finish(reason, usage)`.
    """

    def __init__(self, request: web.Request, payload: dict[str, Any], ident: str, model: str) -> None:
        self.request = request
        self.stream = bool(payload.get("stream"))
        self.ident, self.model, self.created = ident, model, int(time.time())
        self.text = ""
        self.response: web.StreamResponse | None = None

    def event(self, text: str, finish: str | None = None, **extra: Any) -> bytes:
        """One stream event of this answer (`extra`: more top-level fields, e.g. `usage`)."""
        return sse(text_completion(self.ident, self.created, self.model, text, finish) | extra)

    async def start(self) -> None:
        if self.stream and self.response is None:
            self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await self.response.prepare(self.request)

    async def write(self, *pieces: str) -> None:
        """Pieces of the text, in one write when streaming."""
        self.text += "".join(pieces)
        if self.stream:
            await self.start()
            assert self.response is not None
            await self.response.write(b"".join(self.event(piece) for piece in pieces))

    async def finish(self, reason: str | None, usage: dict[str, Any] | None = None) -> web.StreamResponse:
        """The last event and `[DONE]` (streaming), or the whole answer as one JSON object."""
        if not self.stream:
            return web.json_response(text_completion(self.ident, self.created, self.model, self.text, reason, usage))
        await self.start()
        assert self.response is not None
        extra = {} if usage is None else {"usage": usage}
        await self.response.write(self.event("", reason, **extra) + DONE)
        await self.response.write_eof()
        return self.response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def routes(table: Mapping[str, Handler]) -> web.Application:
    """An app from `{"POST /v1/completions": handler, "GET /health": handler, ...}` (a path may hold a
    pattern: `"* /{tail:.*}"`)."""
    app = web.Application()
    for route, handler in table.items():
        method, _, path = route.partition(" ")
        app.router.add_route(method, path, handler)
    return app


def answering(body: Any, status: int = 200) -> Handler:
    """A handler that answers every request with `body` as JSON."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return handle
