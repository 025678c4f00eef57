"""Fill-in-the-middle prompt templates: render a prompt from prefix/suffix/path, parse one back.

A template is data: an optional file header (`{path}`) and a body with `{prefix}` and `{suffix}`.
Rendering substitutes with `str.replace` (source code is full of braces); parsing turns the same
same template back, so a client that pre-rendered its prompt (Continue's OpenAI provider) can be
truncated properly instead of cut blindly from the left. Parsing is a few `str.find`s, linear in the
prompt whatever it holds (a regex of lazy groups took seconds on a prompt of repeated markers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mellum_proxy.models import NormalizedRequest

MARKER = re.compile(r"<[^<>\s{}]+>|\[[A-Z_]+\]")  # `<fim_prefix>`, `<|fim_suffix|>`; Mistral's `[SUFFIX]`


@dataclass(frozen=True, slots=True)
class FimParts:
    prefix: str
    suffix: str
    path: str | None = None
    context: str = ""  # other files packed before the current one (kept only when they fit)


@dataclass(frozen=True)
class FimTemplate:
    """Args: name; header with `{path}` (left out when there is no path); body with `{prefix}`, `{suffix}`."""

    name: str
    body: str
    header: str = ""
    stops: tuple[str, ...] = ()
    _pieces: tuple[str, ...] = field(init=False, repr=False, compare=False)
    markers: tuple[str, ...] = field(init=False, repr=False, compare=False)  # the body's literal markers

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pieces", tuple(p for p in re.split(r"(\{prefix\}|\{suffix\})", self.body) if p))
        object.__setattr__(self, "markers", tuple(MARKER.findall(self.body)))

    def render(self, parts: FimParts) -> str:
        return self.render_spans(parts)[0]

    def render_spans(self, parts: FimParts) -> tuple[str, int, int]:
        """The prompt, and where the prefix and the suffix start in it."""
        header = self.header.replace("{path}", parts.path) if parts.path is not None and self.header else ""
        # one pass, so text inside the prefix that looks like "{suffix}" is never substituted
        out, position, starts = [parts.context, header], len(parts.context) + len(header), [0, 0]
        for piece in self._pieces:
            if piece == "{prefix}":
                piece, starts[0] = parts.prefix, position
            elif piece == "{suffix}":
                piece, starts[1] = parts.suffix, position
            elif "{path}" in piece:
                piece = piece.replace("{path}", parts.path or "")
            out.append(piece)
            position += len(piece)
        return "".join(out), starts[0], starts[1]

    def parse(self, prompt: str) -> FimParts | None:
        """The parts of a prompt rendered with this template, or None when it is not one.

        The body starts at the first occurrence of its opening marker (at the very start when the
        template has no file header, else after any packed context and an optional header) and ends
        the prompt; each placeholder but the last ends at the next occurrence of the marker after it.
        """
        pieces = _split(self.body)
        start = prompt.find(pieces[0])
        if start < 0 or (start > 0 and not self.header):
            return None
        context, path = "", None
        if start > 0:
            context, path = self._header_before(prompt, start)
        values: dict[str, str] = {}
        position = start + len(pieces[0])
        for index in range(1, len(pieces), 2):
            name, literal = pieces[index], pieces[index + 1]
            last = index + 2 >= len(pieces)
            end = len(prompt) - len(literal) if last else prompt.find(literal, position)
            if end < position or (last and not prompt.endswith(literal)):
                return None
            values[name] = prompt[position:end]
            if name == "path" and "\n" in values[name]:
                return None
            position = end + len(literal)
        return FimParts(values.get("prefix", ""), values.get("suffix", ""), values.get("path", path), context)

    def _header_before(self, prompt: str, start: int) -> tuple[str, str | None]:
        """(packed context, path) of what precedes the body at `start`: a header right before it, or none."""
        head, _, tail = self.header.partition("{path}")
        if not prompt.endswith(tail, 0, start):
            tail = ""  # JetBrains' own layout (mellum-sdk): `<filename>{path}` right before the markers
        at = prompt.rfind(head, 0, start - len(tail))
        if at < 0:
            return prompt[:start], None
        path = prompt[at + len(head) : start - len(tail)]
        if "\n" in path or not path:
            return prompt[:start], None
        return prompt[:at], path

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The literal markers of the template, e.g. `<fim_prefix>`: never cut, never part of user text."""
        return tuple(sorted(set(MARKER.findall(self.header + self.body))))


