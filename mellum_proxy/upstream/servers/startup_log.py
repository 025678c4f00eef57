"""What a server's start-up log says it allocated (`inspect-log`, `fit`): each kind reads its own lines into one
`StartupLog` (`Memory.read_log_line` in its module); each finding keeps the line it came from."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB, GIB = 2**20, 2**30
_UNITS = {"kib": 2**10, "mib": MIB, "gib": GIB, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}


def size_bytes(number: str, unit: str) -> int:
    """`12.5`, `MiB` as bytes."""
    return round(float(number) * _UNITS[unit.lower()])


def matches(patterns: Sequence[tuple[re.Pattern[str], str]], line: str) -> Iterator[tuple[str, re.Match[str]]]:
    """(what it says, the match) for each of a kind's `(pattern, what)` that `line` matches."""
    for pattern, what in patterns:
        if found := pattern.search(line):
            yield what, found


@dataclass
class StartupLog:
    backend: str | None = None  # the kind whose lines were found
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.evidence.append(line.strip()[:200])
