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

CURSOR_MARKERS = {
    "<|user_cursor_is_here|>": "zeta",  # Zed's Zeta 1 and Continue's Instinct
    "<|editable_region_start|>": "zeta",
    "<|user_cursor|>": "zeta2",  # Zed's Zeta 2 formats
}
SWEEP_CURRENT, SWEEP_UPDATED = "<|file_sep|>current/", "<|file_sep|>updated/"


def edit_region_format(prompt: str) -> str | None:
    """The edit-prediction format `prompt` is written in (`zeta`, `zeta2`, `sweep`); None for any other."""
    if "<|" not in prompt:
        return None
    for marker, name in CURSOR_MARKERS.items():
        if marker in prompt:
            return name
    if SWEEP_CURRENT in prompt:  # Sweep: ...<|file_sep|>current/PATH\n<window><|file_sep|>updated/PATH\n
        last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
        if last.startswith(SWEEP_UPDATED):
            return "sweep"
    return None
