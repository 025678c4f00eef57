"""OpenAI `POST /v1/completions`: parse into a `NormalizedRequest`, answer as OpenAI does.

Clients: minuet-ai, Tabby's OpenAI backend, JetBrains AI Assistant's OpenAI-compatible provider,
Continue's OpenAI provider.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.dialects.base import OUTCOME_HEADER, FieldReader, error_body
from proxy.errors import InvalidRequestError, ProxyError
from proxy.models import Chunk, Completion, NormalizedRequest, Outcome

DIALECT = "openai"

# Why a request that ended early says it ended (OpenAI has only "stop" and "length").
_EARLY_FINISH = {Outcome.TIMEOUT: "length"}


def session_key(headers: Mapping[str, str], user: str | None) -> str:
    """`X-Session-Id`, else the body's `user`, else `default`."""
    return headers.get("X-Session-Id") or user or "default"


def parse_completion(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    """Validate an OpenAI text-completion body.

    Raises:
        InvalidRequestError: the body is not an object, or a field has the wrong type.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    fields = FieldReader(body)
    prompt = fields._get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise InvalidRequestError("'prompt' must be a string (or a list of exactly one string)")
    n = fields.integer("n", minimum=1)
    if n not in (None, 1):
        raise InvalidRequestError("'n' must be 1: the proxy serves one completion per request")
    params: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        value = fields.number(name)
        if value is not None:
            params[name] = value
    seed = fields.integer("seed")
    if seed is not None:
        params["seed"] = seed
    stop = fields.stop("stop")
    if stop is not None:
        params["stop"] = stop
    user = fields.string("user")
    suffix = fields.string("suffix")
    max_tokens = fields.integer("max_tokens", minimum=0)
    stream = fields.boolean("stream")
    params.update(fields.rest())
    return NormalizedRequest(
        id=request_id,
        dialect=DIALECT,
        session=session_key(headers, user),
        prefix=prompt,
        suffix=suffix,
        stream=stream,
        max_tokens=max_tokens,
        params=params,
        file_path=headers.get("X-File-Path"),
        language=headers.get("X-Language"),
    )


def completion_object(completion: Completion, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One OpenAI `text_completion` object (a whole response, or one stream chunk)."""
    body: dict[str, Any] = {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created or int(time.time()),
        "model": completion.model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
    }
    return body


class CompletionWriter:
    """Writes an OpenAI completion answer: SSE chunks for `stream: true`, else one JSON body."""

    def __init__(self, http_request: web.Request, request: NormalizedRequest) -> None:
        self.http_request = http_request
        self.request = request
        self.response: web.StreamResponse | None = None

    async def _start_stream(self, outcome: Outcome | None) -> web.StreamResponse:
        if self.response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            if outcome is not None:
                response.headers[OUTCOME_HEADER] = outcome.value
            await response.prepare(self.http_request)
            self.response = response
        return self.response

    async def _send_event(self, body: dict[str, Any]) -> None:
        response = await self._start_stream(None)
        await response.write(b"data: " + orjson.dumps(body) + b"\n\n")

    async def send_chunk(self, completion: Completion, chunk: Chunk) -> None:
        if not self.request.stream:
            return  # the aggregate in `completion` is answered by `finish`
        body = completion_object(completion, chunk.text, chunk.finish_reason)
        if chunk.usage is not None:
            body["usage"] = chunk.usage
        await self._send_event(body)

    async def finish(self, completion: Completion, outcome: Outcome) -> web.StreamResponse:
        finish_reason = completion.finish_reason or _EARLY_FINISH.get(outcome, "stop")
        if not self.request.stream:
            body = completion_object(completion, completion.text, finish_reason)
            if completion.usage is not None:
                body["usage"] = completion.usage
            return web.Response(
                body=orjson.dumps(body),
                content_type="application/json",
                headers={OUTCOME_HEADER: outcome.value},
            )
        response = await self._start_stream(outcome)
        if completion.finish_reason is None:  # ended early: close the choice as the client expects
            await self._send_event(completion_object(completion, "", finish_reason))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def fail(self, error: ProxyError) -> web.StreamResponse:
        if self.response is None:
            return web.Response(
                body=orjson.dumps(error_body(error)), status=error.status, content_type="application/json"
            )
        # Headers are gone: the status cannot change. End the stream with an error event.
        await self.response.write(b"data: " + orjson.dumps(error_body(error)) + b"\n\n")
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response
