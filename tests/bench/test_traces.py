"""Trace format, converters (round-trip to the recorded end state) and the synthetic generator."""

from __future__ import annotations

import gzip
import itertools
import statistics
from pathlib import Path

import orjson
import pytest

from mellum_proxy.tuning.workloads.convert import from_josephg, from_progsnap2, from_recording
from mellum_proxy.tuning.workloads.corpus import code_files
from mellum_proxy.tuning.workloads.synth import synthesize
from mellum_proxy.tuning.workloads.trace import (
    Edit,
    Open,
    Trace,
    TraceError,
    next_typed,
    read_trace,
    replay_text,
    write_trace,
)

TRACES = Path(__file__).resolve().parents[2] / "mellum_proxy" / "tuning" / "traces"


@pytest.mark.parametrize("name", ["json-crdt-blog-post", "sveltecomponent"])
def test_josephg_traces_round_trip_to_their_end_content(name: str, tmp_path: Path) -> None:
    path = TRACES / f"{name}.json.gz"
    trace = from_josephg(path)
    end = orjson.loads(gzip.open(path).read())["endContent"]
    assert list(replay_text(trace.events).values()) == [end]
    assert trace.edits > 15_000 and trace.header["license"] == "CC BY 4.0"
    write_trace(trace, tmp_path / "t.jsonl")  # and through the file format
    assert list(replay_text(read_trace(tmp_path / "t.jsonl").events).values()) == [end]


def test_progsnap2_csv(tmp_path: Path) -> None:
    csv_file = tmp_path / "keys.csv"
    csv_file.write_text(
        "EventType,SourceLocation,InsertText,DeleteText,ClientTimestamp,CodeStateSection\n"
        "File.Edit,0,def f,,2024-01-01T10:00:00.000Z,a.py\n"
        "File.Edit,5,(x):,,2024-01-01T10:00:00.250Z,a.py\n"
        "File.Edit,4,,f,2024-01-01T10:00:01.000Z,a.py\n"
        "File.Edit,4,g,,2024-01-01T10:00:01.100Z,a.py\n"
    )
    trace = from_progsnap2(csv_file)
    assert replay_text(trace.events) == {"a.py": "def g(x):"}
    assert [e.t_ms for e in trace.events if isinstance(e, Edit)] == [0, 250, 1000, 1100]


def test_recording_with_and_without_text(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(b"\n".join([
        orjson.dumps({"t": 100.0, "session": "s", "file": "a.py", "prefix_chars": 3, "suffix_chars": 2}),
        orjson.dumps({"t": 100.5, "session": "s", "file": "a.py", "prefix_chars": 4, "suffix_chars": 2,
                      "prompt": "abcd", "suffix": "ef"}),
    ]))  # fmt: skip
    trace = from_recording(rec)
    assert trace.events[0] == Open(0, "a.py", "xxxxx") and trace.events[1] == Edit(0, "a.py", 3, 0, "")
    assert trace.events[2] == Open(500, "a.py", "abcdef") and trace.events[3].offset == 4  # type: ignore[union-attr]


def test_a_recording_that_types_on_becomes_the_typing(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    lines = [("def f", ")"), ("def f(x", ")"), ("def f(", ")"), ("def g(", ")")]  # type, backspace, jump
    rec.write_bytes(b"\n".join(orjson.dumps({"t": 10.0 + i, "session": "s", "file": "a.py", "prompt": prompt,
                                             "suffix": suffix, "prefix_chars": len(prompt), "suffix_chars": 1})
                                for i, (prompt, suffix) in enumerate(lines)))  # fmt: skip
    events = from_recording(rec).events
    assert events[2:4] == [Edit(1000, "a.py", 5, 0, "(x"), Edit(2000, "a.py", 6, 1, "")]
    assert events[4] == Open(3000, "a.py", "def g()")
    assert next_typed(events)[1] == "(x"  # what the person typed after the first request, to be predicted


def test_bad_traces_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t_ms": 10, "file": "a", "text": ""}\n{"t_ms": 5, "file": "a", "offset": 0, "insert": "x"}\n')
    with pytest.raises(TraceError, match="backwards"):
        read_trace(path)
    path.write_text('{"t_ms": 0, "file": "a"}\n')
    with pytest.raises(TraceError, match="not a trace event"):
        read_trace(path)
    with pytest.raises(TraceError, match="outside"):
        replay_text([Open(0, "a", "xy"), Edit(1, "a", 5, 0, "z")])


def test_synthetic_typing_matches_the_documented_distribution() -> None:
    source = "".join(path.read_text() for path in code_files())
    trace = synthesize(source, "corpus.txt", seed=7)
    assert replay_text(trace.events) == {"corpus.txt": source}
    times = [e.t_ms for e in trace.events if isinstance(e, Edit)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 150 <= statistics.median(gaps) <= 250
    assert 0.20 <= sum(g > 300 for g in gaps) / len(gaps) <= 0.55
    assert 0.08 <= sum(g > 1000 for g in gaps) / len(gaps) <= 0.40
    assert synthesize(source, "c", seed=7).events == synthesize(source, "c", seed=7).events  # seeded
    assert any(isinstance(e, Edit) and len(e.insert) > 1 for e in trace.events)  # auto-indent inserts


def test_trace_header_is_kept(tmp_path: Path) -> None:
    trace = Trace([Open(0, "a", "x")], {"format": "mellum-trace/1", "source": "test", "license": "MIT"})
    write_trace(trace, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl").header["source"] == "test"


def test_a_recording_of_prompts_the_plugin_rendered_itself_shows_the_typing(tmp_path: Path) -> None:
    from mellum_proxy.budget.templates import MELLUM, FimParts
    from mellum_proxy.models import NormalizedRequest
    from mellum_proxy.telemetry.hub import arrival

    def rendered(at: float, prefix: str) -> dict[str, object]:
        prompt = MELLUM.render(FimParts(prefix, "\n    return total\n", "src/calc.py"))
        return arrival(NormalizedRequest(id="r", route="openai", session="s", prefix=prompt), at, with_text=True)

    first, second = rendered(10.0, "def total(xs):\n    total = "), rendered(10.2, "def total(xs):\n    total = sum")
    assert first["file"] == "src/calc.py" and first["prompt"] == "def total(xs):\n    total = "
    assert first["suffix_chars"] == len("\n    return total\n")
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(orjson.dumps(first) + b"\n" + orjson.dumps(second))
    events = from_recording(rec).events
    assert events[2] == Edit(200, "src/calc.py", len("def total(xs):\n    total = "), 0, "sum")  # typing, not a jump
    prompt = MELLUM.render(FimParts("ab", "cd", "x.py"))
    without_text = arrival(NormalizedRequest(id="r", route="openai", session="s", prefix=prompt), 1.0, False)
    assert without_text == {"t": 1.0, "session": "s", "dialect": "openai", "file": "x.py", "prefix_chars": 2,
                            "suffix_chars": 2}  # fmt: skip
