"""`mellum-proxy bench synth`: a seeded synthetic trace that types a source file.

Inter-key gaps are lognormal with sigma 1.3 around the typist's median (`medium`: 200 ms, about 38 %
over 300 ms, 11 % over 1 s), inside bursts; after a line a thinking pause is added with probability
0.25 (lognormal, median 1.5 s). `medium` lands inside the published ranges for fluent typists in an
editor: median 150-250 ms, 20-55 % of gaps over 300 ms, 8-40 % over 1 s (see mellum_proxy/tuning/traces/README.md).
`fast` (120 ms) is the fastest typists of Dhakal et al., "Observations on Typing from 136 Million
Keystrokes" (CHI 2018: mean inter-key interval 239 ms, top typists about 100-120 ms); `slow` (550 ms)
is the novice figure in mellum_proxy/tuning/traces/README.md. The editor's auto-indent arrives as one
multi-character insert after each newline, as real editors do.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from mellum_proxy.console import INDEX, POSITIVE, command, fail
from mellum_proxy.tuning.workloads.trace import FORMAT, Edit, Event, Open, Trace, write_trace

MEDIAN_GAP_MS = 200.0
TYPISTS = {"slow": 550.0, "medium": MEDIAN_GAP_MS, "fast": 120.0}  # median inter-key gap, ms
SIGMA = 1.3
PAUSE_PROBABILITY = 0.25
PAUSE_MEDIAN_MS = 1500.0


def add_commands(commands: Any) -> None:
    synth = command(commands, "synth", "a seeded synthetic trace typing a source file", _synth)
    synth.add_argument("source", type=Path)
    synth.add_argument("--out", type=Path, required=True)
    synth.add_argument("--seed", type=INDEX, default=0)
    synth.add_argument("--limit-chars", type=POSITIVE)
    synth.add_argument("--typist", choices=["slow", "medium", "fast"], default="medium",
                       help="median gap between keys: 550, 200 or 120 ms [default: medium]")  # fmt: skip


def _synth(args: argparse.Namespace) -> None:
    try:
        trace = synthesize_file(args.source, args.seed, args.limit_chars, args.typist)
    except OSError as exc:
        fail(f"cannot read {args.source}: {exc.strerror}")
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {trace.edits} edits")


def synthesize(source: str, name: str, seed: int = 0, limit_chars: int | None = None, typist: str = "medium") -> Trace:
    if typist not in TYPISTS:
        raise ValueError(f"unknown typist '{typist}' (known: {', '.join(TYPISTS)})")
    median = TYPISTS[typist]
    rng = random.Random(seed)
    text = source if limit_chars is None else source[:limit_chars]
    events: list[Event] = [Open(0, name, "")]
    t, position, i = 0.0, 0, 0
    while i < len(text):
        char = text[i]
        t += rng.lognormvariate(0, SIGMA) * median
        if char == "\n":
            indent = len(text[i + 1 :]) - len(text[i + 1 :].lstrip(" \t"))
            indent = min(indent, len(text[i + 1 :].split("\n", 1)[0]))
            events.append(Edit(round(t), name, position, 0, "\n" + text[i + 1 : i + 1 + indent]))
            position += 1 + indent
            i += 1 + indent
            if rng.random() < PAUSE_PROBABILITY:
                t += rng.lognormvariate(0, 0.6) * PAUSE_MEDIAN_MS
            continue
        events.append(Edit(round(t), name, position, 0, char))
        position += 1
        i += 1
    source_note = f"bench synth --typist {typist} seed={seed} of {name}"
    header = {"format": FORMAT, "source": source_note, "license": "same as the source file"}
    return Trace(events, header)


def synthesize_file(path: Path, seed: int = 0, limit_chars: int | None = None, typist: str = "medium") -> Trace:
    return synthesize(path.read_text(), path.name, seed, limit_chars, typist)
