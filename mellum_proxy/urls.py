"""Server addresses as the proxy takes and shows them, and a free local port to start one on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the bench's and fit's servers start on one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def redact_url(url: str) -> str:
    """`url` as it may be shown (status, errors, logs): credentials in it (`user:password@`) become `***@`."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"


def upstream_base_url(url: str) -> str:
    """A server's base URL as the proxy uses it: no trailing slash, and no trailing `/v1`."""
    return url.strip().rstrip("/").removesuffix("/v1")
