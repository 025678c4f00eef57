"""Malformed HTTP said quietly: aiohttp answers a request it cannot parse (an HTTP/2 preface, a header over 8 KB,
two Content-Length) with 400 and closes the connection, then logs an ERROR with a traceback for each one. A port
scanner or a confused client would fill the console; here they become at most one WARNING line a minute that
counts them. Nothing of the request is logged (a header may hold a token)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

SAY_EVERY_S = 60.0


class QuietMalformed(logging.Filter):
    """A filter for aiohttp's `aiohttp.server` logger: a malformed request's record is rewritten into one line
    without a traceback, and the rest within `every_s` of it are only counted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = SAY_EVERY_S) -> None:
        super().__init__()
        self.clock = clock
        self.every_s = every_s
        self.seen = 0  # malformed requests since the last line said
        self.said_at: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        self.seen += 1
        now = self.clock()
        if self.said_at is not None and now - self.said_at < self.every_s:
            return False
        record.msg = "answered %d malformed HTTP request(s) with %d (the last: %s); at most one such line a minute"
        record.args = (self.seen, error.code, type(error).__name__)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        self.said_at, self.seen = now, 0
        return True


def quiet_malformed_requests(logger: logging.Logger | None = None) -> QuietMalformed:
    """Put the filter on aiohttp's server logger once per process; returns the one in place."""
    logger = logger or logging.getLogger("aiohttp.server")
    for existing in logger.filters:
        if isinstance(existing, QuietMalformed):
            return existing
    quiet = QuietMalformed()
    logger.addFilter(quiet)
    return quiet
