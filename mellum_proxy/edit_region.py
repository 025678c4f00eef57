"""Edit-prediction prompts: the model rewrites a region around the cursor instead of filling in at it.

Zed's edit predictions (`prompt_format` `zeta`, and the Zeta 2 formats), Continue's Instinct and Sweep's
next-edit model send a prompt the client built around an *editable region*: the edit history, the region with
the cursor marked inside it, and the model answers with the region rewritten. Such a prompt is not a
fill-in-the-middle prompt, even where it carries FIM markers (Zeta 2 writes its region between
`<|fim_prefix|>`, `<|fim_middle|>current` and `<|fim_suffix|>`), and its answer legitimately repeats lines
and carries the format's markers. So the proxy leaves both alone: no re-rendering in another template, no
cut to the token budget (the client sized it: Zed to 4,096 tokens by its own estimate), no typed-through
reuse, no cleaning. What protects the server applies as to any request: the dispatch hold, supersede,
the deadline and admission, and the record.

The formats are told by the markers the clients write (their source: Zed's `crates/zeta_prompt` and
`crates/edit_prediction/src/sweep_prompt.rs`, Continue's `core/nextEdit/constants.ts`).
"""

from __future__ import annotations

# Each format's editable region: the line that opens it, the cursor marker inside it, the line that closes it.
REGIONS = (
    ("zeta", "<|editable_region_start|>", "<|user_cursor_is_here|>", "<|editable_region_end|>"),  # Zeta 1, Instinct
    ("zeta2", "<|fim_middle|>current", "<|user_cursor|>", "<|fim_suffix|>"),  # Zed's Zeta 2 formats
    ("zeta2", "<|editable_region_start|>", "<|user_cursor|>", "<|editable_region_end|>"),
)
SWEEP_CURRENT, SWEEP_UPDATED = "<|file_sep|>current/", "<|file_sep|>updated/"


def edit_region_format(prompt: str) -> str | None:
    """The edit-prediction format `prompt` is laid out in (`zeta`, `zeta2`, `sweep`); None for any other.

    Told by the layout, not by a marker anywhere: a region's opening and closing markers each on a line of
    their own, in that order, with the cursor marker between them. Code that merely mentions the markers (Zed's
    own source, this module) is an ordinary prompt.
    """
    if "<|" not in prompt:
        return None
    for name, opening, cursor, closing in REGIONS:
        start = _line_at(prompt, opening)
        if start < 0:
            continue
        at = prompt.find(cursor, start)
        if at >= 0 and _line_at(prompt, closing, at) >= 0:
            return name
    if SWEEP_CURRENT in prompt:  # Sweep: ...<|file_sep|>current/PATH\n<window><|file_sep|>updated/PATH\n
        last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
        if last.startswith(SWEEP_UPDATED):
            return "sweep"
    return None


def _line_at(text: str, marker: str, start: int = 0) -> int:
    """Where a line that is `marker` alone (trailing spaces aside) begins in `text` at or after `start`; -1."""
    at = text.find(marker, start)
    while at >= 0:
        end = at + len(marker)
        line_end = text.find("\n", end)
        starts_line = at == 0 or text[at - 1] == "\n"
        if starts_line and not text[end : len(text) if line_end < 0 else line_end].strip():
            return at
        at = text.find(marker, end)
    return -1
