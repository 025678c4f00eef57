"""What a cut completion shows: complete lines only, once it has gone past its first line."""

from __future__ import annotations

from mellum_proxy.models import Chunk
from mellum_proxy.shaping.lines import LineGate, complete_lines


def shown(gate: LineGate, *pieces: str) -> str:
    return "".join(gate.feed(piece) for piece in pieces)


def test_the_first_line_streams_as_it_comes() -> None:
    gate = LineGate()
    assert shown(gate, "total = ", "sum(u.age", " for u in users)") == "total = sum(u.age for u in users)"
    assert gate.flush() == ""


def test_after_the_first_line_only_complete_lines_with_content_are_shown() -> None:
    gate = LineGate()
    assert shown(gate, "    return average", "\n\n", "\nif ") == "    return average"
    assert gate.held == "\n\n\nif "  # dropped when cut
    assert shown(gate, "x:\n") == "\n\n\nif x:"
    assert gate.flush() == "\n"  # an answer that ended on its own gets everything


def test_a_cut_text_ends_at_its_last_line_with_content() -> None:
    assert complete_lines("    return average\n\n\nif ") == "    return average"
    assert complete_lines("sum(u.age") == "sum(u.age"  # one line: all of it
    assert complete_lines("\n    total = sum(") == ""


def test_a_batch_without_a_newline_passes_unparsed() -> None:
    gate = LineGate()
    batch = [Chunk(None, raw=b'{"choices":[{"text":"x = 1"}]}')]
    assert gate.pass_batch(batch) is batch


def test_the_proxys_token_cap_cuts_like_a_deadline() -> None:
    gate = LineGate(capped=True)
    out = gate.pass_batch([Chunk("a\nb\n"), Chunk("print(f", finish_reason="length")])
    assert "".join(chunk.text for chunk in out) == "a\nb" and out[-1].finish_reason == "length"
    gate = LineGate()  # the client's own max_tokens: as the server wrote it
    out = gate.pass_batch([Chunk("a\nb\n"), Chunk("print(f", finish_reason="length")])
    assert "".join(chunk.text for chunk in out) == "a\nb\nprint(f"
    gate = LineGate(capped=True)
    out = gate.pass_batch([Chunk("a\nb\n"), Chunk("c", finish_reason="stop")])
    assert "".join(chunk.text for chunk in out) == "a\nb\nc"
