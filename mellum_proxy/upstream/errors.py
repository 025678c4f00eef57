"""The only place where aiohttp's client exceptions become `mellum_proxy.errors.UpstreamError`s.

The most specific match comes first; the original exception is chained with `from`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import orjson

from mellum_proxy.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Re-raise transport failures talking to `url` as `UpstreamError`s."""
    try:
        yield
    except UpstreamError:
        raise
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamUnavailableError(f"cannot connect to upstream {url}: {exc.os_error}", connected=False) from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeoutError(f"upstream {url} did not answer in time") from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise UpstreamUnavailableError(f"upstream {url} closed the connection") from exc
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamProtocolError(f"upstream {url} ended its answer early (broken or cut body)") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailableError(f"upstream {url} failed: {exc}") from exc


def status_error(status: int, body: bytes, content_type: str = "") -> UpstreamStatusError:
    """Build the error for an upstream 4xx/5xx, keeping its message and type when it gave one; a web page is
    named as such (a web server, a gateway or a portal answered: not a model server), not passed on."""
    if content_type == "text/html" or body.lstrip()[:1] == b"<":
        said = f"upstream answered {status} with an HTML page ({len(body)} bytes): not a model server?"
        return UpstreamStatusError(status, said, own_words=True)
    message, error_type = body[:2000].decode("utf-8", "replace") or f"upstream answered {status}", None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            error_type = error.get("type")
        elif isinstance(error, str):
            message = error
    return UpstreamStatusError(status, message, str(error_type or "upstream_error"))
