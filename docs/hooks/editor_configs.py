"""`<!-- editor-config NAME embedded LANG -->` in a page is followed by the plugin's config for `make run`
(`serve --embedded`), rendered from the package's template with those settings, up to `<!-- /editor-config -->`,
so the page shows what `mellum-proxy editor-config NAME --embedded` prints, as Markdown too, and cannot drift
from it: `python docs/hooks/editor_configs.py` (`make docs-generate`) writes the blocks into the pages; as an
mkdocs hook it writes them again, and the test suite fails while a page differs. LANG `markdown`: the config
is Markdown itself (JetBrains' steps), inserted as it is."""

from __future__ import annotations

import re
from typing import Any

from mellum_proxy.config import Settings
from mellum_proxy.editor.configs import CONFIGS, render

MARK = re.compile(
    r"^(?P<indent>[ ]*)<!-- editor-config (?P<name>[\w-]+) embedded (?P<lang>\w+) -->$"
    r"(?:.*?^[ ]*<!-- /editor-config -->$)?",  # the block written before, if any
    re.MULTILINE | re.DOTALL,
)


class UnknownPlugin(ValueError):
    """A page names a plugin `editor-config` does not know."""


def _block(match: re.Match[str]) -> str:
    name, lang, indent = match["name"], match["lang"], match["indent"]
    if name not in CONFIGS:
        raise UnknownPlugin(f"no editor config named {name!r} (known: {', '.join(sorted(CONFIGS))})")
    text = render(name, Settings(embedded=True)).rstrip("\n")
    lines = text.splitlines() if lang == "markdown" else [f"```{lang}", *text.splitlines(), "```"]
    lines = [f"<!-- editor-config {name} embedded {lang} -->", *lines, "<!-- /editor-config -->"]
    return "\n".join(f"{indent}{line}" if line else "" for line in lines)


def render_page(markdown: str) -> str:
    return MARK.sub(_block, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return render_page(markdown) if page.file.src_uri.startswith("editors/") else markdown


if __name__ == "__main__":
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent.parent / "editors").glob("*.md")):
        path.write_text(render_page(path.read_text()))
