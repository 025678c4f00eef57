"""`HttpAnswer`: the completion service's `Answer` protocol over one aiohttp response.

A streamed answer sends its headers with the first event, so an outcome decided before any token
(debounced, queue full, ...) still reaches the `X-Mellum-Outcome` header. An error before anything
was sent is kept and raised by the handler, so the error middleware renders it in the route's
dialect; once the stream has started the status cannot change, and the encoder ends it instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from mellum_proxy.dialects.base import OUTCOME_HEADER, Encoder
from mellum_proxy.errors import ProxyError
from mellum_proxy.http.keys import STARTED
from mellum_proxy.models import Chunk, Completion, Outcome


class _Stream(web.StreamResponse):
    """A streamed answer whose headers go out with its first write (an event, or the end), in one send: the
    client reads them together, one wake-up and one system call sooner. aiohttp's own `web.Response` defers them
    the same way; where a later aiohttp drops the flag, they go out at `prepare` as before."""

    _send_headers_immediately = False


class HttpAnswer:
    def __init__(self, http_request: web.Request, encoder: Encoder) -> None:
        self.http_request = http_request
        self.encoder = encoder
        self.response: web.StreamResponse | None = None
        self.error: ProxyError | None = None
        self.final_sent = False  # whether the client has the event that ends the answer

    async def _start(self, outcome: Outcome | None) -> web.StreamResponse:
        if self.response is None:
            headers = {"Content-Type": self.encoder.content_type, "Cache-Control": "no-cache"}
            if outcome is not None:
                headers[OUTCOME_HEADER] = outcome.value
            response = _Stream(headers=headers)
            self.http_request[STARTED] = True  # from now on no error may be answered as a response
            await response.prepare(self.http_request)
            self.response = response
        return self.response

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None:
        if self.encoder.request.stream:
            response = self.response or await self._start(None)
            await response.write(self.encoder.events(completion, chunks))
            self.final_sent = completion.finish_reason is not None  # folded before it is sent: now it is

    async def finish(self, completion: Completion, outcome: Outcome) -> None:
        if not self.encoder.request.stream:
            self.response = web.Response(
                body=self.encoder.body(completion, outcome),
                content_type="application/json",
                headers={OUTCOME_HEADER: outcome.value},
            )
            return
        response = await self._start(outcome)
        await response.write_eof(self.encoder.closing(completion, outcome))  # one write with the chunked end

    async def fail(self, completion: Completion, error: ProxyError) -> None:
        if self.response is None:
            self.error = error
            return
        await self.response.write_eof(self.encoder.failing(completion, error, self.final_sent))

    def result(self) -> web.StreamResponse:
        """The response to return from the handler; an early error is raised for the middleware."""
        if self.error is not None:
            raise self.error
        assert self.response is not None, "the service answered neither finish nor fail"
        return self.response
