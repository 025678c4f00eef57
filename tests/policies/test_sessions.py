"""Editors that say nothing of themselves, told apart by the document they edit."""

from __future__ import annotations

from mellum_proxy.models import Chunk, Completion, NormalizedRequest
from mellum_proxy.policies.sessions import MAX_DOCUMENTS, Documents

A = "import os\n\ndef load(path):\n    with open(path) as f:\n        return f.read()\n\n"
B = 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, world")\n}\n\n'


def ask(documents: Documents, prefix: str, suffix: str = "", session: str = "default/curl/8.5") -> str:
    return documents.assign(NormalizedRequest(id="r", route="d", session=session, prefix=prefix, suffix=suffix)).session


def test_two_files_get_two_sessions_and_typing_on_keeps_each() -> None:
    documents = Documents()
    first = ask(documents, A + "def sa")
    second = ask(documents, B + "func ad")
    assert first == "default/curl/8.5" and second != first
    assert ask(documents, A + "def save(") == first  # typing on
    assert ask(documents, B + "func add(a, b int) int {\n\treturn a") == second  # a new line too
    assert ask(documents, A + "def save(path, text):\n    with open(path, 'w') as f:\n        f.wr") == first
    assert ask(documents, A + "def save(path, text):\n    with open(path, 'w') as f:\n        ") == first  # backspaces


def test_named_sessions_and_texts_too_short_to_tell_are_left_alone() -> None:
    documents = Documents()
    assert ask(documents, A + "x", session="tab-7") == "tab-7"
    assert ask(documents, A + "x") == "default/curl/8.5"
    assert ask(documents, "def f(") == "default/curl/8.5"  # too little to tell: the latest document
    assert ask(documents, B + "x") != "default/curl/8.5"
    assert ask(documents, "x = ") == ask(documents, B + "y")  # the latest is B's now


def test_the_documents_kept_are_bounded() -> None:
    documents = Documents()
    sessions = {ask(documents, f"# file {i}\n" + "\n".join(f"line {i}.{j} of some text" for j in range(9)) + "\n")
                for i in range(3 * MAX_DOCUMENTS)}  # fmt: skip
    assert len(sessions) == 3 * MAX_DOCUMENTS
    assert all(len(kept) <= MAX_DOCUMENTS for kept in documents._sessions.values())


def shown(documents: Documents, session: str, text: str) -> None:
    completion = Completion(id="c")
    completion.add(Chunk(text))
    documents.shown(session, completion)


def test_a_look_ahead_past_a_multi_line_suggestion_keeps_the_document() -> None:
    """llama.vim at the end of a file: a suggestion of several lines is shown, a look-ahead asks past it at once,
    and the person types on without it: one document throughout (it was a new one after every look-ahead)."""
    documents = Documents()
    typed = A + "def save(path, text):\n    with open(path, 'w') as f:\n"
    session = ask(documents, typed + "        f")
    suggestion = ".write(text)\n        f.flush()\n        return len(text)\n    # saved, and its length\n"
    shown(documents, session, suggestion)
    assert ask(documents, typed + "        f" + suggestion) == session  # the look-ahead
    for typed_on in ("        f.", "        f.w", "        f.wr"):  # typing through it, not taking it
        assert ask(documents, typed + typed_on) == session
    assert len(documents._sessions[session]) == 1


def test_one_editor_typing_one_file_for_long_stays_one_session() -> None:
    """Lines typed one keystroke at a time, each keystroke's suggestion (two lines) followed by its look-ahead."""
    documents = Documents()
    text, sessions = A, set()
    for line in range(60):
        for end in range(1, 30, 3):
            request = text + f"    value_{line} = compute({line}, 'abcdefghijklmnop')"[:end]
            session = ask(documents, request)
            sessions.add(session)
            suggestion = f"rest_{line}()\n    other_{line} = 1\n"
            shown(documents, session, suggestion)
            sessions.add(ask(documents, request + suggestion))
        text += f"    value_{line} = compute({line}, 'abcdefghijklmnop')\n"
    assert sessions == {"default/curl/8.5"}
