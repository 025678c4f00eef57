"""Transport errors become `UpstreamError`s in one place, most specific first, chained with `from`."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from mellum_proxy.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from mellum_proxy.upstream.errors import status_error, translate_errors

URL = "http://127.0.0.1:9/v1/completions"


def _connector_error() -> aiohttp.ClientConnectorError:
    key = ConnectionKey("127.0.0.1", 9, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))


@pytest.mark.parametrize(
    ("raised", "expected", "status"),
    [
        (_connector_error(), UpstreamUnavailableError, 502),
        (TimeoutError(), UpstreamTimeoutError, 504),
        (aiohttp.ServerTimeoutError("read"), UpstreamTimeoutError, 504),
        (aiohttp.ServerDisconnectedError(), UpstreamUnavailableError, 502),
        (aiohttp.ClientPayloadError("cut"), UpstreamProtocolError, 502),
        (aiohttp.ClientOSError(socket.EAI_FAIL, "dns"), UpstreamUnavailableError, 502),
    ],
)
def test_transport_errors_are_translated_and_chained(
    raised: BaseException, expected: type[UpstreamError], status: int
) -> None:
    with pytest.raises(expected) as caught, translate_errors(URL):
        raise raised
    assert type(caught.value) is expected and caught.value.status == status
    assert caught.value.__cause__ is raised
    assert URL in caught.value.message


def test_upstream_errors_and_others_pass_unchanged() -> None:
    original = UpstreamProtocolError("already ours")
    with pytest.raises(UpstreamProtocolError) as caught, translate_errors(URL):
        raise original
    assert caught.value is original
    with pytest.raises(KeyError), translate_errors(URL):
        raise KeyError("not a transport error")


def test_status_error_keeps_the_servers_status_message_and_type() -> None:
    llama = status_error(400, b'{"error": {"code": 400, "message": "too long", "type": "exceed_context_size_error"}}')
    assert (llama.status, llama.message, llama.type) == (400, "too long", "exceed_context_size_error")
    ollama = status_error(404, b'{"error": "model not found"}')
    assert (ollama.status, ollama.message, ollama.type) == (404, "model not found", "upstream_error")
    plain = status_error(503, b"Service Unavailable")
    assert isinstance(plain, UpstreamStatusError) and plain.message == "Service Unavailable"
    assert status_error(500, b"").message == "upstream answered 500"
