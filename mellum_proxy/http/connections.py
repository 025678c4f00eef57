"""`ConnectionGuard`: the connections the proxy takes, bounded in number and in how slowly they may start.

A client that opens connections and never finishes a request's headers (slowloris) would keep each one
forever: aiohttp has no deadline for headers, and at the process's file limit the listener stops
accepting and asyncio logs every failed accept. So at most `limit` connections are open at once (half
the file limit, at most `MAX_CONNECTIONS`; the editor needs a few; the upstream's connections have an eighth,
`mellum_proxy.assembly.upstream_connection_limit`, the rest is the process's files), one more is answered 503
and closed as it comes, and a connection that has not sent its first request's headers within `header_s` is
closed. A request whose
body does not arrive in time is the handler's (`mellum_proxy.http.bodies.read_json`).

Idle keep-alive connections (an editor or a page left open, between requests) never take a completion's place:
they are counted apart (`idle`), closed after the `idle_timeout_ms` setting (aiohttp's keep-alive timeout,
`IDLE_TIMEOUT_S` here), and at the limit the one idle longest is closed to let a new connection in; only when
every open connection is busy is the new one refused (256 idle connections made every completion a 503 for
at least 90 s before).
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from typing import Any

MAX_CONNECTIONS = 256
HEADER_S = 10.0  # for a new connection to deliver its first request's headers
IDLE_TIMEOUT_S = 30.0  # the `idle_timeout_ms` setting's default: an idle keep-alive connection is closed after it
STALLED_S = 10.0  # a client that reads nothing of its answer this long (a suspended tab, a stuck reader) is let go
_END_OF_HEADERS = b"\r\n\r\n"


def accept_batch() -> int:
    """How many connections asyncio accepts at once (its `backlog`): a sixteenth of the open-file limit, 8 to 100.
    A burst accepts that many before the guard can refuse one, so it must fit under the limit beside the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 100 if soft == resource.RLIM_INFINITY else max(8, min(100, soft // 16))


def connection_limit() -> int:
    """`MAX_CONNECTIONS`, or half the process's open-file limit when that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(16, min(MAX_CONNECTIONS, soft // 2))


class ConnectionGuard:
    """Wraps a protocol factory (aiohttp's `Server`) for `loop.create_server`."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol] | None = None,
        limit: int | None = None,
        header_s: float = HEADER_S,
    ) -> None:
        self.factory = factory  # aiohttp's `Server`, once the runner is set up
        self.limit = connection_limit() if limit is None else limit
        self.header_s = header_s
        self.open = 0
        self.refused = 0  # connections closed because `limit` were open, every one busy
        self.too_slow = 0  # connections closed for not sending their headers in time
        self.evicted = 0  # idle connections closed at the limit to let a new one in
        self._connections: set[_Guarded] = set()

    @property
    def idle(self) -> int:
        """Open connections that wait for their next request (keep-alive between requests)."""
        return sum(1 for connection in self._connections if connection.idle)

    def __call__(self) -> asyncio.Protocol:
        assert self.factory is not None, "set `factory` before listening"
        if self.open >= self.limit and not self._evict_idle():
            self.refused += 1
            return _Refused()
        return _Guarded(self, self.factory())

    def _evict_idle(self) -> bool:
        """Close the connection idle longest, if one is: True when a place was freed."""
        idle = [connection for connection in self._connections if connection.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda connection: connection.last_seen)
        self.evicted += 1
        oldest.close()
        return True


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
         b"Connection: close\r\nContent-Length: 93\r\n\r\n"
         b'{"error": {"message": "the proxy has all the connections it may open", "type": "overloaded"}}')  # fmt: skip


class _Refused(asyncio.Protocol):
    """A connection over the limit: answered 503 at once (an HTTP answer a client reads, not a reset), closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.write(_BUSY)
        transport.close()


class _Guarded(asyncio.Protocol):
    """aiohttp's handler for one connection, with a deadline for its first request's headers."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen, for an end of headers split between two reads
        self.last_seen = 0.0  # the loop's time of its last bytes (or its opening)
        self.counted = False

    @property
    def idle(self) -> bool:
        """Between requests: its first request's headers came, and it waits for its next request, none in progress
        or queued (aiohttp's own test in its keep-alive check). One that has not sent its first headers yet is
        starting, not idle: the header deadline is its limit."""
        if self.timer is not None:
            return False
        waiter = getattr(self.inner, "_waiter", None)
        return waiter is not None and not waiter.done() and not getattr(self.inner, "_messages", True)

    def close(self) -> None:
        """Close it at once (it is idle: nothing is cut)."""
        self._forget()
        if self.transport is not None:
            self.transport.close()

    def _forget(self) -> None:
        if self.counted:
            self.counted = False
            self.guard.open -= 1
            self.guard._connections.discard(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.guard.open += 1
        self.counted = True
        self.guard._connections.add(self)
        self.last_seen = asyncio.get_running_loop().time()
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(self.guard.header_s, self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.last_seen = asyncio.get_running_loop().time()
        if self.timer is not None:
            if _END_OF_HEADERS in self.tail + data[:4] or _END_OF_HEADERS in data:
                self.timer.cancel()
                self.timer = None
            else:
                self.tail = data[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        if self.timer is not None:
            self.timer.cancel()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _too_slow(self) -> None:
        self.timer = None
        self.guard.too_slow += 1
        if isinstance(self.transport, asyncio.Transport):
            self.transport.abort()  # no lingering: the client sent nothing worth waiting for

    def __getattr__(self, name: str) -> Any:  # anything else aiohttp may ask of its protocol
        return getattr(self.inner, name)
