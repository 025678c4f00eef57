"""Post-processing while streaming: each rule on its own, at any chunk boundary, and idempotent."""

from __future__ import annotations

import orjson
import pytest

from mellum_proxy.models import Chunk
from mellum_proxy.shaping.cleanup import Cleaner


def clean(prefix: str, suffix: str | None, text: str, step: int = 0) -> tuple[str, str | None]:
    """The cleaned completion and the rule that ended it, fed `step` characters at a time (0: at once)."""
    cleaner = Cleaner(prefix, suffix)
    shown = ""
    for at in range(0, len(text), step or max(1, len(text))):
        shown += cleaner.feed(text[at : at + (step or len(text))])
    if cleaner.stopped is None:
        shown += cleaner.finish()
    return shown, cleaner.stopped


PY_PREFIX = "import os\n\n\ndef area(w, h):\n    "
PY_SUFFIX = "\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
CASES = [
    # (rule, prefix, suffix, what the model wrote, what the client sees)
    ("suffix_repeat", PY_PREFIX, PY_SUFFIX, "return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n",
     "return w * h"),
    ("suffix_repeat", PY_PREFIX, PY_SUFFIX, "return w * h\n\ndef perimeter(w,h):\n", "return w * h"),  # near
    ("repeated_line", "total = 0\n", "\n", "total += 1\n" * 30, "total += 1"),
    ("fim_marker", "x = ", "\n", "compute()<fim_suffix>\ny = 2<|endoftext|>", "compute()"),
    ("fim_marker", "x = ", "\n", "compute()\n<filename>other.py\nimport os", "compute()"),
    ("scope_end", PY_PREFIX, "\n", "return w * h\n\n\nclass Shape:\n    pass\n", "return w * h"),
    ("scope_end", "    value = compute(", "\n", "a,\n        b)\n    other = 1\n", "a,\n        b)"),
    ("scope_end", "function f() {\n    ", "\nfunction g() {}\n", "return 1;\n}\nfunction h() {}\n",
     "return 1;\n}"),  # the closing line stays
    ("duplicate_closing", "function f() {\n    ", "\n}\n", "return 1;\n}\n", "return 1;"),
    ("duplicate_closing", "print(max(a, b", "))\n", "))", ""),
    ("duplicate_closing", "value = compute(a", ")\n", ", b)", ", b"),
    (None, PY_PREFIX, PY_SUFFIX, "return w * h", "return w * h"),
    (None, "x = [\n    ", "\n]\n", "1,\n    2,\n    3,", "1,\n    2,\n    3,"),
    (None, "total = 0\n", "\n", "total += 1\ntotal += 1\n", "total += 1\ntotal += 1\n"),  # twice is code
    (None, "if a < b", ":\n", " and c <= d", " and c <= d"),  # a `<` that starts no marker
]  # fmt: skip


@pytest.mark.parametrize(("rule", "prefix", "suffix", "written", "shown"), CASES)
@pytest.mark.parametrize("step", [0, 1, 3])
def test_each_rule_at_any_chunk_boundary(
    rule: str | None, prefix: str, suffix: str, written: str, shown: str, step: int
) -> None:
    assert clean(prefix, suffix, written, step) == (shown, rule)


@pytest.mark.parametrize(("rule", "prefix", "suffix", "written", "shown"), CASES)
def test_cleaning_a_clean_completion_changes_nothing(
    rule: str | None, prefix: str, suffix: str, written: str, shown: str
) -> None:
    again, stopped = clean(prefix, suffix, shown)
    assert again == shown and stopped in (None, rule)


def event(text: str) -> Chunk:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": None}
    return Chunk(None, raw=orjson.dumps({"id": "c", "object": "text_completion", "choices": [choice]}))


def test_plain_first_line_events_pass_through_unparsed() -> None:
    cleaner = Cleaner("def f(a, b):\n    ", "\n")
    batch = [event("x = comp"), event("ute(a")]
    shown = cleaner.pass_batch(batch)
    assert all(a is b for a, b in zip(shown, batch, strict=True)) and all(chunk._text is None for chunk in batch)
    shown = cleaner.pass_batch([event(", b)\n    y = 1\n")])  # a newline: read; lines released when complete
    assert [chunk.text for chunk in shown] == [", b)\n    y = 1"]
    shown = cleaner.pass_batch([event("    y = 1\n    y = 1\n")])
    assert cleaner.stopped == "repeated_line" and [(c.text, c.finish_reason) for c in shown] == [("", "stop")]


def test_the_end_of_the_answer_releases_what_was_held() -> None:
    cleaner = Cleaner("items = [", "\n")
    assert [c.text for c in cleaner.pass_batch([event("1, 2]")])] == ["1, 2]"]  # no `]` after the cursor: not held
    cleaner = Cleaner("call(", ")\n")
    assert [c.text for c in cleaner.pass_batch([event("a, b)")])] == ["a, b"]  # the `)` may be the suffix's
    final = cleaner.pass_batch([Chunk("", finish_reason="stop", usage={"completion_tokens": 3})])
    assert [(c.text, c.finish_reason) for c in final] == [("", "stop")] and cleaner.stopped == "duplicate_closing"


def test_a_first_line_that_becomes_the_next_line_is_never_shown() -> None:
    prefix, suffix = "        elif c == ')':\n            ", "\n            current.append(c)\n"
    for step in (1, 4, 0):
        assert clean(prefix, suffix, "current.append(c)", step) == ("", "suffix_repeat")
    cleaner = Cleaner(prefix, suffix)
    assert cleaner.feed("current.app") == ""  # held: it may be the next line again
    assert cleaner.feed("end = 1") == "current.append = 1"  # it is not: shown, and no longer held
    assert cleaner.feed(" + 2") == " + 2"
