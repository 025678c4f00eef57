"""The routes the proxy forwards unchanged (chat completions, the model list), and the bulk lane they run in.

A forwarded POST generates on the server (chat, agents, tools): a *bulk* request. It takes a slot of the bulk
lane (`AdmissionQueue.acquire_bulk`: counted against the server's slots, never the `completion_reserve` ones,
waiting in the proxy behind any waiting completion for at most `bulk_wait_ms`), holds it until its answer has
been passed on whole, and leaves a record (lane `bulk`: times and status, never its text). A completion never
cancels a bulk request that runs. A GET (`/v1/models`) is one small read and takes no slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from mellum_proxy.dialects.base import openai_error, session_key
from mellum_proxy.dialects.openai import DONE, sse
from mellum_proxy.errors import ProxyError, ServiceUnavailableError
from mellum_proxy.http import connections
from mellum_proxy.http.bodies import read_json
from mellum_proxy.http.keys import POLICIES, SECTIONS, STARTED, TELEMETRY, UPSTREAMS
from mellum_proxy.http.middleware import request_id
from mellum_proxy.models import Outcome
from mellum_proxy.policies import QueueFullError
from mellum_proxy.upstream.passthrough import relay

GET_SILENCE_S = 5.0  # the most a forwarded GET (`/v1/models`) waits for the upstream's answer
BULK_DIALECT = "openai-chat"  # what a bulk record names as its `dialect`
STALLED = web.RequestKey("stalled", bool)  # its client was let go for reading nothing
WHOLE = web.RequestKey("whole", int)  # the answer's last event, `[DONE]`, was passed on (the answer's status)
DONE_MARK = b"data: [DONE]"


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Forward unchanged; a POST in the bulk lane (see the module docstring)."""
    if request.method != "POST":
        return await forward(request, None)
    await read_json(request)  # bad JSON is our 400, not the upstream's
    body = await request.read()  # cached by aiohttp
    app = request.app
    telemetry, admission, policies = app[TELEMETRY], app[POLICIES].admission, app[POLICIES]
    record = telemetry.start_bulk(request_id(request), session_key(request.headers), BULK_DIALECT)
    try:
        lease = await admission.acquire_bulk(policies.bulk_wait_s)
    except (QueueFullError, TimeoutError) as exc:
        record.ended(Outcome.QUEUE_FULL if isinstance(exc, QueueFullError) else Outcome.TIMEOUT)
        telemetry.finish_bulk(record)
        raise ServiceUnavailableError(
            f"the server's slots are busy: {admission.bulk_running} chat or agent requests run, "
            f"{admission.bulk_depth} wait, {admission.reserve} slot(s) kept for completions; try again shortly"
        ) from exc
    record.queued((policies.clock.now() - record.started) * 1000)
    record.sent()
    try:
        response = await forward(request, body, lambda: telemetry.first_token(record))
        record.ended(Outcome.CLIENT_GONE if request.get(STALLED) else Outcome.OK, response.status)
        return response
    except ProxyError as error:
        record.ended(Outcome.UPSTREAM_ERROR, error.upstream_status, error.kind)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        # a client that hangs up once it has read `[DONE]` got the whole answer: that is no client gone
        whole = request.get(WHOLE)
        record.ended(Outcome.OK if whole else Outcome.CLIENT_GONE, whole)
        raise
    finally:
        lease.release()
        telemetry.finish_bulk(record)


async def forward(
    request: web.Request, body: bytes | None, first_byte: Callable[[], None] | None = None
) -> web.StreamResponse:
    """Forward unchanged. An event stream is piped back as it arrives, and a failure after it started ends it
    with an error event and `[DONE]`; any other answer is read whole first, so that a failure is still an error
    response. `first_byte` is called when the answer's first byte is passed on."""
    content_type = request.headers.get("Content-Type", "application/json")
    if not content_type.isascii():
        content_type = "application/json"
    silence_s = request.app[SECTIONS].upstream.passthrough_silence_s
    if request.method == "GET":  # a model list is one small read: a server silent this long is stalled
        silence_s = min(silence_s or GET_SILENCE_S, GET_SILENCE_S)
    upstream = request.app[UPSTREAMS].client  # the one serving now
    async with relay(upstream, request.method, request.path, body, content_type, silence_s) as answer:
        if answer.content_type != "text/event-stream":
            whole = b"".join([data async for data in answer.body])
            if first_byte is not None:
                first_byte()
            out = web.Response(status=answer.status, body=whole, content_type=answer.content_type)
            if answer.charset:
                out.charset = answer.charset
            return out
        stream = web.StreamResponse(status=answer.status)
        stream.content_type = answer.content_type
        request[STARTED] = True
        await stream.prepare(request)
        try:
            tail = b""  # the end of what was passed on: `[DONE]` may come split over two reads
            async for data in answer.body:
                if first_byte is not None:
                    first_byte()
                    first_byte = None
                await _write(stream, data)
                tail = (tail + data)[-32:]
                if tail.rstrip().endswith(DONE_MARK):  # the client has its whole answer, whenever it hangs up
                    request[WHOLE] = answer.status
        except ProxyError as error:
            await _write(stream, b"\n\n" + sse(openai_error(error)) + DONE)  # the blank line ends a cut event
        except _Stalled:
            # a client that reads none of its answer for STALLED_S (a chat that stopped reading) is let go, as the
            # page's streams are, and its slot with it; aiohttp ends the closed connection quietly
            request[STALLED] = True
            if request.transport is not None:
                request.transport.abort()
            return stream
        await stream.write_eof()
        return stream


class _Stalled(Exception):
    """The client read nothing of its answer for `STALLED_S`."""


async def _write(stream: web.StreamResponse, data: bytes) -> None:
    try:
        async with asyncio.timeout(connections.STALLED_S):
            await stream.write(data)
    except TimeoutError:
        raise _Stalled from None
