"""`mellum-proxy bench convert`: other recordings into `mellum-trace/1`.

- josephg editing-traces JSON(.gz) (`../shared/traces/`, CC BY 4.0: keep the attribution): transactions
  of `[position, deleted, inserted]` patches with ISO timestamps; a transaction dated 1970 is content that
  existed before tracing began and becomes part of the opening text.
- ProgSnap2 keystroke CSV: `SourceLocation`, `InsertText`, `DeleteText`, `ClientTimestamp`
  (and `CodeStateSection` for the file, when present).
- The proxy's own recording (`serve --record FILE`): a request that types on from its file's last one
  becomes that edit (text typed at the cursor, or a backspace); any other an open of its file with the
  prefix and suffix (placeholders of the same lengths when the text was not recorded) and an empty edit
  at the cursor, so replaying it sends the same request at the same time.
"""

from __future__ import annotations

import argparse
import csv
import gzip
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.console import command, fail
from mellum_proxy.tuning.workloads.trace import (
    FORMAT,
    Edit,
    Event,
    Open,
    Trace,
    TraceError,
    json_lines,
    read_trace,
    write_trace,
)


def add_commands(commands: Any) -> None:
    about = "josephg editing-traces, ProgSnap2 CSV or a proxy recording -> trace"
    convert = command(commands, "convert", about, _convert)
    convert.add_argument("source", type=Path)
    convert.add_argument("--from", dest="kind", choices=["josephg", "progsnap2", "recording"], required=True)
    convert.add_argument("--out", type=Path, required=True)


def _convert(args: argparse.Namespace) -> None:
    readers = {"josephg": from_josephg, "progsnap2": from_progsnap2, "recording": from_recording}
    try:
        trace = readers[args.kind](args.source)
    except (OSError, TraceError, KeyError, ValueError) as exc:
        fail(f"cannot convert {args.source}: {exc}")
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {trace.edits} edits")


def load_trace(path: Path) -> Trace:
    """A `mellum-trace/1` file, or a josephg editing-traces file (converted on the fly)."""
    if path.name.endswith((".json.gz", ".json")):
        return from_josephg(path)
    return read_trace(path)


def _parse_time(value: Any) -> float:
    """Seconds since the epoch from an ISO string or a number of milliseconds/seconds."""
    if isinstance(value, int | float):
        return float(value) / (1000.0 if value > 1e11 else 1.0)
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return number / (1000.0 if number > 1e11 else 1.0)


def from_josephg(path: Path, file_name: str | None = None) -> Trace:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = orjson.loads(handle.read())
    name = file_name or path.name.removesuffix(".gz").removesuffix(".json")
    text = data.get("startContent", "")
    events: list[Event] = []
    start: float | None = None
    for txn in data["txns"]:
        stamp = _parse_time(txn["time"])
        if stamp < 86400 * 365:  # dated 1970: content from before tracing began
            for position, deleted, inserted in txn["patches"]:
                text = text[:position] + inserted + text[position + deleted :]
            continue
        if start is None:
            start = stamp
            events.append(Open(0, name, text))
        t_ms = round((stamp - start) * 1000)
        for position, deleted, inserted in txn["patches"]:
            events.append(Edit(t_ms, name, int(position), int(deleted), str(inserted)))
    if start is None:
        events.append(Open(0, name, text))
    header = {"format": FORMAT, "source": f"josephg/editing-traces {path.name}", "license": "CC BY 4.0"}
    return Trace(events, header)


def from_progsnap2(path: Path) -> Trace:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and not {"SourceLocation", "InsertText", "DeleteText", "ClientTimestamp"} <= set(rows[0]):
        raise TraceError(
            f"{path}: a ProgSnap2 keystroke CSV needs SourceLocation, InsertText, DeleteText, ClientTimestamp"
        )
    events: list[Event] = []
    opened: set[str] = set()
    start = _parse_time(rows[0]["ClientTimestamp"]) if rows else 0.0
    for row in rows:
        name = row.get("CodeStateSection") or "main"
        t_ms = max(0, round((_parse_time(row["ClientTimestamp"]) - start) * 1000))
        if name not in opened:
            opened.add(name)
            events.append(Open(t_ms, name, ""))
        events.append(
            Edit(t_ms, name, int(row["SourceLocation"]), len(row["DeleteText"] or ""), row["InsertText"] or "")
        )
    return Trace(events, {"format": FORMAT, "source": f"ProgSnap2 {path.name}"})


def from_recording(path: Path) -> Trace:
    """A request that types on from the file's last one (the same suffix, the prefix that one's plus text, or
    less a tail: backspace) becomes that edit, so the typing is there to be predicted and typed through; any
    other becomes an open of its prefix and suffix and an empty edit at the cursor.

    The request log (`serve --log`, on by default) reads the same way: its `received_at`, `session` and
    `prompt_chars` are a recording's `t`, `session` and `prefix_chars`, without the file and the text (the
    typing's timing and sizes, nothing to type through); its other lines (`acceptance`) are skipped."""
    events: list[Event] = []
    start: float | None = None
    last: dict[str, tuple[str, str]] = {}  # file -> its last request's prefix and suffix
    for _, line in json_lines(path):
        if line.get("event", "request") != "request":
            continue
        at = float(line["t"] if "t" in line else line["received_at"])
        start = at if start is None else start
        t_ms = round((at - start) * 1000)
        name = line.get("file") or f"session-{line.get('session', 'default')}"
        chars = line["prefix_chars"] if "prefix_chars" in line else line["prompt_chars"]
        prefix = str(line["prompt"]) if line.get("prompt") is not None else "x" * int(chars)
        suffix = str(line["suffix"]) if line.get("suffix") is not None else "x" * int(line["suffix_chars"])
        before, before_suffix = last.get(name, (None, None))
        last[name] = (prefix, suffix)
        if before is not None and before_suffix == suffix and prefix.startswith(before):
            events.append(Edit(t_ms, name, len(before), 0, prefix[len(before) :]))
        elif before is not None and before_suffix == suffix and before.startswith(prefix):
            events.append(Edit(t_ms, name, len(prefix), len(before) - len(prefix), ""))
        else:
            events.append(Open(t_ms, name, prefix + suffix))
            events.append(Edit(t_ms, name, len(prefix), 0, ""))
    return Trace(events, {"format": FORMAT, "source": f"mellum-proxy recording {path.name}"})
