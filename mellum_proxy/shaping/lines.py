"""`LineGate`: a completion cut short (a deadline, a newer keystroke, the token cap) never ends in the middle
of a line.

A completion that spans lines and is cut while the model writes its third line is shown up to the end
of its second: accepting `return average\\n\\nif ` would leave a dangling `if`. So, once a completion has
gone past its first line, the text after its last complete line (and the blank lines before it) is held
back until the line completes; when the upstream ends on its own, what is held is sent too, and when the
completion is cut it is dropped. A completion the upstream stopped at the proxy's `max_tokens` cap (finish
reason `length`, the client asked for more) is cut too; one that ran to the client's own `max_tokens` is
passed on as it is. The first line is never held: a one-line completion streams as it comes, and a cut
one shows what there was (its finish reason says `length`).

The gate costs nothing while the first line streams: chunks whose raw event holds no escaped newline
pass through unparsed, exactly as they came.
"""

from __future__ import annotations

from collections.abc import Sequence

from mellum_proxy.models import Chunk

_ESCAPED_NEWLINE = b"\\n"  # how a newline appears inside a JSON string


def complete_lines(text: str) -> str:
    """What a cut completion shows: all of a one-line text, else up to the end of its last line with
    content (`"a\\n\\nif "` -> `"a"`)."""
    end = text.rfind("\n")
    return text if end < 0 else text[:end].rstrip()


class LineGate:
    """Decides, chunk by chunk, how much of a streaming completion a client may be shown yet."""

    __slots__ = ("capped", "held", "multiline")

    def __init__(self, capped: bool = False) -> None:
        self.capped = capped  # the proxy lowered the client's max_tokens: `length` is a cut of its making
        self.multiline = False  # a newline has been seen: from now on only complete lines are released
        self.held = ""

    def feed(self, text: str) -> str:
        """The part of `text` (appended to what came before) that may be shown now."""
        if not self.multiline:
            newline = text.find("\n")
            if newline < 0:
                return text
            self.multiline = True
            return text[:newline] + self._complete(text[newline:])
        return self._complete(text)

    def _complete(self, text: str) -> str:
        held = self.held + text
        end = held.rfind("\n")
        if end < 0:
            self.held = held
            return ""
        ready = len(held[:end].rstrip())
        self.held = held[ready:]
        return held[:ready]

    def flush(self) -> str:
        """What is held, for a completion that ended on its own."""
        held, self.held = self.held, ""
        return held

    def pass_batch(self, batch: Sequence[Chunk]) -> Sequence[Chunk]:
        """The chunks to show for one upstream batch: the batch itself while it cannot hold a newline,
        else chunks carrying only what may be shown (a chunk that ends the answer releases what is held)."""
        if not self.multiline and not any(_may_hold_newline(chunk) for chunk in batch):
            return batch
        shown: list[Chunk] = []
        for chunk in batch:
            text = self.feed(chunk.text)
            if chunk.finish_reason is not None:
                held = self.flush()
                if not (self.capped and chunk.finish_reason == "length"):  # the proxy's cap cut it: like a deadline
                    text += held
            if text == chunk.text:
                shown.append(chunk)
            elif text or chunk.finish_reason is not None or chunk.usage is not None or chunk.timings is not None:
                shown.append(Chunk(text, chunk.finish_reason, chunk.usage, chunk.timings, chunk.model, chunk.created,
                                   chunk.upstream_id))  # fmt: skip
        return shown


def _may_hold_newline(chunk: Chunk) -> bool:
    raw = chunk.raw
    if raw is not None and chunk.finish_reason is None:
        return _ESCAPED_NEWLINE in raw  # a backslash before an `n` in the text also matches: parsed, then
    return "\n" in chunk.text
