"""`benchmarks lanes`'s report: completions beside chat, alone, together and in lanes."""

from __future__ import annotations

from typing import Any, TypedDict


class Lanes(TypedDict):
    """`lanes.json` (and `command`, added as it is written)."""

    upstream: str
    seconds: float
    every_ms: float
    chats: int
    chat_tokens: int
    max_tokens: int
    modes: dict[str, dict[str, Any]]  # per mode: completions' first text, chat answers
    target: dict[str, Any]


def render(result: Lanes, command: str) -> str:
    lines = ["# Completions beside chat: lanes", "",
             f"`{command}`: {result['upstream']}; an editor asks for a {result['max_tokens']}-token completion every "
             f"{result['every_ms']} ms for {result['seconds']} s while {result['chats']} chat clients stream "
             f"{result['chat_tokens']}-token answers, one after another. Time to first text: an answer without "
             "text counts at its end (the proxy's deadline, or a plugin's 5 s going direct).", "",
             "| run | completion first text p50 ms | p95 ms | with text | chat answers | s per chat answer "
             "| chats refused or failed |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode, run in result["modes"].items():
        mean = run["chat_answer_mean_s"]
        lines.append(f"| {mode} | {run['ttft_p50_ms']:.0f} | {run['ttft_p95_ms']:.0f} | {run['with_text']} of "
                     f"{run['completions']} | {run['chat_answers']} | {'-' if mean is None else f'{mean:.1f}'} | "
                     f"{run['chat_refused']} |")  # fmt: skip
    target = result["target"]
    limit = target["lanes_p95_limit_ms"]
    lines += ["", f"Target (lanes p95 <= 1.5x alone p95 + 100 ms = {limit:.0f} ms, every chat client completing "
              f"answers): {'met' if target['met'] else 'missed'}."]  # fmt: skip
    return "\n".join(lines) + "\n"
