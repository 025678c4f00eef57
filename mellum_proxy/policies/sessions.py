"""`Documents`: editors that say nothing of themselves, told apart by what they edit.

A plugin that sends no `X-Session-Id` and no `user` gets the session `default/<User-Agent>`; two of them with the
same agent (llama.vim in two windows: both curl) would share it, and each keystroke of one would supersede the
other's request. Within such a session a request belongs to the document whose last request it continues: the
text just above the cursor's line, or just below it, that the document's last request had is still there
(typing on, a new line, a backspace keep it; another file does not). A request near no known document starts a
new one; one that carries too little text to tell (a short file, a one-line prompt) stays with the latest.

A look-ahead (llama.vim asks for the completion after its suggestion as soon as it shows one: the prefix carries a
suggestion the person has not typed) is the document's, and never moves its samples: moved onto the suggestion's
lines, the next keystroke (which lacks them) started a new document, its typed-through requests went to the
server, and one editor became 5-14 sessions in 90 s of typing.

What is kept: two samples of `SAMPLE_CHARS` characters per document, `MAX_DOCUMENTS` documents per session,
for `MAX_SESSIONS` sessions, in memory; nothing of it is logged.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from mellum_proxy.models import ANONYMOUS_SESSION, Completion, NormalizedRequest

SAMPLE_CHARS = 96
MIN_SAMPLE_CHARS = 16  # shorter samples say nothing about which file it is
SEARCH_CHARS = 4096  # how far from the cursor a document's sample is looked for
MAX_DOCUMENTS = 8
MAX_SESSIONS = 256


@dataclass(slots=True)
class _Document:
    number: int
    above: str  # the text just above the cursor's line, at its last request
    below: str  # the text just below it
    shown: str = ""  # the last suggestion it was shown, trailing space stripped (read when it was shown, after
    # its answer: not on the way to the next request's first token)


def _samples(request: NormalizedRequest) -> tuple[str, str]:
    prefix, suffix = request.prefix, request.suffix or ""
    line_start = prefix.rfind("\n")
    above = prefix[max(0, line_start - SAMPLE_CHARS) : line_start] if line_start > 0 else ""
    line_end = suffix.find("\n")
    below = suffix[line_end + 1 : line_end + 1 + SAMPLE_CHARS] if line_end >= 0 else ""
    return above.strip(), below.strip()


class Documents:
    """Gives each document of an anonymous session a session of its own (`assign`)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, list[_Document]] = OrderedDict()  # each: most recent document first

    def assign(self, request: NormalizedRequest) -> NormalizedRequest:
        """`request`, its session named for its document where the client named none (else unchanged)."""
        if request.session != ANONYMOUS_SESSION and not request.session.startswith(ANONYMOUS_SESSION + "/"):
            return request
        documents = self._sessions.get(request.session)
        if documents is None:
            documents = self._sessions[request.session] = []
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(request.session)
        above, below = _samples(request)
        document = self._continued(documents, request, above, below)
        if document is None:
            document = _Document(max((d.number for d in documents), default=-1) + 1, above, below)
            del documents[MAX_DOCUMENTS - 1 :]
        else:
            documents.remove(document)
            if not _looks_ahead(request, document.shown):
                document.above, document.below = above or document.above, below or document.below
        documents.insert(0, document)
        if document.number == 0:
            return request
        return replace(request, session=f"{request.session}#{document.number}")

    def held(self) -> int:
        """The documents kept, over every anonymous session (bounded: `MAX_SESSIONS` x `MAX_DOCUMENTS`)."""
        return sum(len(documents) for documents in self._sessions.values())

    def shown(self, session: str, completion: Completion) -> None:
        """`completion` was shown for a request of `session` (as `assign` named it): its text is what a
        look-ahead of that document carries."""
        base, sep, number = session.rpartition("#")
        if not (sep and number.isdigit()):
            base, number = session, "0"
        for document in self._sessions.get(base, ()):
            if document.number == int(number):
                document.shown = completion.text.rstrip()
                return

    @staticmethod
    def _continued(documents: list[_Document], request: NormalizedRequest, above: str, below: str) -> _Document | None:
        if len(above) < MIN_SAMPLE_CHARS and len(below) < MIN_SAMPLE_CHARS:
            return documents[0] if documents else None  # too little to tell: the latest
        before, after = request.prefix[-SEARCH_CHARS:], (request.suffix or "")[:SEARCH_CHARS]
        for document in documents:
            if len(document.above) >= MIN_SAMPLE_CHARS and document.above in before:
                return document
            if len(document.below) >= MIN_SAMPLE_CHARS and document.below in after:
                return document
        return None


def _looks_ahead(request: NormalizedRequest, shown: str) -> bool:
    """Whether `request`'s prefix ends with the suggestion last shown (a look-ahead past text not yet typed); only
    the prefix's end is looked at (a copy of all of it, stripped, cost a file's length every keystroke)."""
    if len(shown) < MIN_SAMPLE_CHARS // 4:
        return False
    return request.prefix[-(len(shown) + SEARCH_CHARS) :].rstrip().endswith(shown)
