"""Reading an OpenAI completion event stream (`text/event-stream`) into `Chunk`s.

Only `data:` lines carry events; comments, keep-alives and `event:` lines are skipped, and the
stream ends at `data: [DONE]`. An event with an `error` member is the server's own error report
(llama.cpp sends one when decoding fails mid-stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson

from proxy.errors import UpstreamProtocolError
from proxy.models import Chunk
from proxy.upstream.errors import status_error


async def read_sse(lines: AsyncIterable[bytes]) -> AsyncIterator[Chunk]:
    """Parse the stream's lines into chunks, stopping at `[DONE]`.

    Raises:
        UpstreamProtocolError: an event is not a JSON object.
        UpstreamStatusError: the server reported an error inside the stream.
    """
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError("upstream sent an unreadable stream event") from exc
        if not isinstance(event, dict):
            raise UpstreamProtocolError("upstream sent a stream event that is not an object")
        if "error" in event:
            raise status_error(500, data)
        yield chunk_from_event(event)


def chunk_from_event(event: dict[str, Any]) -> Chunk:
    """One OpenAI `text_completion` event as a `Chunk` (the first choice; the proxy asks for one)."""
    choices = event.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    return Chunk(
        text=str(choice.get("text") or ""),
        finish_reason=choice.get("finish_reason"),
        usage=event.get("usage"),
        timings=event.get("timings"),
        model=event.get("model"),
        created=event.get("created"),
        upstream_id=event.get("id"),
    )
