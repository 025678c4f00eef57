r"""Under each `### \`name\`` heading of `configuration.md`, the setting's flag, environment variable, default
and summary, read from `mellum_proxy.config.Settings`, written into the page itself (so it reads whole as
Markdown too): `python docs/hooks/settings_reference.py` (`make docs-generate`) writes them; as an mkdocs hook it
fills them in again, and the test suite fails while the page differs from what it would write. A setting without
a heading, or a heading that names no setting, fails the build, so the reference cannot drift from the code."""

from __future__ import annotations

import re
from typing import Any

from mellum_proxy.config import EMBEDDED_DEFAULTS, Settings

PAGE = "configuration.md"
HEADING = re.compile(r"^### `(\w+)`$", re.MULTILINE)
GENERATED = re.compile(r"^(### `\w+`)\n\n`--[^\n]*\n", re.MULTILINE)  # a heading and the line written under it


class SettingsDrift(ValueError):
    """The page and `Settings` name different settings."""


def _value(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return str(value)


def describe(name: str) -> str:
    """One Markdown line: how to set `name`, its default, and what it is."""
    field = Settings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    flags = f"`{flag}` / `--no-{flag[2:]}`" if field.annotation is bool else f"`{flag}`"
    default = "computed at start" if field.default_factory else f"`{_value(field.default)}`"
    if name in EMBEDDED_DEFAULTS:
        default += f" (`{_value(EMBEDDED_DEFAULTS[name])}` with `--embedded`)"
    return f"{flags} · `MELLUM_PROXY_{name.upper()}` · TOML `{name}` · default {default}. {field.description}"


def render(markdown: str) -> str:
    """`markdown` with each setting's generated line under its heading."""
    named = HEADING.findall(markdown)
    missing = [name for name in Settings.model_fields if name not in named]
    unknown = [name for name in named if name not in Settings.model_fields]
    if missing or unknown or len(named) != len(set(named)):
        raise SettingsDrift(f"{PAGE}: settings without a heading {missing}, headings of no setting {unknown}")
    bare = GENERATED.sub(lambda m: m.group(1) + "\n", markdown)  # what was written before, taken out
    return HEADING.sub(lambda m: f"{m.group(0)}\n\n{describe(m.group(1))}", bare)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return render(markdown) if page.file.src_uri == PAGE else markdown


if __name__ == "__main__":
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / PAGE
    path.write_text(render(path.read_text()))
