"""`mellum-proxy bench synth`: a seeded synthetic trace that types a source file.

Inter-key gaps are lognormal with a median of 200 ms and sigma 1.3 (about 38 % over 300 ms, 11 % over 1 s),
inside bursts; after a line a thinking pause is added with probability 0.25 (lognormal, median 1.5 s).
That lands inside the published ranges for fluent typists in an editor: median 150-250 ms, 20-55 % of
gaps over 300 ms, 8-40 % over 1 s (see bench/traces/README.md). The editor's auto-indent arrives as one
multi-character insert after each newline, as real editors do.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench.trace import FORMAT, Edit, Event, Open, Trace

MEDIAN_GAP_MS = 200.0
SIGMA = 1.3
PAUSE_PROBABILITY = 0.25
PAUSE_MEDIAN_MS = 1500.0


def synthesize(source: str, name: str, seed: int = 0, limit_chars: int | None = None) -> Trace:
    rng = random.Random(seed)
    text = source if limit_chars is None else source[:limit_chars]
    events: list[Event] = [Open(0, name, "")]
    t, position, i = 0.0, 0, 0
    while i < len(text):
        char = text[i]
        t += rng.lognormvariate(0, SIGMA) * MEDIAN_GAP_MS
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
    header = {"format": FORMAT, "source": f"bench synth seed={seed} of {name}", "license": "same as the source file"}
    return Trace(events, header)


def synthesize_file(path: Path, seed: int = 0, limit_chars: int | None = None) -> Trace:
    return synthesize(path.read_text(), path.name, seed, limit_chars)
