"""Checks on text a user gives the proxy: a header value must not split a header, a variable must name a setting."""

from __future__ import annotations

import difflib
import os


def has_control(text: str) -> bool:
    """Whether `text` holds a line break or another control character (it would split an HTTP header)."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


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
