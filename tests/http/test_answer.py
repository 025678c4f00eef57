"""`HttpAnswer` on aiohttp's own writer: a streamed answer's headers leave with its first write, in one send, so
the editor reads them and its first event together (one wake-up and one system call sooner)."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request

from mellum_proxy.dialects.openai import CompletionEncoder
from mellum_proxy.http.answer import HttpAnswer
from mellum_proxy.models import Chunk, Completion, NormalizedRequest, Outcome


class Transport:
    """What the socket was handed, a send at a time."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.sends.append(b"".join(parts))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def _answer() -> tuple[HttpAnswer, Transport]:
    transport = Transport()
    protocol = mock.Mock(transport=transport, writing_paused=False, _paused=False)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request("POST", "/v1/completions", writer=writer, protocol=protocol, transport=transport)
    normalized = NormalizedRequest(id="1", route="openai", session="s", prefix="p", suffix="s", stream=True)
    return HttpAnswer(request, CompletionEncoder(normalized)), transport


@pytest.mark.asyncio
async def test_the_headers_leave_with_the_first_event_in_one_send() -> None:
    answer, transport = _answer()
    completion = Completion("cmpl-1")
    await answer.send(completion, [Chunk("def")])
    assert len(transport.sends) == 1
    assert transport.sends[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'data: {"id":"cmpl-1"' in transport.sends[0] and b'"text":"def"' in transport.sends[0]


@pytest.mark.asyncio
async def test_an_answer_with_no_event_sends_its_headers_with_its_end() -> None:
    answer, transport = _answer()
    await answer.finish(Completion("cmpl-1"), Outcome.DEBOUNCED)
    assert len(transport.sends) == 1
    assert b"X-Mellum-Outcome: debounced" in transport.sends[0]
    assert transport.sends[0].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
