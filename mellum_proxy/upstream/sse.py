"""Reading an OpenAI completion event stream (`text/event-stream`) into batches of `Chunk`s.

The body is read as it arrives (`iter_any`), not line by line: each read's complete events become
one batch, so the proxy parses and writes once per network read rather than once per token. Events
follow the SSE rules: `data:` lines up to a blank line form one event (several `data:` lines are
joined into one line), comments and other fields are skipped, and the stream ends at `data: [DONE]`
(or `AFTER_FINISH_S` after the event with the finish reason, when a server never says `[DONE]`).
An event with an `error` member is the server's own error report (llama.cpp sends one when decoding
fails mid-stream). Each chunk keeps its event's JSON bytes (`raw`). Only what the record and the
answer's end need is parsed: the first event, and any event with a finish reason, usage or error;
plain text events after the first stay bytes (`Chunk.text` parses one if someone asks), so the
OpenAI dialect passes them on without decoding or encoding them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson

from mellum_proxy.errors import UpstreamProtocolError
from mellum_proxy.models import Chunk
from mellum_proxy.upstream.errors import status_error

MAX_EVENT_BYTES = 16 * 1024 * 1024  # one event larger than this is not a completion stream
DONE = b"[DONE]"
AFTER_FINISH_S = 0.25  # after the finish reason, for the usage event and `[DONE]`


class EventSplitter:
    """Bytes in, complete events' data out; keeps the unfinished tail between reads.

    Events end at a blank line. The usual event is one `data:` line, taken without a per-line loop.
    """

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._tail + data if self._tail else data
        if b"\r" in buffer:
            cr = buffer.endswith(b"\r")  # its "\n" may come with the next read
            buffer = buffer.replace(b"\r\n", b"\n")
            if cr:
                buffer, self._tail = buffer[:-1], b"\r"
                return self._split(buffer, keep_tail=True)
        return self._split(buffer, keep_tail=False)

    def close(self) -> list[bytes]:
        """The events left when the stream ends (a last event without its blank line)."""
        tail, self._tail = self._tail, b""
        return [data for data in (_event_data(tail),) if data is not None]

    def _split(self, buffer: bytes, keep_tail: bool) -> list[bytes]:
        parts = buffer.split(b"\n\n")
        tail = parts.pop()
        if len(tail) > MAX_EVENT_BYTES:
            raise UpstreamProtocolError(f"upstream sent a stream event over {MAX_EVENT_BYTES} bytes")
        self._tail = tail + self._tail if keep_tail else tail
        single_lines = buffer.count(b"\n") == 2 * len(parts) + tail.count(b"\n")
        if single_lines and all([part.startswith(b"data: ") for part in parts]):
            return [part[6:] for part in parts]  # the usual stream: every event is one `data: ` line
        events = []
        for part in parts:
            if part.startswith(b"data: ") and b"\n" not in part:
                events.append(part[6:])
            else:
                data = _event_data(part)
                if data is not None:
                    events.append(data)
        return events


def _event_data(part: bytes) -> bytes | None:
    """The data of one event's lines, None if it has none.

    SSE joins several `data:` lines with newlines; here they are joined with a space, which is the
    same JSON (a newline is only whitespace there: no JSON string holds a raw one) and keeps the
    event one line when it is passed on as it came.
    """
    data = [line[6:] if line[5:6] == b" " else line[5:] for line in part.split(b"\n") if line.startswith(b"data:")]
    if not data:
        return None
    return data[0] if len(data) == 1 else b" ".join(data)


async def read_sse(body: AsyncIterable[bytes]) -> AsyncIterator[list[Chunk]]:
    """Parse the stream into one batch of chunks per read, stopping at `[DONE]`.

    The first event is parsed (it names the model and id); after it, plain text events stay unparsed.

    Raises:
        UpstreamProtocolError: an event is not a JSON object of the completion shape.
        UpstreamStatusError: the server reported an error inside the stream.
    """
    splitter, first, finished = EventSplitter(), True, False
    reads = aiter(body)
    while True:
        try:
            if finished:  # a finish reason came: the usage event and `[DONE]` follow at once, if at all
                async with asyncio.timeout(AFTER_FINISH_S):
                    data = await anext(reads)
            else:
                data = await anext(reads)
        except StopAsyncIteration:
            break
        except TimeoutError:
            return  # a server that sent its finish reason but keeps the stream open: the answer is whole
        batch, done = _chunks(splitter.feed(data), first)
        if batch:
            first = False
            finished = finished or any(chunk.finish_reason is not None for chunk in batch)
            yield batch
        if done:
            return
    batch, _ = _chunks(splitter.close(), first)
    if batch:
        yield batch


# An event that holds this is only text on its way: its choice has no finish reason (nor is it an error report,
# which has no choice). One byte scan, and an exact one: a key's quoted name cannot occur inside a JSON string,
# whose quotes are escaped. Usage or timings such an event may carry are repeated by the event that ends the
# stream, which is always parsed.
PLAIN = b'"finish_reason":null'


def _chunks(events: list[bytes], first: bool) -> tuple[list[Chunk], bool]:
    chunks = []
    for data in events:
        if not first and PLAIN in data:
            chunks.append(Chunk(None, raw=data))
            continue
        if data.strip() == DONE:
            return chunks, True
        chunks.append(chunk_from_bytes(data))
        first = False
    return chunks, False


def chunk_from_bytes(data: bytes) -> Chunk:
    """One event's JSON as a `Chunk`, keeping the bytes."""
    return chunk_from_event(load_event(data, "stream event"), data)


