"""The upstream event-stream reader on its own: lines in, chunks out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mellum_proxy.dialects.openai import DONE, sse, text_completion
from mellum_proxy.errors import UpstreamProtocolError, UpstreamStatusError
from mellum_proxy.models import Chunk
from mellum_proxy.upstream.sse import read_sse


async def lines(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        for line in item.splitlines(keepends=True):
            yield line


async def read(*items: bytes) -> list[Chunk]:
    return [chunk async for batch in read_sse(lines(*items)) for chunk in batch]


async def test_events_become_chunks_and_done_ends_the_stream() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    chunks = await read(
        sse(text_completion("c1", 7, "m", "def", None)),
        sse(text_completion("c1", 7, "m", " f", "length", usage)),
        DONE,
        sse(text_completion("c1", 7, "m", "after done", None)),
    )
    assert [c.text for c in chunks] == ["def", " f"]
    assert chunks[1].finish_reason == "length" and chunks[1].usage == usage
    assert chunks[0].model == "m" and chunks[0].created == 7 and chunks[0].upstream_id == "c1"


async def test_comments_keepalives_and_event_lines_are_skipped() -> None:
    chunks = await read(b": keep-alive\n\n", b"event: completion\n", sse(text_completion("c", 1, "m", "x", None)))
    assert [c.text for c in chunks] == ["x"]


async def test_a_stream_without_done_ends_with_its_lines() -> None:
    assert [c.text for c in await read(sse(text_completion("c", 1, "m", "x", None)))] == ["x"]


async def test_missing_or_odd_choices_give_an_empty_chunk() -> None:
    chunks = await read(b'data: {"choices": []}\n\n', b'data: {"choices": ["x"], "usage": {"a": 1}}\n\n')
    assert [(c.text, c.usage) for c in chunks] == [("", None), ("", {"a": 1})]


@pytest.mark.parametrize("event", [b"data: {not json\n\n", b"data: [1, 2]\n\n"])
async def test_unreadable_events_are_protocol_errors(event: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        await read(event)


async def test_an_error_event_is_the_servers_error() -> None:
    with pytest.raises(UpstreamStatusError) as caught:
        await read(b'data: {"error": {"message": "decode failed", "type": "server_error"}}\n\n')
    assert (caught.value.status, caught.value.upstream_status, caught.value.message) == (502, 500, "decode failed")


async def reads(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def batches(*pieces: bytes) -> list[list[str]]:
    return [[chunk.text for chunk in batch] async for batch in read_sse(reads(*pieces))]


async def test_one_read_is_one_batch_and_events_may_straddle_reads() -> None:
    events = b"".join(sse(text_completion("c", 1, "m", t, None)) for t in ("a", "b", "c"))
    cut = events.index(b'"b"') + 1
    assert await batches(events) == [["a", "b", "c"]]
    assert await batches(events[:cut], events[cut:]) == [["a"], ["b", "c"]]
    assert await batches(*(events[i : i + 1] for i in range(len(events)))) == [["a"], ["b"], ["c"]]


async def test_data_lines_of_one_event_are_joined_and_crlf_is_accepted() -> None:
    event = b'data: {"choices": [{"text": "x",\r\ndata: "finish_reason": null}]}\r\n\r\n'
    assert await batches(event) == [["x"]]


async def test_a_very_long_event_is_read_whole() -> None:
    text = "y" * (2 * 1024 * 1024)
    event = sse(text_completion("c", 1, "m", text, None))
    assert await batches(*(event[i : i + 65536] for i in range(0, len(event), 65536))) == [[text]]


async def test_each_chunk_keeps_its_events_bytes() -> None:
    event = sse(text_completion("c", 1, "m", "x", None))
    chunks = await read(event)
    assert b"data: " + (chunks[0].raw or b"") + b"\n\n" == event


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices": {"text": "x"}}\n\n',
        b'data: {"choices": 3}\n\n',
        b'data: {"choices": [{"text": 3}]}\n\n',
        b'data: {"choices": [], "usage": "many"}\n\n',
        b'data: {"choices": [], "timings": [1]}\n\n',
    ],
)
async def test_events_of_the_wrong_shape_are_protocol_errors(event: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        await read(event)
