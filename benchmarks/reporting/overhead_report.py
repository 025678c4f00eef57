"""`benchmarks overhead`'s report: the latency and CPU each relay adds, per round, and the median ratios."""

from __future__ import annotations

from typing import Any, TypedDict

TTFT_TARGET, CPU_TARGET = 1.3, 1.5  # the proxy against the relay that only parses


class Overhead(TypedDict):
    """`overhead.json` (and `command`, added as it is written)."""

    requests: int
    rounds: int
    tokens: int
    token_gap_ms: float  # between the fake's tokens (0: all in one read)
    rows: list[dict[str, Any]]  # per round, per path
    summary: dict[str, float | None]  # the median ratios
    paths: list[str]


def render(result: Overhead, command: str) -> str:
    """The report as Markdown: one row per round and path, then the median ratios."""
    lines = [
        "# Relay overhead",
        "",
        f"`{command}`: {result['requests']} sequential streaming fill-in-the-middle requests (prompt and suffix) "
        "per path and round, "
        f"{result['tokens']} tokens each{_gap(result)}, fake upstream; added = the path's percentile less direct's.",
        "",
        "| round | path | added TTFT p50 ms | added TTFT p95 ms | added total p50 ms | CPU ms / request |",
        "|---|---|---|---|---|---|",
    ]
    relays = [name for name in result["paths"] if name != "direct"]
    for row in result["rows"]:
        for name in (name for name in relays if name in row):
            cell = row[name]
            lines.append(
                f"| {row['round']} | {name} | {cell['added_ttft_p50_ms']:.2f} | {cell['added_ttft_p95_ms']:.2f} | "
                f"{cell['added_total_p50_ms']:.2f} | {cell['cpu_ms_per_request']:.2f} |"
            )
    lines += ["", "| ratio (median of rounds) | proxy / bare | parsing / bare | proxy / parsing (independent floor) "
              "| proxy / nginx | cleaning / proxy | page open / proxy | each in its own process: "
              "proxy / parsing | own process: proxy / nginx |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    summary = result["summary"]
    ratios = ("proxy_over_bare", "parsing_over_bare", "proxy_over_parsing", "proxy_over_nginx", "cleaning_over_proxy",
              "page_over_proxy", "proxy_process_over_parsing_process",
              "proxy_process_over_nginx")  # fmt: skip
    for key in ("added_ttft_p50_ms", "added_total_p50_ms", "cpu_ms_per_request"):
        cells = [summary.get(f"{ratio}_{key}") for ratio in ratios]
        lines.append(f"| {key} | " + " | ".join("-" if v is None else f"{v:.2f}x" for v in cells) + " |")
    for ratio, where in (
        ("proxy_over_parsing", "all in this process"),
        ("proxy_process_over_parsing_process", "each in a process of its own, as deployed"),
    ):
        ttft, cpu = (summary.get(f"{ratio}_{key}") for key in ("added_ttft_p50_ms", "cpu_ms_per_request"))
        if ttft is not None and cpu is not None:
            met = "met" if ttft <= TTFT_TARGET and cpu <= CPU_TARGET else "**not met**"
            lines += ["", f"Target (proxy / parsing: added TTFT p50 <= {TTFT_TARGET}x, CPU <= {CPU_TARGET}x), "
                      f"{where}: {met} ({ttft:.2f}x, {cpu:.2f}x)."]  # fmt: skip
    if "nginx" not in result["paths"]:
        lines += ["", "nginx is not installed here, so it was not measured (Debian: `apt install nginx-light`)."]
    else:
        lines += ["", "nginx runs in a process of its own, beside this one: its figures carry no share of this "
                  "process's CPU (its CPU column is this process's, the client's part only)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _gap(result: Overhead) -> str:
    gap = result.get("token_gap_ms", 0.0)
    return f" {gap:g} ms apart (a read each)" if gap else ""
