"""The proxy's error tree. Each error knows its HTTP status and a stable `type` string.

    ProxyError
     ├── InvalidRequestError        400  the client's body is not what the endpoint takes
     ├── RequestTooLargeError       413  body over --max-body-bytes
     ├── UnauthorizedError          401  no or a wrong --auth-token
     ├── ForbiddenError             403  a web page's request: a foreign Host, Origin or Sec-Fetch-Site
     ├── NotFoundError              404  unknown path
     ├── MethodNotAllowedError      405
     ├── RequestTimeoutError        408  the request's body did not arrive in time
     ├── UnsupportedMediaTypeError  415  a body a web page can send without asking (text/plain, a form)
     ├── ServiceUnavailableError    503  the proxy has all of something it may hold (live pages)
     └── UpstreamError              502  anything that went wrong talking to the model server
          ├── UpstreamUnavailableError  502  connection refused / reset / DNS
          ├── UpstreamTimeoutError      504  the upstream did not answer in time
          ├── UpstreamProtocolError     502  the upstream answered something we cannot read
          └── UpstreamStatusError       the upstream's own 4xx passed on; its 5xx is a 502 (503, 504 kept)

Policy outcomes (debounced, cancelled, queue full, timeout, skipped) are *not* errors: they are
answered with HTTP 200 and an empty completion (see `mellum_proxy.models.Outcome`).
"""

from __future__ import annotations

import hashlib

MAX_MESSAGE_CHARS = 300  # an upstream's error text is cut here: some quote the prompt they were sent


class ProxyError(Exception):
    """Root of every error the proxy answers with an error body."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def upstream_status(self) -> int:
        """The status to record as the upstream's (the one the client got, unless the upstream said another)."""
        return self.status

    @property
    def kind(self) -> str:
        """What the record's `error` says: the type, or a finer kind of it."""
        return self.type

    @property
    def shown(self) -> str:
        """The message as the console, `/status` and the page may show it: the proxy's own words (an upstream's
        text is reduced to its kind, length and hash: it may quote the prompt)."""
        return self.message


class InvalidRequestError(ProxyError):
    status = 400
    type = "invalid_request_error"


class RequestTooLargeError(ProxyError):
    status = 413
    type = "request_too_large"


class UnauthorizedError(ProxyError):
    status = 401
    type = "unauthorized"


class ForbiddenError(ProxyError):
    status = 403
    type = "forbidden"


class NotFoundError(ProxyError):
    status = 404
    type = "not_found"


class MethodNotAllowedError(ProxyError):
    status = 405
    type = "method_not_allowed"


class RequestTimeoutError(ProxyError):
    status = 408
    type = "request_timeout"


class UnsupportedMediaTypeError(ProxyError):
    status = 415
    type = "unsupported_media_type"


class ServiceUnavailableError(ProxyError):
    status = 503
    type = "overloaded"


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    status = 502
    type = "upstream_unavailable"

    def __init__(self, message: str, connected: bool = True) -> None:
        """`connected`: False when no connection could be made at all (refused, no such host)."""
        super().__init__(message)
        self.connected = connected

    @property
    def kind(self) -> str:
        return self.type if self.connected else "upstream_unreachable"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "upstream_timeout"


class UpstreamProtocolError(UpstreamError):
    status = 502
    type = "upstream_protocol_error"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an HTTP error; its message (cut to `MAX_MESSAGE_CHARS`) is passed on.

    A 4xx keeps its status (the request was wrong for that server). A 5xx is the gateway's 502: the
    proxy did not fail, its upstream did; 503 (loading, overloaded) and 504 are kept, as clients retry
    on them.
    """

    def __init__(self, status: int, message: str, error_type: str = "upstream_error", own_words: bool = False) -> None:
        """`own_words`: the message is the proxy's (`shown` as it is), not the upstream's text."""
        self.own_words = own_words
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.status = status if status < 500 or status in (503, 504) else 502
        self.type = error_type
        self._upstream_status = status

    @property
    def upstream_status(self) -> int:
        return self._upstream_status

    @property
    def shown(self) -> str:
        if self.own_words:
            return self.message
        digest = hashlib.sha256(self.message.encode()).hexdigest()[:12]
        return (f"upstream answered HTTP {self._upstream_status} ({self.type}): a message of {len(self.message)} "
                f"characters, sha256 {digest} (--log-content shows it)")  # fmt: skip
