"""`ReuseCache`: answer a keystroke from the session's previous completion when the person typed
what it predicted ("typed-through"), with no upstream request.

A request is answered from an earlier completion of its session when, in the same file and with
the same suffix, its prefix is that completion's prefix plus text the completion began with. The
answer is the rest of the completion: exactly the previous text minus what was typed, never a
guess. The same rule covers a backspace inside the typed-through part and re-asking the same
position (nothing typed). The editor's window may have dropped lines from the top of the prefix
meanwhile: the prefixes are compared at the cursor end.

A completion still streaming can be taken over: the newer request follows it (`Flight`) instead of
cancelling it, and is answered once it ends if its text still agrees.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from proxy.budget.templates import parse_any
from proxy.models import BudgetedPrompt, Chunk, Completion, NormalizedRequest
from proxy.policies.lines import complete_lines

ENTRIES_PER_SESSION = 4
MAX_SESSIONS = 256
ALIGN_CHARS = 2048  # how much of the prefix before the typed text must agree, at most
STREAM_AHEAD = 64  # how far typing may run past a completion still streaming


@dataclass(eq=False, slots=True)
class Flight:
    """One upstream completion as it streams: its batches, its end, and who follows it.

    `listeners` counts the requests relaying it to a client (its own request, and any that took it
    over); the upstream request is dropped when the last one leaves.
    """

    completion: Completion
    prompt: BudgetedPrompt  # what the upstream is asked
    batches: list[list[Chunk]] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    listeners: int = 1
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    producer: asyncio.Task[None] | None = None  # the task streaming it from the upstream
    stop_at_first_token: bool = False  # kept only to finish its prefill
    first_text_at: float | None = None
    finished: bool = False  # the upstream ended it on its own (not cut by a deadline, a cancel or an error)
    capped: bool = False  # the proxy asked for fewer tokens than the client did

    def push(self, batch: list[Chunk]) -> None:
        self.batches.append(batch)
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait(self, seen: int) -> None:
        """Return once there are more than `seen` batches, or it has ended."""
        while not self.done and len(self.batches) <= seen:
            await self.changed.wait()

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    @property
    def cut(self) -> bool:
        """Cut short: by a deadline, a cancel or an error, or by the upstream at the proxy's `max_tokens` cap."""
        return not self.finished or (self.capped and self.completion.finish_reason == "length")


@dataclass(eq=False, slots=True)
class Entry:
    file_path: str | None
    prefix: str
    suffix: str | None
    flight: Flight

    @property
    def text(self) -> str:
        return self.flight.completion.text


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    typed: str  # what was typed since the entry's prefix (the start of the entry's text)

    @property
    def final(self) -> bool:
        return self.entry.flight.ok

    def rest(self, cut: bool = False) -> str | None:
        """The entry's text after what was typed, or None when it has no more to offer or disagrees. Of a
        completion that was `cut`, only what it shows (`complete_lines`)."""
        text = self.entry.text
        if cut:
            text = complete_lines(text)
        if not text.startswith(self.typed) or len(text) <= len(self.typed):
            return None
        return text[len(self.typed) :]


class ReuseCache:
    def __init__(self) -> None:
        self._sessions: OrderedDict[str, deque[Entry]] = OrderedDict()

    def remember(self, request: NormalizedRequest, flight: Flight) -> None:
        """Keep `request`'s completion (streaming or not) for later keystrokes of its session."""
        cursor = _cursor(request)
        if cursor is None:
            return
        entries = self._sessions.pop(request.session, None) or deque(maxlen=ENTRIES_PER_SESSION)
        entries.append(Entry(cursor[0], cursor[1], cursor[2], flight))
        self._sessions[request.session] = entries
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def lookup(self, request: NormalizedRequest) -> Hit | None:
        """The newest entry `request` types through: finished with text left, or still streaming and
        agreeing so far."""
        entries = self._sessions.get(request.session)
        cursor = _cursor(request) if entries else None
        if not entries or cursor is None:
            return None
        file_path, prefix, suffix = cursor
        for entry in reversed(entries):
            if entry.file_path != file_path or entry.suffix != suffix:
                continue
            flight = entry.flight
            if flight.done and not flight.ok:
                continue
            typed = typed_through(entry.prefix, prefix, entry.text, streaming=not flight.done)
            if typed is None:
                continue
            hit = Hit(entry, typed)
            if not flight.done or hit.rest(cut=flight.cut) is not None:
                return hit
        return None


def _cursor(request: NormalizedRequest) -> tuple[str | None, str, str] | None:
    """(file, text before, text after) the cursor; from a prompt the client rendered itself when it sent
    no suffix (a plain completion without FIM markers has no cursor to type through: None)."""
    if request.suffix is not None:
        return request.file_path, request.prefix, request.suffix
    parsed = parse_any(request.prefix)
    if parsed is None:
        return None
    parts = parsed[1]
    return parts.path or request.file_path, parts.prefix, parts.suffix


def typed_through(old_prefix: str, new_prefix: str, text: str, streaming: bool = False) -> str | None:
    """What was typed after `old_prefix` to make `new_prefix`, when it is the start of `text` (for a
    completion still `streaming`: when it agrees with the text so far, or runs up to `STREAM_AHEAD`
    characters past it); None otherwise.

    The prefixes are compared at the cursor end, over at most `ALIGN_CHARS` (the editor's window may
    drop its first lines as the person types); the longest typed text that fits wins.
    """
    longest = min(len(new_prefix), len(text) + (STREAM_AHEAD if streaming else 0))
    for size in range(longest, -1, -1):
        if size:
            last = new_prefix[-1]
            if size <= len(text) and text[size - 1] != last:
                continue  # the cheap test first: the typed text must end where the completion did
            typed = new_prefix[-size:]
            if not (text.startswith(typed) if size <= len(text) else typed.startswith(text)):
                continue
        else:
            typed = ""
        before = new_prefix[: len(new_prefix) - size]
        span = min(len(old_prefix), len(before), ALIGN_CHARS)
        if span == 0 and (old_prefix or before):
            continue  # nothing to align on
        if before[len(before) - span :] == old_prefix[len(old_prefix) - span :]:
            return typed
    return None