@functools.lru_cache(maxsize=32)
def _split(body: str) -> list[str]:
    """A body as [literal, name, literal, name, ..., literal] (names: prefix, suffix, path)."""
    return re.split(r"\{(prefix|suffix|path)\}", body)


MELLUM = FimTemplate(
    "mellum",
    header="<filename>{path}\n",
    body="<fim_suffix>{suffix}<fim_prefix>{prefix}<fim_middle>",
    stops=("<|endoftext|>", "<filename>"),
)
STARCODER = FimTemplate(
    "starcoder",
    header="<filename>{path}\n",
    body="<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
    stops=("<|endoftext|>", "<filename>", "<file_sep>"),
)
CODELLAMA = FimTemplate("codellama", body="<PRE> {prefix} <SUF>{suffix} <MID>", stops=("<EOT>",))
# DeepSeek-Coder's markers really use FULLWIDTH VERTICAL LINE and LOWER ONE EIGHTH BLOCK.
DEEPSEEK = FimTemplate(
    "deepseek",
    body="<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",  # noqa: RUF001
    stops=("<｜end▁of▁sentence｜>",),  # noqa: RUF001
)
QWEN = FimTemplate(
    "qwen",
    body="<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
    stops=("<|endoftext|>", "<|file_sep|>", "<|fim_pad|>", "<|im_end|>"),
)
# Codestral's (Twinny's and Continue's `codestral` template): the suffix first, no middle marker.
CODESTRAL = FimTemplate("codestral", body="[SUFFIX]{suffix}[PREFIX]{prefix}", stops=("</s>", "[PREFIX]", "[SUFFIX]"))
# GLM-4's (Zed's `glm` prompt format).
GLM = FimTemplate("glm", body="<|code_prefix|>{prefix}<|code_suffix|>{suffix}<|code_middle|>", stops=("<|endoftext|>",))
BUILTIN = {t.name: t for t in (MELLUM, STARCODER, CODELLAMA, DEEPSEEK, QWEN, CODESTRAL, GLM)}
NONE = "none"  # send prompt and suffix as fields and let the server build the prompt
# For a model without fill-in-the-middle tokens: the text before the cursor, as plain text to continue.
# Not in BUILTIN, which recognises clients' pre-rendered prompts (this one would match any text).
PREFIX_ONLY = FimTemplate("prefix", body="{prefix}")


async def template_the_model_knows(
    configured: FimTemplate, single_token: Callable[[str], Awaitable[bool]]
) -> FimTemplate:
    """`configured` when the model's vocabulary has each of its markers as one token; else the first
    built-in template it has; else `PREFIX_ONLY` (markers the model never learned are only noise)."""
    for template in (configured, *(t for t in BUILTIN.values() if t is not configured)):
        if all([await single_token(marker) for marker in template.markers]):
            return template
    return PREFIX_ONLY


def template_for(spec: str) -> FimTemplate | None:
    """A built-in name, `none` (None: the server renders), or a custom string with {prefix} and {suffix}.

    Raises:
        ValueError: a custom template without both placeholders.
    """
    if spec == NONE:
        return None
    if spec in BUILTIN:
        return BUILTIN[spec]
    if spec == PREFIX_ONLY.name:
        return PREFIX_ONLY
    if "{prefix}" not in spec or "{suffix}" not in spec:
        raise ValueError(f"a custom FIM template needs {{prefix}} and {{suffix}}; known names: {', '.join(BUILTIN)}")
    return FimTemplate("custom", body=spec.replace("\\n", "\n"))


@functools.lru_cache(maxsize=2)
def parse_any(prompt: str) -> tuple[FimTemplate, FimParts] | None:
    """Recognise a prompt pre-rendered with any built-in template. The last two answers are kept: the
    context budget and typed-through reuse both read the same request's prompt (no more: a prompt can be
    megabytes)."""
    for template in BUILTIN.values():
        if all(marker in prompt for marker in template.markers):
            parts = template.parse(prompt)
            if parts is not None:
                return template, parts
    return None


def cursor_of(request: NormalizedRequest) -> tuple[str | None, str, str] | None:
    """(file, text before, text after) the cursor; from a prompt the client rendered itself when it sent
    no suffix (a plain completion without FIM markers has no cursor: None)."""
    if request.suffix is not None:
        return request.file_path, request.prefix, request.suffix
    if request.edit_region is not None:
        return None  # an edit-region prompt has FIM markers but no cursor to fill in at
    parsed = parse_any(request.prefix)
    if parsed is None:
        return None
    parts = parsed[1]
    return parts.path or request.file_path, parts.prefix, parts.suffix
