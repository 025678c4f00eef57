"""Typed-through reuse: the answer is exactly the previous completion minus what was typed, never a guess."""

from __future__ import annotations

from mellum_proxy.models import BudgetedPrompt, Chunk, Completion, NormalizedRequest
from mellum_proxy.serving.flight import Flight
from mellum_proxy.serving.reuse import ReuseCache, typed_through


def test_typed_through_finds_what_was_typed() -> None:
    assert typed_through("def f(", "def f(x", "x, y):") == "x"
    assert typed_through("def f(", "def f(", "x, y):") == ""  # the same position again
    assert typed_through("def f(", "def f(z", "x, y):") is None  # typed something else
    assert typed_through("def f(", "def f(x, y):", "x, y):") == "x, y):"  # typed all of it


def test_typed_through_follows_a_window_that_dropped_its_first_lines() -> None:
    lines = "".join(f"line {i}\n" for i in range(100))
    assert typed_through(lines + "def f(", lines[7:] + "def f(x,", "x, y):") == "x,"
    assert typed_through(lines + "def f(", lines[7:-1] + "!def f(x,", "x, y):") is None  # not the same text


def test_a_few_characters_are_not_the_place_a_completion_was_made_for() -> None:
    """Another file whose last characters before the cursor happen to match: not the same place."""
    old = "".join(f"value_{i} = compute({i})\n" for i in range(40)) + "total = "
    for new in ("l = co", "= co", " co", "co"):
        assert typed_through(old, new, "compute(1)") is None
    assert typed_through("x = ", "x = co", "compute(1)") == "co"  # a prefix that short is all there was


def test_typed_through_a_completion_still_streaming() -> None:
    assert typed_through("f(", "f(x, y", "x, ", streaming=True) == "x, y"  # ran past what has arrived
    assert typed_through("f(", "f(x", "x, ", streaming=True) == "x"
    assert typed_through("f(", "f(q", "x, ", streaming=True) is None


def _request(prefix: str, suffix: str | None = "\n", file: str = "a.py", session: str = "s") -> NormalizedRequest:
    return NormalizedRequest(id="r", route="test", session=session, prefix=prefix, suffix=suffix, file_path=file)


PROMPT = BudgetedPrompt("p", None, 16, (), 1, 1, False, "chars")


def _done(text: str) -> Flight:
    completion = Completion(id="c")
    completion.add(Chunk(text, finish_reason="stop"))
    flight = Flight(completion, PROMPT)
    flight.ended_on_its_own = True  # the upstream ended it on its own
    flight.end()
    return flight


def test_cache_answers_the_rest_and_keeps_the_original_for_backspace() -> None:
    cache = ReuseCache()
    cache.remember(_request("x = "), _done("compute(1)"))
    hit = cache.lookup(_request("x = comp"))
    assert hit is not None and hit.final and hit.rest() == "ute(1)"
    back = cache.lookup(_request("x = co"))  # a backspace inside the typed-through part
    assert back is not None and back.rest() == "mpute(1)"
    again = cache.lookup(_request("x = "))
    assert again is not None and again.rest() == "compute(1)"


def test_cache_refuses_what_does_not_fit() -> None:
    cache = ReuseCache()
    cache.remember(_request("x = "), _done("compute(1)"))
    assert cache.lookup(_request("x = compute(1)")) is None  # nothing left to offer
    assert cache.lookup(_request("x = comp", suffix="\ny")) is None  # the suffix changed
    assert cache.lookup(_request("x = comp", file="b.py")) is None
    assert cache.lookup(_request("x = comp", session="other")) is None
    assert cache.lookup(_request("x = comp", suffix=None)) is None  # no suffix: not a cursor position


def test_a_failed_completion_is_never_reused() -> None:
    cache = ReuseCache()
    completion = Completion(id="c")
    completion.add(Chunk("compute(1)"))
    flight = Flight(completion, PROMPT)
    flight.end(RuntimeError("upstream dropped"))
    cache.remember(_request("x = "), flight)
    assert cache.lookup(_request("x = comp")) is None


def test_a_prompt_the_client_rendered_itself_is_read_at_its_cursor() -> None:
    from mellum_proxy.budget.templates import MELLUM, FimParts

    cache = ReuseCache()
    cache.remember(_request(MELLUM.render(FimParts("x = ", "\n", "a.py")), suffix=None), _done("compute(1)"))
    hit = cache.lookup(_request(MELLUM.render(FimParts("x = comp", "\n", "a.py")), suffix=None))
    assert hit is not None and hit.rest() == "ute(1)"


def test_memory_is_bounded_in_bytes_not_in_entries() -> None:
    """An entry keeps the last ALIGN_CHARS of its prefix and a digest of its suffix, whatever the prompt's size:
    4 MB prompts in non-Latin-1 text (4 bytes a character) once kept 2 GB for 128 requests."""
    import tracemalloc

    from mellum_proxy.serving.reuse import ALIGN_CHARS, ENTRIES_PER_SESSION

    big = "значение = вычислить(1)\n" * 170_000  # ~4 MB of text, outside Latin-1
    tracemalloc.start()
    cache = ReuseCache()
    before = tracemalloc.get_traced_memory()[0]
    for session in range(32):
        for entry in range(ENTRIES_PER_SESSION):
            prefix = big + f"# {session}/{entry}\n"  # a new 4 MB string each time, dropped after the call
            cache.remember(_request(prefix, suffix=big, session=str(session)), _done("xyz"))
    del prefix
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert kept < 32 * ENTRIES_PER_SESSION * (ALIGN_CHARS * 4 + 4096), kept  # ~8 KB an entry at most
    last = big + "# 31/3\n"
    hit = cache.lookup(_request(last + "x", suffix=big, session="31"))
    assert hit is not None and hit.typed == "x"  # and it still answers


def test_a_huge_prefix_is_never_copied_to_look_it_up() -> None:
    """The lookup slices only the typed text: its work follows the completion's length, not the prompt's."""

    class Counting(str):
        copies = 0

        def __getitem__(self, key: object) -> str:
            if isinstance(key, slice) and (key.stop or 0) - (key.start or 0) > 10_000:
                Counting.copies += 1
            return str.__getitem__(self, key)  # type: ignore[index]

    prefix = Counting("x = 1\n" * 700_000 + "total = ")
    assert typed_through(str(prefix), prefix + "comp", "compute(1)" * 20) == "comp"
    assert Counting.copies == 0
