"""`benchmarks soak`'s report: mixed requests with faults, the proxy's resources over time, and what was logged."""

from __future__ import annotations

from typing import Any, TypedDict


class Soak(TypedDict):
    """`soak.json` (and `command`, added as it is written)."""

    requests: int
    clients: int
    seed: int
    elapsed_s: float
    exit_code: int | None
    samples: list[dict[str, Any]]
    kinds: dict[str, int]
    statuses: dict[str, int]
    gone: int
    answered: int
    logged: int
    answered_not_logged: int
    outcomes: dict[str, int]
    growth: dict[str, Any]
    growth_after_first_tenth: dict[str, Any]
    stderr_lines: int
    stderr_tracebacks: int
    stderr_levels: dict[str, int]


def render(result: Soak, command: str) -> str:
    lines = ["# Soak: mixed requests with faults", "", f"`{command}`: `mellum-proxy serve` as its own process in "
             f"front of a captive portal, a silent server and `benchmarks.doubles.fault_upstream` "
             f"(failover in that order), "
             f"{result['clients']} concurrent editors, seed {result['seed']}, "
             f"{result['elapsed_s']} s.", "", "| requests | RSS MiB | fds | asyncio tasks | threads |",
             "|---|---|---|---|---|"]  # fmt: skip
    for s in result["samples"]:
        lines.append(f"| {s['requests']} | {s['rss_mib']:.1f} | {s['fds']} | {s['tasks']} | {s['threads']} |")
    growth, later = result["growth"], result["growth_after_first_tenth"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(result["kinds"].items(), key=lambda kv: -kv[1]))
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(result["statuses"].items()))
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(result["outcomes"].items(), key=lambda kv: -kv[1]))
    lines += [
        "",
        f"- From warm to the end: RSS {growth['rss_mib']:+.1f} MiB, fds {growth['fds']:+d}, asyncio tasks "
        f"{growth['tasks']:+d}, threads {growth['threads']:+d}; from the first tenth to the end: RSS "
        f"{later['rss_mib']:+.1f} MiB, fds {later['fds']:+d}, asyncio tasks {later['tasks']:+d}.",
        f"- Sent: {kinds}.",
        f"- Answered {result['answered']} (HTTP {statuses}); {result['gone']} clients went away mid-answer.",
        f"- Logged {result['logged']} lines ({outcomes}); answered but not logged: "
        f"**{result['answered_not_logged']}**. Exit code after SIGTERM: {result['exit_code']}.",
        f"- The proxy's stderr: {result.get('stderr_lines', '-')} lines ({result.get('stderr_levels', {})}), "
        f"**{result.get('stderr_tracebacks', '-')}** tracebacks.",
    ]
    return "\n".join(lines) + "\n"
