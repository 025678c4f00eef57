"""`ReuseCache`: answer a keystroke from the session's previous completion when the person typed
what it predicted ("typed-through"), with no upstream request.

A request is answered from an earlier completion of its session when, in the same file and with
the same suffix, its prefix is that completion's prefix plus text the completion began with. The
answer is the rest of the completion: exactly the previous text minus what was typed, never a
guess. The same rule covers a backspace inside the typed-through part and re-asking the same
position (nothing typed). The editor's window may have dropped lines from the top of the prefix
meanwhile: the prefixes are compared at the cursor end, over the context the completion was made for
(its whole prefix, or its last `ALIGN_CHARS`): a new prefix shorter than that is not the same place.

Memory is bounded in bytes, not only in entries: an entry keeps the last `ALIGN_CHARS` of its prefix
and a digest of its suffix (length and hash), never the whole prompt, whatever the client sent.

A completion still streaming can be taken over: the newer request follows it (`mellum_proxy.serving.flight.Flight`)
instead of cancelling it, and is answered once it ends if its text still agrees.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from mellum_proxy.budget.templates import cursor_of
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.serving.flight import Flight
from mellum_proxy.shaping.lines import complete_lines

ENTRIES_PER_SESSION = 4
MAX_SESSIONS = 256
ALIGN_CHARS = 2048  # how much of the prefix before the typed text must agree, at most
MIN_CONTEXT = 256  # ... and at least (or all of a shorter prefix): a few characters are no place at all
STREAM_AHEAD = 64  # how far typing may run past a completion still streaming


SuffixKey = tuple[int, int] | None  # (length, hash) of the text after the cursor


def suffix_key(suffix: str | None) -> SuffixKey:
    """The suffix's digest: a string's hash is computed once and kept by the string itself."""
    return None if suffix is None else (len(suffix), hash(suffix))


@dataclass(eq=False, slots=True)
class Entry:
    file_path: str | None
    prefix_tail: str  # the last ALIGN_CHARS of the prefix the completion was made for
    prefix_len: int
    suffix: SuffixKey
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
        return self.entry.flight.ended_clean

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
        cursor = cursor_of(request)
        if cursor is None:
            return
        entries = self._sessions.pop(request.session, None) or deque(maxlen=ENTRIES_PER_SESSION)
        path, prefix, suffix = cursor
        entries.append(Entry(path, prefix[-ALIGN_CHARS:], len(prefix), suffix_key(suffix), flight))
        self._sessions[request.session] = entries
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def lookup(self, request: NormalizedRequest) -> Hit | None:
        """The newest entry `request` types through: finished with text left, or still streaming and
        agreeing so far."""
        entries = self._sessions.get(request.session)
        cursor = cursor_of(request) if entries else None
        if not entries or cursor is None:
            return None
        file_path, prefix, suffix = cursor
        key = suffix_key(suffix)
        for entry in reversed(entries):
            if entry.file_path != file_path or entry.suffix != key:
                continue
            flight = entry.flight
            if flight.ended and not flight.ended_clean:
                continue
            typed = typed_through(entry.prefix_tail, prefix, entry.text, not flight.ended, entry.prefix_len)
            if typed is None:
                continue
            hit = Hit(entry, typed)
            if not flight.ended or hit.rest(cut=flight.cut_short) is not None:
                return hit
        return None


def rest_end(flight: Flight, start: int, max_tokens: int | None, stops: Sequence[str]) -> tuple[int | None, str | None]:
    """Where the rest of `flight`'s text after `start` characters ends for a request that asks for at most
    `max_tokens` and stops at `stops` (a plugin switching to one line, say), and the finish reason that gives;
    (None, None) when neither limits it. A reused answer is cut as the server would have cut it."""
    text = flight.completion.text
    end: int | None = None
    why: str | None = None
    for stop in stops:
        at = text.find(stop, start) if stop else -1
        if at >= 0 and (end is None or at < end):
            end, why = at, "stop"
    if max_tokens is not None:
        ends = [at for at in flight.token_ends() if at > start]
        if len(ends) > max_tokens and (end is None or ends[max_tokens - 1] < end):
            end, why = ends[max_tokens - 1], "length"
    return end, why


def tokens_in(flight: Flight, start: int, end: int) -> int:
    """How many of `flight`'s tokens the characters `start..end` of its text touch (a piece of one counts)."""
    count = previous = 0
    for at in flight.token_ends():  # token i holds the characters previous..at
        count += at > start and previous < end
        previous = at
    return count


def typed_through(
    old_prefix: str, new_prefix: str, text: str, streaming: bool = False, old_len: int | None = None
) -> str | None:
    """What was typed after `old_prefix` to make `new_prefix`, when it is the start of `text` (for a
    completion still `streaming`: when it agrees with the text so far, or runs up to `STREAM_AHEAD`
    characters past it); None otherwise.

    The prefixes are compared at the cursor end, over the context the completion was made for: its last
    `ALIGN_CHARS` (`old_prefix` holds them; `old_len` was its full length), or as much of them as the new
    prefix has when the editor's window dropped its first lines, but never fewer than `MIN_CONTEXT` (or all
    of a shorter old prefix): a new prefix without that context is another place, however its last
    characters look. The longest typed text that fits wins. The new prefix is never
    copied: the work is linear in the completion's length, whatever the prompt's.
    """
    known = min(len(old_prefix) if old_len is None else old_len, ALIGN_CHARS)
    least = min(known, MIN_CONTEXT)
    longest = min(len(new_prefix), len(text) + (STREAM_AHEAD if streaming else 0))
    for size in range(longest, -1, -1):
        if size:
            if size <= len(text) and text[size - 1] != new_prefix[-1]:
                continue  # the cheap test first: the typed text must end where the completion did
            typed = new_prefix[-size:]
            if not (text.startswith(typed) if size <= len(text) else typed.startswith(text)):
                continue
        else:
            typed = ""
        end = len(new_prefix) - size  # where the text before the typed part ends
        span = min(known, end)
        if span < least or (known == 0 and end > 0):
            continue  # it lacks the context the completion was made for
        if new_prefix.startswith(old_prefix[len(old_prefix) - span :], end - span, end):
            return typed
    return None
