"""`benchmarks budget`'s report: the exact budget on every keystroke (agreement, pre-upstream time, `/tokenize`
calls, the stepped window's cache reuse)."""

from __future__ import annotations

from typing import Any, TypedDict


class Budget(TypedDict):
    """`budget.json` (and `command`, added as it is written)."""

    agreement: dict[str, Any]  # the GGUF vocabulary against the server's /tokenize
    pre_upstream: list[dict[str, Any]]  # per tokenizer and file size
    replay: list[dict[str, Any]]  # per tokenizer
    stepped_window: list[dict[str, Any]]  # per window step
    context: int


def render(result: Budget, command: str) -> str:
    agree = result["agreement"]
    lines = [
        "# The budget on every keystroke", "",
        f"`{command}`, against the embedded llama.cpp server (gemma-3-270m).", "",
        f"GGUF vocabulary vs the server's `/tokenize`: **{agree['identical']} of {agree['texts']}** texts give "
        f"identical ids ({agree['tokens']} tokens in all; largest count difference {agree['max_count_difference']}).",
        "", f"Pre-upstream time (client sends -> upstream receives), debounce 0, budget {result['context']} tokens, "
        "cursor mid-file, one character typed per request:", "",
        "| tokenizer | file | p50 ms | max ms | first keystroke ms | /tokenize calls |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in result["pre_upstream"]:
        lines.append(
            f"| {row['tokenizer']} | {row['file_bytes'] // 1024} KB | {row['pre_upstream_p50_ms']:.2f} | "
            f"{row['pre_upstream_max_ms']:.2f} | {row['first_keystroke_ms']:.1f} | {row['tokenize_calls']} / "
            f"{row['keystrokes'] + 1} |"
        )
    lines += ["", "Replay through the proxy to the real server (200 KB file, one completion per keystroke):", "",
              "| tokenizer | completions | /tokenize per completion | over budget (server's count) |",
              "|---|---|---|---|"]  # fmt: skip
    for row in result["replay"]:
        lines.append(f"| {row['method']} | {row['completions']} | {row['tokenize_per_completion']:.2f} | "
                     f"{row['over_budget']} |")  # fmt: skip
    stepped = result["stepped_window"]
    lines += ["", f"Prompt-cache reuse while typing, {stepped[0]['max_context_tokens']}-token budget (llama.cpp "
              "`timings.cache_n`, server with `swa_full`):", "",
              "| window edges | keystrokes | cached tokens | computed tokens | reuse | median request ms |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for row in stepped:
        label = f"{row['step_lines']}-line steps" if row["step_lines"] > 1 else "every line (naive)"
        lines.append(f"| {label} | {row['keystrokes']} | {row['cached_tokens']} | {row['computed_tokens']} | "
                     f"{row['reuse']:.0%} | {row['median_request_ms']:.0f} |")  # fmt: skip
    naive, steps = stepped[1]["computed_tokens"], stepped[0]["computed_tokens"]
    if steps:
        lines += ["", f"Stepped edges: the server computed {naive / steps:.1f}x fewer prompt tokens."]
    return "\n".join(lines) + "\n"
