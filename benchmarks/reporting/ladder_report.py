"""`benchmarks ladder`'s report: one cell per context x concurrency (its attempts and their summary), as a table, a
plot and JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from mellum_proxy.telemetry.stats import percentile


@dataclass(slots=True)
class Attempt:
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    failure: str | None = None


@dataclass
class Cell:
    context: int
    concurrency: int
    attempts: list[Attempt] = field(default_factory=list)
    vram_before_mib: float | None = None
    vram_peak_mib: float | None = None
    vram_after_mib: float | None = None
    host_rss_peak_mib: float | None = None

    def summary(self) -> dict[str, Any]:
        ok = [a for a in self.attempts if a.failure is None]
        ttft = [a.ttft_ms for a in ok if a.ttft_ms is not None]
        total = [a.total_ms for a in ok if a.total_ms is not None]
        rates = [a.completion_tokens / (a.total_ms - a.ttft_ms) * 1000 for a in ok
                 if a.completion_tokens and a.total_ms and a.ttft_ms and a.total_ms > a.ttft_ms]  # fmt: skip
        failures: dict[str, int] = {}
        for attempt in self.attempts:
            if attempt.failure:
                failures[attempt.failure] = failures.get(attempt.failure, 0) + 1
        prompts = sorted({a.prompt_tokens for a in ok if a.prompt_tokens is not None})
        return {
            "context": self.context, "concurrency": self.concurrency, "requests": len(self.attempts),
            "prompt_tokens": prompts, "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "total_p50_ms": percentile(total, 50), "decode_tokens_per_s": percentile(rates, 50),
            "vram_before_mib": self.vram_before_mib, "vram_peak_mib": self.vram_peak_mib,
            "vram_after_mib": self.vram_after_mib, "host_rss_peak_mib": self.host_rss_peak_mib, "failures": failures,
        }  # fmt: skip


TABLE = [
    ("context", "context", None),
    ("concurrency", "concurrency", None),
    ("prompt_tokens", "prompt tokens", None),
    ("ttft_p50_ms", "TTFT p50 ms", 0),
    ("ttft_p95_ms", "TTFT p95 ms", 0),
    ("total_p50_ms", "total p50 ms", 0),
    ("decode_tokens_per_s", "decode tok/s", 1),
    ("vram_peak_mib", "VRAM peak MiB", 0),
    ("host_rss_peak_mib", "server host RSS peak MiB", 0),
    ("failures", "failures", None),
]


def _cell_text(value: Any, digits: int | None) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:.{digits}f}" if digits is not None else str(value)


def table(cells: list[Cell]) -> str:
    """The record table a person reads at a glance: one cell a row, one variable changing at a time."""
    rows = ["| " + " | ".join(title for _, title, _ in TABLE) + " |", "|" + "---|" * len(TABLE)]
    for cell in cells:
        summary = cell.summary()
        rows.append("| " + " | ".join(_cell_text(summary[key], digits) for key, _, digits in TABLE) + " |")
    return "\n".join(rows)


def plot(cells: list[Cell], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ttft_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for concurrency in sorted({c.concurrency for c in cells}):
        row = [c for c in cells if c.concurrency == concurrency]
        xs = [c.context for c in row]
        ttft_axis.plot(xs, [c.summary()["ttft_p50_ms"] for c in row], marker="o", label=f"concurrency {concurrency}")
        memory = [c.vram_peak_mib if c.vram_peak_mib is not None else c.host_rss_peak_mib for c in row]
        memory_axis.plot(xs, memory, marker="o", label=f"concurrency {concurrency}")
    gpu = any(c.vram_peak_mib is not None for c in cells)
    ttft_axis.set(xlabel="prompt tokens", ylabel="TTFT p50 (ms)", title="Time to first token")
    memory_axis.set(xlabel="prompt tokens", ylabel="GPU memory peak (MiB)" if gpu else "server host RSS peak (MiB)",
                    title="Memory" + ("" if gpu else " (host, no NVIDIA GPU)"))  # fmt: skip
    for axis in (ttft_axis, memory_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def as_json(cells: list[Cell], meta: dict[str, Any]) -> bytes:
    attempts = [[asdict(a) for a in c.attempts] for c in cells]
    body = {**meta, "cells": [c.summary() for c in cells], "attempts": attempts}
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)


def render(cells: list[Cell], command: str) -> str:
    """`ladder.md`: the command, then the table."""
    return f"`{command}`\n\n{table(cells)}\n"
