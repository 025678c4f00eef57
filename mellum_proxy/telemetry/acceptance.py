"""Inferred acceptance: how much of each shown suggestion the person kept, seen from the session's later
requests.

A plugin reports acceptance only to its own vendor, but the proxy sees the session's next request: when its
prefix holds the old one's end followed by text the suggestion began with, that text was kept (typed through,
or accepted at once and typed on). A request whose prefix carries the whole suggestion and nothing after it says
nothing yet: llama.vim sends such a look-ahead as soon as it shows a suggestion, before the person took any of it
(its own completion is not judged). Each suggestion is judged once, when it is settled: the person typed past
it or away from it, a new suggestion replaced it, or the proxy shuts down (then by what was seen so far).
What is kept to judge it: the last 64 characters before the cursor and the suggestion itself, one per
session, for at most `MAX_SESSIONS` sessions; nothing of it is logged.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mellum_proxy.models import Completion, NormalizedRequest

ANCHOR_CHARS = 64  # of the prefix, to find where the old cursor is in the next request's prefix
SEARCH_CHARS = 4096  # how far before the cursor the old cursor is looked for (what was typed since, at most)
MAX_SESSIONS = 1024
MAX_PENDING = 4096  # requests in flight whose anchor is kept until they end


@dataclass(frozen=True, slots=True)
class Judged:
    """A settled suggestion: its request, and how many of its characters the person kept."""

    request_id: str
    session: str
    accepted_chars: int


@dataclass(slots=True)
class _Shown:
    request_id: str
    anchor: str
    completion: Completion  # its text is read only when a later request needs it (events arrive unparsed)
    kept: int = 0  # seen kept so far (the person may still be typing through it)

    @property
    def text(self) -> str:
        return self.completion.text


class AcceptanceTracker:
    """Judges the suggestions of each session from its next requests (`arrived`, `shown`, `settle_all`)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Shown] = OrderedDict()
        self._anchors: dict[str, str] = {}  # request id -> anchor, while the request is served

    def arrived(self, request: NormalizedRequest) -> Judged | None:
        """A new request of a session: how much of the session's last suggestion it shows was kept; the
        suggestion, once that is settled."""
        if len(self._anchors) < MAX_PENDING:
            self._anchors[request.id] = request.prefix[-ANCHOR_CHARS:]
        last = self._sessions.get(request.session)
        if last is None:
            return None
        prefix = request.prefix
        window = prefix[-(len(last.anchor) + SEARCH_CHARS) :]
        at = window.rfind(last.anchor) if last.anchor else -1
        if at < 0:  # the cursor is somewhere else (or the file): it was not kept further
            return self._settle(request.session)
        typed = window[at + len(last.anchor) :]
        if not typed:
            return None  # asked again at the same place: nothing to judge by yet
        if typed == last.text:  # a look-ahead (or an accept the next request will confirm): no evidence yet
            self._anchors.pop(request.id, None)
            return None
        kept = _common_prefix(typed, last.text)
        last.kept = max(last.kept, kept)
        if kept == len(last.text) or kept < len(typed):  # all of it, or the person wrote something else
            return self._settle(request.session)
        return None  # still typing through it

    def shown(self, request_id: str, session: str, completion: Completion | None, reused: bool) -> Judged | None:
        """A completion was shown for `request_id` (None: nothing was; `reused`: the rest of an earlier suggestion,
        which is judged as that one). The suggestion it replaces, settled."""
        anchor = self._anchors.pop(request_id, None)
        if reused or completion is None or not completion.has_text or anchor is None:
            return None
        settled = self._settle(session)
        self._sessions[session] = _Shown(request_id, anchor, completion)
        if len(self._sessions) > MAX_SESSIONS:
            oldest = next(iter(self._sessions))
            self._sessions.pop(oldest)  # an idle session's last suggestion goes unjudged
        return settled

    def ended(self, request_id: str) -> None:
        """A request ended without a suggestion shown."""
        self._anchors.pop(request_id, None)

    def settle_all(self) -> list[Judged]:
        """Every suggestion still open, by what was seen (at shutdown)."""
        return [judged for session in list(self._sessions) if (judged := self._settle(session)) is not None]

    def _settle(self, session: str) -> Judged | None:
        last = self._sessions.pop(session, None)
        if last is None:
            return None
        return Judged(last.request_id, session, last.kept)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
