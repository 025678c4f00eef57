"""Keystroke traces: `mellum-trace/1`, JSON lines, one event each, `t_ms` ascending from 0.

    {"format": "mellum-trace/1", "source": "...", "license": "..."}          optional first line
    {"t_ms": 0, "file": "app.py", "text": "<whole content>"}                 open / reset a file
    {"t_ms": 412, "file": "app.py", "offset": 87, "delete": 0, "insert": "x"} an edit

`offset` counts Unicode code points before the edit; an edit is a splice (delete, then insert at
offset) and leaves the cursor after the insert.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

FORMAT = "mellum-trace/1"
NEXT_TYPED_CHARS = 256


class TraceError(ValueError):
    """A trace file that does not follow the format (the message says where)."""


@dataclass(frozen=True, slots=True)
class Open:
    """A file opened with its whole text, `t_ms` after the trace's start."""

    t_ms: int
    file: str
    text: str


@dataclass(frozen=True, slots=True)
class Edit:
    """`delete` characters at `offset` replaced by `insert`, in an open file."""

    t_ms: int
    file: str
    offset: int
    delete: int
    insert: str


Event = Open | Edit


@dataclass
class Trace:
    """A recorded editing session: its events in time order, and its header line."""

    events: list[Event]
    header: dict[str, Any] = field(default_factory=lambda: {"format": FORMAT})

    @property
    def edits(self) -> int:
        return sum(isinstance(e, Edit) for e in self.events)


def _event(line: dict[str, Any], number: int) -> Event:
    try:
        if "text" in line:
            return Open(int(line["t_ms"]), str(line["file"]), str(line["text"]))
        return Edit(int(line["t_ms"]), str(line["file"]), int(line["offset"]), int(line.get("delete", 0)),
                    str(line.get("insert", "")))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"line {number}: not a trace event ({exc!r})") from exc


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-empty line of a JSON-lines file (optionally gzip-compressed)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"{path}:{number}: not JSON") from exc
            if not isinstance(line, dict):
                raise TraceError(f"{path}:{number}: not an object")
            yield number, line


def read_trace(path: Path) -> Trace:
    """Read a `mellum-trace/1` file (optionally gzip-compressed)."""
    header: dict[str, Any] = {"format": FORMAT}
    events: list[Event] = []
    for number, line in json_lines(path):
        if number == 1 and "format" in line:
            header = line
            continue
        event = _event(line, number)
        if events and event.t_ms < events[-1].t_ms:
            raise TraceError(f"{path}:{number}: t_ms goes backwards")
        events.append(event)
    return Trace(events, header)


def write_trace(trace: Trace, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(orjson.dumps(trace.header) + b"\n")
        for event in trace.events:
            handle.write(orjson.dumps(event) + b"\n")


class Documents:
    """The files of a trace as they are after each event, with the cursor of the last edit."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.cursor: dict[str, int] = {}

    def apply(self, event: Event) -> None:
        if isinstance(event, Open):
            self.texts[event.file] = event.text
            self.cursor[event.file] = len(event.text)
            return
        text = self.texts.get(event.file, "")
        if not 0 <= event.offset <= len(text):
            raise TraceError(f"edit at {event.t_ms} ms: offset {event.offset} outside {event.file} ({len(text)} chars)")
        self.texts[event.file] = text[: event.offset] + event.insert + text[event.offset + event.delete :]
        self.cursor[event.file] = event.offset + len(event.insert)


def replay_text(events: Iterable[Event]) -> dict[str, str]:
    """Every file's final content after all events."""
    documents = Documents()
    for event in events:
        documents.apply(event)
    return documents.texts


def limited(trace: Trace, edits: int | None) -> Iterator[Event]:
    """The events up to and including the `edits`-th edit (opens before it are kept)."""
    seen = 0
    for event in trace.events:
        if isinstance(event, Edit):
            if edits is not None and seen >= edits:
                return
            seen += 1
        yield event


def next_typed(events: Sequence[Event]) -> dict[int, str]:
    """For each edit (by event index): what the person typed next at its cursor, as long as they kept
    typing there (up to `NEXT_TYPED_CHARS`)."""
    documents = Documents()
    cursors: dict[int, tuple[str, int]] = {}
    for index, event in enumerate(events):
        documents.apply(event)
        if isinstance(event, Edit):
            cursors[index] = (event.file, documents.cursor[event.file])
    following: dict[int, str] = {}
    after: dict[str, tuple[int, int, str]] = {}  # file -> (offset, delete, text typed from it on)
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if not isinstance(event, Edit):
            after.pop(event.file, None)
            continue
        file, cursor = cursors[index]
        nxt = after.get(file)
        following[index] = nxt[2] if nxt is not None and nxt[0] == cursor and nxt[1] == 0 else ""
        after[file] = (event.offset, event.delete, (event.insert + following[index])[:NEXT_TYPED_CHARS])
    return following