def load_event(data: bytes, what: str) -> dict[str, Any]:
    """One streamed JSON object (an SSE event, an NDJSON line).

    Raises:
        UpstreamProtocolError: it is not a JSON object.
        UpstreamStatusError: it is the server's own error report (`{"error": ...}`).
    """
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(f"upstream sent an unreadable {what}") from exc
    if not isinstance(event, dict):
        raise UpstreamProtocolError(f"upstream sent a {what} that is not an object")
    if "error" in event:
        raise status_error(500, data)
    return event


def chunk_from_event(event: dict[str, Any], raw: bytes | None = None) -> Chunk:
    """One OpenAI `text_completion` object as a `Chunk` (the first choice; the proxy asks for one).

    Raises:
        UpstreamProtocolError: a field the proxy reads has the wrong type.
    """
    choices = event.get("choices")
    if type(choices) is list and choices and type(choices[0]) is dict:
        choice = choices[0]
        text, finish = choice.get("text"), choice.get("finish_reason")
    elif choices is None or type(choices) is list:
        text = finish = None
    else:
        raise UpstreamProtocolError("upstream sent 'choices' that is not a list")
    if type(text) is not str:
        if text is not None:
            raise UpstreamProtocolError("upstream sent a choice whose 'text' is not a string")
        text = ""
    if finish is not None and type(finish) is not str:
        raise UpstreamProtocolError("upstream sent a 'finish_reason' that is not a string")
    usage, timings = event.get("usage"), event.get("timings")
    if usage is not None:
        _check_numbers("usage", usage)
    if timings is not None:
        _check_numbers("timings", timings)
    model, created, ident = event.get("model"), event.get("created"), event.get("id")
    return Chunk(
        text,
        finish,
        usage,
        timings,
        model if type(model) is str else None,
        created if type(created) is int else None,
        ident if type(ident) is str else None,
        raw,
    )


def _check_numbers(name: str, value: Any) -> None:
    """`usage` and `timings` are objects whose known fields are numbers (the dialects compute with them)."""
    if type(value) is not dict:
        raise UpstreamProtocolError(f"upstream sent '{name}' that is not an object")
    for key in NUMERIC_FIELDS[name]:
        field = value.get(key)
        if field is not None and (type(field) is bool or not isinstance(field, int | float)):
            raise UpstreamProtocolError(f"upstream sent '{name}.{key}' that is not a number")


NUMERIC_FIELDS = {
    "usage": ("prompt_tokens", "completion_tokens", "total_tokens"),
    "timings": ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n", "draft_n", "draft_n_accepted"),
}
