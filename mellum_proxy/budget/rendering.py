"""How a prompt is laid out: the template's rendering with where each part starts, the budget's split between
prefix and suffix, and the bound a prompt's length alone gives."""

from __future__ import annotations

from mellum_proxy.budget.templates import FimParts, FimTemplate

SLACK_TOKENS = 8  # what a server may add to a prompt's own tokens (BOS, EOS, a leading space, FIM markers)


def fits_by_length(
    template: FimTemplate | None, parts: FimParts, budget: int, suffix_field: bool
) -> tuple[str, int] | None:
    """The whole prompt and its token bound, when its UTF-8 length alone proves it fits.

    No tokenizer makes more tokens than the text has bytes (every token covers at least one byte,
    a special token many), plus the few the server adds (BOS, EOS, a SentencePiece space, the FIM
    markers of template `none`): `SLACK_TOKENS`. Characters bound bytes from below, so a long prompt
    is turned away before it is encoded.
    """
    room = budget - SLACK_TOKENS
    if len(parts.prefix) + len(parts.suffix) + len(parts.context) + 64 > room:
        return None
    prompt = render(template, parts)
    size = len(prompt.encode()) + (len(parts.suffix.encode()) if suffix_field else 0)
    if size > room:
        return None
    return prompt, size + SLACK_TOKENS


def context_files(template: FimTemplate | None, files: tuple[tuple[str, str], ...]) -> str:
    """Other files in the template's own layout (`<filename>{path}\n{text}\n` for Mellum); templates
    without a file header cannot carry them, so they are left out."""
    if template is None or "{path}" not in template.header:
        return ""
    return "".join(template.header.replace("{path}", path) + text.rstrip("\n") + "\n" for path, text in files)


def render(template: FimTemplate | None, parts: FimParts) -> str:
    return render_spans(template, parts)[0]


def render_spans(template: FimTemplate | None, parts: FimParts) -> tuple[str, int, int]:
    """The prompt, and where the prefix and the suffix start in it (-1: the suffix is not in it)."""
    if template is None:
        return parts.context + parts.prefix, len(parts.context), -1  # the suffix, if any, is its own field
    return template.render_spans(parts)


def split(available: int, ratio: float, need_prefix: int, need_suffix: int) -> tuple[int, int]:
    """Prefix and suffix budgets; what one side does not need goes to the other."""
    p_share = int(available * ratio)
    s_share = available - p_share
    if need_prefix < p_share:
        s_share += p_share - need_prefix
        p_share = need_prefix
    elif need_suffix < s_share:
        p_share += s_share - need_suffix
        s_share = need_suffix
    return p_share, s_share
