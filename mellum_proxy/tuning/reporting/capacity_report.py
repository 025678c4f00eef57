"""`benchmarks capacity`'s report: how many developers the real server carried, direct and through the proxy, beside
the lab's count on the same server's profile."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from mellum_proxy.tuning.reporting.cells import cell, yes_no


class CapacityRun(TypedDict):
    """A team at growing counts, real (`benchmarks capacity`) or in the lab (`bench lab --developers`)."""

    capacity: list[dict[str, Any]]  # per policy, the largest count carried
    capacity_curve: list[dict[str, Any]]  # every count tried
    capacity_rule: dict[str, Any]


class CapacityReport(CapacityRun):
    """`capacity.json` (and `command`, added as it is written)."""

    upstream: str
    lab_capacity: list[dict[str, Any]]
    lab_curve: list[dict[str, Any]]
    profile: str
    traces: list[str]
    edits: int


def render(result: CapacityReport, command: str) -> str:
    rule = result["capacity_rule"]
    lines = [f"`{command}`", "",
             f"- real: {result['upstream']}, in real time; {', '.join(result['traces'])}, {result['edits']} edits "
             f"each; developer i starts {rule['stagger_ms']:.0f} ms x i after the first, all proxies in one process",
             f"- lab: the same traces and counts in virtual time on {result['profile']}",
             f"- carried: pooled pause-to-suggestion p95 <= {rule['p95_limit_ms']:.0f} ms and mean pause coverage >= "
             f"{rule['coverage_share']:.0%} of the same developers' alone", "",
             "| policy | carried: real | carried: lab |", "|---|---|---|"]  # fmt: skip
    lab = {row["policy"]: row for row in result["lab_capacity"]}
    for row in result["capacity"]:
        lines.append(f"| {row['policy']} | {row['developers']} | {lab.get(row['policy'], {}).get('developers', '-')} |")
    lines += ["", "| policy | developers | real p95 ms | lab p95 ms | real coverage | lab coverage | real requests | "
              "lab requests | real carried | lab carried |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    sim = {(p["policy"], p["developers"]): p for p in result["lab_curve"]}
    for point in result["capacity_curve"]:
        other = sim.get((point["policy"], point["developers"]), {})
        pair = [(cell(p.get("p95_ms"), "{:.0f}"), cell(p.get("coverage"), "{:.0%}")) for p in (point, other)]
        lines.append(
            f"| {point['policy']} | {point['developers']} | {pair[0][0]} | {pair[1][0]} | {pair[0][1]} | "
            f"{pair[1][1]} | {point['upstream_requests']} | {other.get('upstream_requests', '-')} | "
            f"{yes_no(point.get('carried'))} | {yes_no(other.get('carried'))} |"
        )
    return "\n".join(lines) + "\n"


def lab_capacity_lines(result: Mapping[str, Any]) -> list[str]:
    """`lab.md`'s "Developers per server" section (none without `--developers`)."""
    if not result.get("capacity"):
        return []
    rule = result["capacity_rule"]
    lines = ["", "## Developers per server", "",
             f"N developers typing at once on one server (developer i types trace i mod the number of traces, "
             f"{rule['stagger_ms']:.0f} ms x i later), each through a proxy of its own; counts tried: "
             f"{', '.join(map(str, rule['counts']))}. Carried: the pooled pause-to-suggestion p95 <= "
             f"{rule['p95_limit_ms']:.0f} ms and the mean pause coverage >= {rule['coverage_share']:.0%} of the same "
             "developers' alone. `capacity.png`: p95 against N." + _chatting(rule), "",
             "| profile | policy | developers carried | p95 ms | coverage |", "|---|---|---|---|---|"]  # fmt: skip
    for row in result["capacity"]:
        lines.append(f"| {row['profile']} | {row['policy']} | {row['developers']} | {cell(row['p95_ms'], '{:.0f}')} "
                     f"| {cell(row['coverage'], '{:.1%}')} |")  # fmt: skip
    return lines


def plot_capacity(result: Mapping[str, Any], path: Path) -> None:
    """Pooled p95 against developers, one panel per profile, one line per policy; the p95 limit dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

    profiles = list(dict.fromkeys(point["profile"] for point in result["capacity_curve"]))
    columns = min(3, len(profiles))  # panels a row, as in frontier.png
    rows = math.ceil(len(profiles) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4.5 * rows), squeeze=False)
    for axis in axes.flat[len(profiles) :]:
        axis.set_visible(False)
    for axis, prof in zip(axes.flat, profiles, strict=False):
        points = [p for p in result["capacity_curve"] if p["profile"] == prof and p["p95_ms"] is not None]
        for policy in dict.fromkeys(p["policy"] for p in points):
            mine = [p for p in points if p["policy"] == policy]
            axis.plot([p["developers"] for p in mine], [p["p95_ms"] for p in mine], marker="o", label=policy)
        axis.axhline(result["capacity_rule"]["p95_limit_ms"], color="grey", linestyle="--", linewidth=1)
        axis.set_xscale("log", base=2)
        counts = result["capacity_rule"]["counts"]
        axis.xaxis.set_major_locator(FixedLocator(counts))  # the counts tried, as numbers (not 2^4)
        axis.xaxis.set_major_formatter(FormatStrFormatter("%d"))
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_title(f"{prof}: pooled p95 by developers")
        axis.set_xlabel("developers on one server")
        axis.set_ylabel("pause->shown p95 (ms)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def _chatting(rule: dict[str, Any]) -> str:
    share = rule.get("chat_share") or 0.0
    chats = f"{rule.get('chat_tokens')}-token answers one after another on the same server, through the developer's"
    return f" {share:.0%} of each team also chats: {chats} own proxy (its bulk lane), or direct." if share else ""
