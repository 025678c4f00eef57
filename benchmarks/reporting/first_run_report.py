"""`benchmarks first-run`'s report: what a newcomer sees after `make run`."""

from __future__ import annotations

from typing import Any, TypedDict


class FirstRun(TypedDict):
    """`first-run.json` (`command` is then the bench's command line; `serve_command` the proxy's)."""

    healthy_s: float
    first_completion_s: float | None
    good: int
    completions: list[dict[str, Any]]
    health_ms: dict[str, float | int]
    health_watch_s: float
    startup_lines: list[str]
    busy_processes: int
    command: str
    serve_command: str


def render(result: FirstRun, command: str) -> str:
    health = result["health_ms"]
    lines = [
        f"`{command}`: started `{result['serve_command']}` with {result['busy_processes']} other process(es) "
        "keeping a core busy",
        "",
        f"- healthy after {result['healthy_s']:.1f} s; first completion after {result['first_completion_s']:.1f} s",
        f"- `/health` from its first ok answer on, for {result['health_watch_s']:.0f} s, asked every 20 ms (each "
        f"probe on its own) while the completions ran: p50 {health['p50']} ms, p99 {health['p99']} ms, max "
        f"{health['max']} ms ({health['count']} answers; target p99 <= 50 ms)",
        f"- {result['good']} of {len(result['completions'])} completions shown whole (not empty, not cut by "
        "the deadline, no FIM marker)",
        "",
        "| cursor after | outcome | finish | ms | completion |",
        "|---|---|---|---|---|",
    ]
    for item in result["completions"]:
        text = item["text"].replace("\n", "⏎").replace("|", "\\|")
        lines.append(f"| `{item['position']}` | {item['outcome']} | {item['finish_reason']} | "
                     f"{item['total_ms']:.0f} | `{text[:80]}` |")  # fmt: skip
    return "\n".join(lines) + "\n"
