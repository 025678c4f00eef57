"""Malformed HTTP (an HTTP/2 preface, a header over 8 KB, two Content-Length) is answered 400 and said in at most one
quiet line a minute: no traceback, nothing of the request."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from mellum_proxy.config import Settings
from mellum_proxy.http import build_app
from mellum_proxy.http.malformed import QuietMalformed, quiet_malformed_requests
from mellum_proxy.http.server import serve_app

SECRET = "sk-do-not-log-me"
MALFORMED = [
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + SECRET.encode() + b"a" * 9000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
]


async def answer_to(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        return await asyncio.wait_for(reader.read(), 10)  # the proxy closes the connection after its answer
    finally:
        writer.close()


async def test_forty_malformed_requests_are_400s_said_in_one_line(
    fake_upstream: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = await fake_upstream()
    app = build_app(Settings(upstream=url, tokenizer="chars"))
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with serve_app(app) as base:
        port = int(base.rsplit(":", 1)[1])
        answers = [await answer_to(port, MALFORMED[i % len(MALFORMED)]) for i in range(40)]
    assert all(answer.split(b" ")[1] == b"400" for answer in answers), {answer[:40] for answer in answers}
    said = [record for record in caplog.records if record.name == "aiohttp.server"]
    assert all(record.exc_info is None and record.exc_text is None for record in said)
    warned = [record for record in said if record.levelno >= logging.WARNING]
    assert len(warned) <= 1 and not any(SECRET in record.getMessage() for record in said)


def test_a_line_a_minute_counts_what_it_kept_quiet() -> None:
    now = [0.0]
    quiet = QuietMalformed(clock=lambda: now[0])
    logger = logging.getLogger("test.malformed")
    logger.addFilter(quiet)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger.addHandler(Keep())
    from aiohttp.http_exceptions import BadHttpMessage

    for second in range(0, 130, 10):  # 13 malformed requests, 10 s apart
        now[0] = float(second)
        try:
            raise BadHttpMessage("bad")
        except BadHttpMessage:
            logger.exception("Error handling request from %s", "127.0.0.1")
    logger.error("something else")  # any other error passes as it is
    assert [record.getMessage().split(" with")[0] for record in records[:3]] == [
        "answered 1 malformed HTTP request(s)", "answered 6 malformed HTTP request(s)",
        "answered 6 malformed HTTP request(s)"]  # fmt: skip
    assert records[-1].getMessage() == "something else" and len(records) == 4


def test_the_filter_is_put_in_place_once() -> None:
    logger = logging.getLogger("test.malformed.once")
    assert quiet_malformed_requests(logger) is quiet_malformed_requests(logger)
    assert len(logger.filters) == 1
