"""`benchmarks day`'s report: two proxies for an hour in front of a real llama.cpp that sleeps, restarts and is typed at
by editors that come and go: what each proxy holds minute by minute, and what the shared log kept."""

from __future__ import annotations

from typing import Any, TypedDict


class Day(TypedDict):
    """`day.json` (and `command`, added as it is written)."""

    minutes: float
    typists: int
    seed: int
    elapsed_s: float
    samples: list[dict[str, Any]]  # a minute each: per proxy its RSS, files, threads, tasks, sessions, documents
    growth_after_10_min: dict[str, dict[str, float]]  # per proxy
    answered: int
    logged: int
    answered_not_logged: int
    statuses: dict[str, int]
    outcomes: dict[str, int]
    wakes: int
    breaks: int
    restarts: int
    after_restart: dict[str, Any]  # the first completion after the upstream came back
    abandoned: int
    sessions_opened: int
    exit_codes: list[int | None]
    stderr_tracebacks: int


def render(result: Day, command: str) -> str:
    lines = [
        "# A day in an hour", "",
        f"`{command}`: two `mellum-proxy serve` processes sharing one request log, in front of the embedded llama.cpp "
        f"(gemma-3-270m, 2 slots, `sleep_idle_s` 2), {result['typists']} typists for {result['minutes']:g} minutes "
        f"({result['elapsed_s']:.0f} s): {result['breaks']} breaks in which the server slept, {result['restarts']} "
        "upstream restart(s) on the same port, editors that open new connections and leave mid-request.", "",
        "| minute | proxy | RSS MiB | files | threads | tasks | sessions | documents |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for sample in result["samples"]:
        for name, state in sample["proxies"].items():
            cells = (state["fds"], state["threads"], state["tasks"], state["sessions"], state["documents"])
            lines.append(
                f"| {sample['minute']:.0f} | {name} | {state['rss_mib']:.1f} | " + " | ".join(map(str, cells)) + " |"
            )
    lines.append("")
    for name, growth in result["growth_after_10_min"].items():
        lines.append(f"- {name}: from minute 10 to the end, RSS {growth['rss_mib']:+.1f} MiB, "
                     f"files {growth['fds']:+.0f}, tasks {growth['tasks']:+.0f}")  # fmt: skip
    lines += [
        f"- answered {result['answered']}, logged {result['logged']} lines in the shared log, "
        f"answered but not logged: {result['answered_not_logged']}",
        f"- statuses {result['statuses']}; outcomes {result['outcomes']}",
        f"- the server woke {result['wakes']} times (the proxies' count); {result['abandoned']} requests abandoned by "
        f"their editor; {result['sessions_opened']} client connections pools opened",
        f"- first completion after the restart: {result['after_restart']}",
        f"- exit codes {result['exit_codes']}; tracebacks on stderr: {result['stderr_tracebacks']}",
    ]
    return "\n".join(lines) + "\n"
