"""`Cleaner`: post-processing while a completion streams, so the client gets the clean part only and the
server stops decoding the rest.

Each rule needs only the prefix, the suffix and the text so far, and follows a rule the plugins apply after
the fact (their source at the commits named in the README):
- `fim_marker`: a FIM marker or end-of-text token in the text (`<fim_suffix>`, `<filename>`,
  `<|endoftext|>`, ...) ends the completion before it (Continue `stopAtStopTokens`).
- `suffix_repeat`: a line that repeats the first non-blank line after the cursor's line, exactly or nearly
  (edit distance under 10 % of its length, lines over 4 characters) ends the completion before it: the model
  has started writing what is already there (Continue `stopAtSimilarLine`; llama.vim and llama.vscode
  discard such a suggestion whole).
- `repeated_line`: the same line three times in a row ends the completion after its first occurrence
  (Continue `stopAtRepeatingLines`; Tabby `removeRepetitiveLines`).
- `scope_end`: a completion that continues the cursor's line, or starts a block below it, ends where a later
  line is indented less than that scope allows, keeping one closing line (`}`, `)`, `end`) (Tabby
  `limitScopeByIndentation`, simplified).
- `duplicate_closing`: a closing line or trailing closing brackets at the end of the completion that the
  suffix already has are dropped (Tabby `removeDuplicatedBlockClosingLine`; the doubled `)` of llama.vim #71).

Lines after the first are released once complete (a rule may end the completion before them), with the
newline that ends one held until the next is released, so a completion that is ended never ends in a
newline; the first line streams as it comes, but for a possible marker or closing brackets at its end. Every
rule is idempotent: cleaning a clean completion changes nothing (the plugins clean again afterwards).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from mellum_proxy.models import Chunk

MARKERS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<filename>", "<file_sep>", "<repo_name>",
           "<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>",
           "<|repo_name|>", "<PRE>", "<SUF>", "<MID>", "<EOT>")  # fmt: skip
CLOSERS = ")]}"
CLOSING_WORDS = ("end", "fi", "done", "esac")  # a line that closes a block in Ruby, Lua, shell
REPEATS_TO_STOP = 3
_RAW_NEWLINE = b"\\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _closing_line(line: str) -> bool:
    """Only closing brackets (and `,` `;`), or a block-closing word: `}`, `});`, `end`."""
    stripped = line.strip()
    return bool(stripped) and (stripped.rstrip(",;") in CLOSING_WORDS or all(c in CLOSERS + ",;" for c in stripped))


def _similar(a: str, b: str) -> bool:
    """Equal, or (both over 4 characters) an edit distance under 10 % of `b`'s length (Continue's `lineIsRepeated`)."""
    if a == b:
        return True
    if len(a) <= 4 or len(b) <= 4 or abs(len(a) - len(b)) >= 0.1 * len(b):
        return False
    return _distance(a, b, int(0.1 * len(b))) < 0.1 * len(b)


def _distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, abandoned (returning `limit + 1`) once a row exceeds `limit`."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


def _partial_marker(text: str) -> int:
    """How many characters at the end of `text` could begin a marker (they are held until they cannot)."""
    start = text.rfind("<", max(0, len(text) - 16))
    if start < 0:
        return 0
    tail = text[start:]
    return len(tail) if any(marker.startswith(tail) for marker in MARKERS) else 0


class Cleaner:
    """Cleans one completion as it streams: `feed` gives what may be shown now, `finish` what is left when the
    upstream ends it; `stopped` names the rule that ended it early."""

    def __init__(self, prefix: str, suffix: str | None) -> None:
        self.cursor_line = cursor_line = prefix[prefix.rfind("\n") + 1 :]
        reference = cursor_line if cursor_line.strip() else _last_nonblank_line(prefix)
        self.prefix_indent = None if reference is None else _indent(reference)
        suffix = suffix or ""
        end = suffix.find("\n")
        self.rest_of_line = rest_of_line = suffix if end < 0 else suffix[:end]  # what follows the cursor on its line
        self.next_line = None if end < 0 else _first_nonblank_line(suffix, end + 1)
        self.watch_closers = rest_of_line[:1] in tuple(CLOSERS)  # a closing bracket at the cursor may be doubled
        next_line = self.next_line
        # the first line is held while it could still turn out to be the suffix's next line, written again
        self.watch_next = next_line.strip() if next_line is not None and not _closing_line(next_line) else None
        self.stopped: str | None = None
        self.text = ""  # everything the upstream wrote so far (but `_unparsed`)
        self.shown = 0  # how much of `text` was released
        self.line_start = 0  # where the current (incomplete) line begins in `text`
        self.lines: list[str] = []  # the complete lines so far
        self.repeats = 1
        self.hold_at: int | None = None  # nothing from here on is released yet: a repeat, or a doubled closing line
        self.hold_reason: str | None = None
        self.limit: int | None = None  # the least indentation a later line may have (`scope_end`), once known
        self.content_end = 0  # where the last complete line with content ends
        self._unparsed: list[Chunk] = []  # passed through as they came; parsed only if a rule needs their text

    def feed(self, text: str) -> str:
        """The part of the completion that may be shown now, with `text` appended to what came before."""
        if self.stopped is not None or not text:
            return ""
        self._parse()
        start = max(0, len(self.text) - 16)
        self.text += text
        if "<" in self.text[start:]:
            for marker in MARKERS:
                at = self.text.find(marker, start)
                if at >= 0:
                    self.text = self.text[:at]
                    released = self._advance()
                    return released if self.stopped is not None else released + self._stop("fim_marker", at)
        return self._advance()

    def finish(self) -> str:
        """What is left to show when the upstream ended the completion on its own."""
        if self.stopped is not None:
            return ""
        if self._unparsed and not self.watch_closers:
            return ""  # one line passed through whole, nothing held: what a rule could still cut is shown
        self._parse()
        last = self.text[self.line_start :]
        if last.strip() and (cut := self._rule_for(last, len(self.lines))) is not None:
            return self._stop(*cut)
        if self.hold_reason == "closing":
            return self._stop("duplicate_closing", self.hold_at or 0)
        end = len(self.text)
        if (partial := _partial_marker(last)) >= 4:  # `<|endof`: the start of a marker the upstream cut
            return self._stop("fim_marker", end - partial)
        if self.watch_closers:
            closers = len(last) - len(last.rstrip(CLOSERS))
            overlap = next((n for n in range(min(closers, len(self.rest_of_line)), 0, -1)
                            if last.endswith(self.rest_of_line[:n])), 0)  # fmt: skip
            if overlap:
                return self._stop("duplicate_closing", end - overlap)
        self.hold_at = None
        return self._release(end)

    def _advance(self) -> str:
        """Check each line the new text completed; what may be released (all of it, when a rule ends the
        completion)."""
        while (newline := self.text.find("\n", self.line_start)) >= 0:
            line = self.text[self.line_start : newline]
            cut = self._rule_for(line, len(self.lines))
            if cut is not None:
                return self._stop(*cut)
            if line.strip():
                self.content_end = newline
            self.lines.append(line)
            self.line_start = newline + 1
        if self.lines:
            end = self.content_end  # up to the last complete line with content, without the newlines after it
        else:
            current = self.text
            hold = _partial_marker(current)
            if self.watch_closers:
                hold = max(hold, len(current) - len(current.rstrip(CLOSERS)))
            if self.watch_next is not None:
                written = (self.cursor_line + current).strip()
                if not written or self.watch_next.startswith(written):
                    hold = len(current)  # it may yet be the next line again: shown once it is not
                else:
                    self.watch_next = None
            end = len(current) - hold
        return self._release(end)

    def _rule_for(self, line: str, index: int) -> tuple[str, int] | None:
        """The rule that ends the completion at this complete line, and where it is cut; None to go on."""
        start = self.line_start
        stripped = (self.cursor_line + line if index == 0 else line).strip()
        if not stripped:
            return None
        previous = next((p for p in reversed(self.lines) if p.strip()), None)
        if previous is not None and line.strip() == previous.strip():
            self.repeats += 1
            if self.repeats == 2:
                self.hold_at, self.hold_reason = start - 1, "repeat"
            return ("repeated_line", self.hold_at or 0) if self.repeats >= REPEATS_TO_STOP else None
        self.repeats = 1
        if self.hold_reason == "repeat":
            self.hold_at = self.hold_reason = None
        if (
            self.next_line is not None
            and not _closing_line(self.next_line)
            and _similar(stripped, self.next_line.strip())
        ):
            return "suffix_repeat", max(0, start - 1)
        if index > 0:
            limit = self._scope_limit(line)
            if limit is not None and _indent(line) < limit:
                if _closing_line(line) and self._duplicates_next(line):
                    return "duplicate_closing", start - 1
                return "scope_end", start + len(line) if _closing_line(line) else start - 1
            if _closing_line(line) and self._duplicates_next(line):
                self.hold_at, self.hold_reason = start - 1, "closing"
                return None
        if self.hold_reason == "closing":
            self.hold_at = self.hold_reason = None
        return None

    def _scope_limit(self, line: str) -> int | None:
        """Tabby's `limitScopeByIndentation`: continuing the cursor's line, later lines belong inside its scope;
        opening a block below it, inside that block; else not left of the cursor's line."""
        if self.limit is None and self.prefix_indent is not None:
            first = self.lines[0] if self.lines else ""
            reference = _indent(self.cursor_line + first) if first.strip() else _indent(line)
            if self.cursor_line.strip() and first.strip():
                self.limit = self.prefix_indent + 1
            else:
                self.limit = self.prefix_indent + 1 if reference > self.prefix_indent else self.prefix_indent
        return self.limit

    def _duplicates_next(self, line: str) -> bool:
        next_line = self.next_line
        return next_line is not None and (line.strip() == next_line.strip())

    def _stop(self, rule: str, at: int) -> str:
        self.stopped = rule
        self.hold_at = None
        return self._release(at).rstrip() if at > self.shown else ""

    def _release(self, end: int) -> str:
        if self.hold_at is not None:
            end = min(end, self.hold_at)
        text = self.text[self.shown : max(end, self.shown)]
        self.shown = max(end, self.shown)
        return text

    def _parse(self) -> None:
        if self._unparsed:
            self.text += _joined_text(self._unparsed)
            self.shown = len(self.text)
            self._unparsed.clear()

    def pass_batch(self, batch: Sequence[Chunk]) -> Sequence[Chunk]:
        """The chunks to show for one upstream batch. A plain text event that cannot end a line, hold a marker
        or close a bracket passes through unparsed while the first line streams."""
        if self.stopped is not None:
            return ()
        passed = 0  # the plain events at the start of the batch, passed on as they came
        if not self.lines and self.shown == len(self.text) and self.watch_next is None:
            closers = self.watch_closers
            for chunk in batch:
                raw = chunk.raw
                if raw is None or chunk.finish_reason is not None or chunk.usage is not None or b"<" in raw:
                    break
                if _RAW_NEWLINE in raw or (closers and _may_close(raw)):
                    break
                passed += 1
            if passed:
                self._unparsed.extend(batch[:passed])
                if passed == len(batch):
                    return batch
        shown: list[Chunk] = list(batch[:passed])
        for chunk in batch[passed:]:
            if not self.lines and self.shown == len(self.text) and self._passes(chunk):
                self._unparsed.append(chunk)
                shown.append(chunk)
                continue
            text = self.feed(chunk.text)
            ended = chunk.finish_reason is not None
            if ended and self.stopped is None:
                text += self.finish()
            if self.stopped is not None:
                shown.append(Chunk(text, "stop", chunk.usage, chunk.timings, chunk.model, chunk.created,
                                   chunk.upstream_id))  # fmt: skip
                return shown
            if text == chunk.text:
                shown.append(chunk)
            elif text or ended or chunk.usage is not None or chunk.timings is not None:
                shown.append(Chunk(text, chunk.finish_reason, chunk.usage, chunk.timings, chunk.model, chunk.created,
                                   chunk.upstream_id))  # fmt: skip
        return shown

    def _passes(self, chunk: Chunk) -> bool:
        raw = chunk.raw
        if raw is None or chunk.finish_reason is not None or chunk.usage is not None or self.watch_next is not None:
            return False
        if b"<" in raw or _RAW_NEWLINE in raw:
            return False
        return not (self.watch_closers and _may_close(raw))


def _may_close(raw: bytes) -> bool:
    """Whether a raw event's text may hold a closing bracket (the event's own `]` and `}` are balanced)."""
    return b")" in raw or raw.count(b"]") != raw.count(b"[") or raw.count(b"}") != raw.count(b"{")


def _first_nonblank_line(text: str, start: int, lines: int = 8) -> str | None:
    """The first line with content among the `lines` lines from `start` (without reading the rest of `text`)."""
    for _ in range(lines):
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.strip():
            return line.rstrip()
        if end < 0:
            return None
        start = end + 1
    return None


def _joined_text(chunks: Sequence[Chunk]) -> str:
    """The text of plain events passed through unparsed, parsed in one call."""
    try:
        events = orjson.loads(b"[" + b",".join([chunk.raw or b"null" for chunk in chunks]) + b"]")
        return "".join([event["choices"][0]["text"] for event in events])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return "".join([chunk.text for chunk in chunks])


def _last_nonblank_line(text: str) -> str | None:
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end - 1) + 1
        line = text[start:end].rstrip("\n")
        if line.strip():
            return line
        end = start - 1 if start > 0 else 0
        if start == 0:
            break
    return None
