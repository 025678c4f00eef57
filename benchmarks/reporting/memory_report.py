"""`benchmarks memory`'s report: the proxy's resident memory as requests go through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict


class Memory(TypedDict):
    """`memory.json` (and `command`, added as it is written)."""

    requests: int
    clients: int
    runs: list[dict[str, Any]]  # per tokenizer: its samples, idle and growth


def render(result: Memory, command: str) -> str:
    lines = ["# Proxy memory", "", f"`{command}`: `mellum-proxy serve` as its own process, VmRSS.", "",
             "| tokenizer | requests | RSS MiB |", "|---|---|---|"]  # fmt: skip
    for run in result["runs"]:
        name = Path(run["tokenizer"]).name
        for sample in run["samples"]:
            lines.append(f"| {name} | {sample['requests']} | {sample['rss_mib']:.1f} |")
    lines.append("")
    for run in result["runs"]:
        lines.append(f"- {Path(run['tokenizer']).name}: idle {run['idle_mib']:.1f} MiB; from the first fifth of "
                     f"the requests to the end {run['growth_after_first_fifth_mib']:+.1f} MiB")  # fmt: skip
    return "\n".join(lines) + "\n"
