"""`benchmarks breaks`' report: the pause after a break, when the server sleeps in the breaks, through the proxy and
going direct."""

from __future__ import annotations

from typing import Any, TypedDict


class Breaks(TypedDict):
    """`breaks.json` (and `command`, added as it is written)."""

    sleep_idle_s: int
    break_s: float
    keystrokes: int
    gap_ms: float
    prompt_chars: int
    modes: dict[str, dict[str, Any]]  # proxy, direct: warm and break pauses (ms), asleep at each break's end
    console: dict[str, int]  # the proxy's lines: "is asleep", "woke in", and wakes that restored prompt caches


def within(mode: dict[str, Any]) -> int:
    """Breaks whose pause came within twice the warm pause's median + 150 ms."""
    return sum(1 for ms in mode["breaks_ms"] if ms is not None and ms <= mode["bar_ms"])


def render(result: Breaks, command: str) -> str:
    lines = [
        "# The first suggestion after a break", "",
        f"`{command}`: the embedded llama.cpp (gemma-3-270m, 2 slots, 1 thread) unloading its model after "
        f"{result['sleep_idle_s']} idle seconds; after each break, {result['keystrokes']} keystrokes "
        f"{result['gap_ms']:.0f} ms apart (one session, each a streamed `/v1/completions` of the text typed so far, "
        f"from {result['prompt_chars']} characters of `inventory.py` on), then a pause: the pause's first text. "
        "Warm: the same after 1 s breaks, the server awake.", "",
        "| mode | warm pauses ms | median | bar (2x + 150) | pauses after breaks ms | within the bar "
        "| asleep at the break's end |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, mode in result["modes"].items():
        shown = ", ".join("none" if ms is None else f"{ms:.0f}" for ms in mode["breaks_ms"])
        warm = ", ".join(f"{ms:.0f}" for ms in mode["warm_ms"] if ms is not None)
        counts = f"{within(mode)} of {len(mode['breaks_ms'])} | {sum(mode['asleep'])} of {len(mode['asleep'])}"
        lines.append(f"| {name} | {warm} | {mode['warm_median_ms']:.0f} | {mode['bar_ms']:.0f} | {shown} | {counts} |")
    console = result["console"]
    lines += [
        "",
        f"- the proxy said `is asleep` {console['asleep']} times and `woke in` {console['woke']} times",
        f"- {console.get('restored', 0)} wakes restored the prompt caches saved before the sleep",
    ]
    return "\n".join(lines) + "\n"
