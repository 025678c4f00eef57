"""Checks on text a user gives the proxy: a header must not split, a URL must have a host and a port that exists,
a variable must name a setting."""

from __future__ import annotations

import difflib
import os
import re
from urllib.parse import urlsplit


def has_control(text: str) -> bool:
    """Whether `text` holds a line break or another control character (it would split an HTTP header)."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def has_blank_or_control(text: str) -> bool:
    """Whether `text` holds a space or a control character (no host name does)."""
    return has_control(text) or any(c.isspace() for c in text)


HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110's token


def is_header_name(text: str) -> bool:
    return HEADER_NAME.fullmatch(text) is not None


def is_server_url(url: str) -> bool:
    """Whether `url` has a host without spaces or control characters, and a port from 1 to 65535 if any."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError past 65535
    except ValueError:
        return False
    return bool(parts.hostname) and not has_blank_or_control(url) and port != 0


def unknown_environment(settings: list[str]) -> list[str]:
    """`MELLUM_PROXY_*` variables that name no setting (a typo is otherwise ignored), each with the setting its
    name is closest to, if any."""
    names = {name.upper(): name for name in settings}
    unknown = []
    for variable in sorted(os.environ):
        if not variable.startswith("MELLUM_PROXY_") or variable in NOT_SETTINGS:
            continue
        name = variable.removeprefix("MELLUM_PROXY_")
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=1)
            unknown.append(
                f"{variable} names no setting" + (f" (did you mean MELLUM_PROXY_{close[0]}?)" if close else "")
            )
    return unknown


NOT_SETTINGS = frozenset({  # the project's own test switches (Makefile, .ci/run), not the proxy's settings
    "MELLUM_PROXY_TEST_VLLM", "MELLUM_PROXY_VLLM_PYTHON", "MELLUM_PROXY_VLLM_MODEL", "MELLUM_PROXY_REQUIRE_BROWSER",
})  # fmt: skip
