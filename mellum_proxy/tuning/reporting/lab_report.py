"""`bench lab`'s report: `defaults` against `direct` on every trace (the targets), the grid's Pareto
frontier over the mean of the traces (`frontier.png`), and the Markdown."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from mellum_proxy.telemetry.stats import percentile
from mellum_proxy.tuning.reporting.capacity_report import lab_capacity_lines
from mellum_proxy.tuning.reporting.cells import cell
from mellum_proxy.tuning.reporting.results import LabResult
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.editor import no_prediction_floor


class Lab(TypedDict):
    """`lab.json` (and `command`, added as it is written); with `--developers`, a `CapacityRun`'s keys too."""

    accuracy: float
    max_tokens: int
    limit_events: int
    profiles: dict[str, str]  # name: where its figures come from
    runs: list[dict[str, Any]]  # one per profile x trace x policy
    targets: list[dict[str, Any]]
    bound: dict[str, list[tuple[float, float]]]  # per profile, the no-prediction bound on the frontier plot
    frontier: dict[str, list[str]]
    means: dict[str, list[dict[str, Any]]]
    capacity: NotRequired[list[dict[str, Any]]]
    capacity_curve: NotRequired[list[dict[str, Any]]]
    capacity_rule: NotRequired[dict[str, Any]]


def summarize(
    runs: Sequence[LabResult],
    specs: Sequence[ServerProfile],
    accuracy: float,
    max_tokens: int,
    limit_events: int,
    gaps: dict[str, list[float]] | None = None,
) -> Lab:
    """The runs, the targets, and per profile the means over traces and their Pareto frontier.

    `gaps`: per trace, the gap after each edit as played; with them each target row carries the no-prediction floor
    on requests, and each profile the bound it draws on the frontier plot."""
    gaps = gaps or {}
    return {
        "accuracy": accuracy, "max_tokens": max_tokens, "limit_events": limit_events,
        "profiles": {spec.name: spec.source for spec in specs},
        "runs": [run.summary() for run in runs], "targets": _targets(runs, gaps),
        "bound": {spec.name: _bound(runs, spec.name, gaps) for spec in specs},
        "frontier": {spec.name: [r.policy for r in pareto([m for m in _means(runs, spec.name) if m.policy != "oracle"])]
                     for spec in specs},  # the oracle is the yardstick, not a policy to choose
        "means": {spec.name: [r.summary() for r in _means(runs, spec.name)] for spec in specs},
    }  # fmt: skip


def meets_targets(candidate: LabResult, direct: LabResult, oracle: LabResult | None = None) -> dict[str, bool]:
    """The bar for the defaults on one trace, against `direct` and, when it ran, the `oracle` (one request per
    pause, the moment typing stops): coverage >= direct's - 1 point; p95 <= direct's and <= 1.1x the oracle's,
    each over the pauses both answered; upstream requests <= 1.5x the oracle's (without one: <= 1/3 of
    direct's); waste <= 1/4 of direct's.

    The p95s are compared on the same pauses: a server that falls behind leaves direct answering a handful of
    them (2 of 454 in one run), and its p95 over those says nothing about the others."""
    cov, base = candidate.pause_coverage or 0.0, direct.pause_coverage or 0.0
    if oracle is None:
        near_p95, requests = True, candidate.upstream_requests * 3 <= direct.upstream_requests
    else:
        near_p95 = _paired_p95(candidate, oracle) <= 1.1 * _or_inf(oracle.latency_p95_ms)
        requests = candidate.upstream_requests <= 1.5 * oracle.upstream_requests
    return {
        "coverage": cov >= base - 0.01,
        "p95": _paired_p95(candidate, direct) <= _or_inf(direct.latency_p95_ms) and near_p95,
        "requests": requests,
        "waste": candidate.wasted_completion_tokens * 4 <= direct.wasted_completion_tokens,
    }


def _paired_p95(candidate: LabResult, other: LabResult) -> float:
    """The candidate's p95 over the pauses `other` answered too (all of its own when either result does not say
    which pauses it answered; infinity when it answered none of them). 0 ms is a p95: every pause answered at
    once."""
    if not candidate.covered_pauses or not other.covered_pauses:
        return _or_inf(candidate.latency_p95_ms)
    theirs = set(other.covered_pauses)
    paired = [ms for pause, ms in zip(candidate.covered_pauses, candidate.latencies_ms, strict=True) if pause in theirs]
    return _or_inf(percentile(paired, 95))


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def pareto(results: Sequence[LabResult]) -> list[LabResult]:
    """The results no other beats on all three: fewer requests per edit, more coverage, lower p95."""

    def key(r: LabResult) -> tuple[float, float, float]:
        return (r.requests_per_edit, -(r.pause_coverage or 0.0), r.latency_p95_ms or math.inf)

    front = []
    for r in results:
        a = key(r)
        if not any(all(x <= y for x, y in zip(key(o), a, strict=True)) and key(o) != a for o in results):
            front.append(r)
    return sorted(front, key=key)


def _targets(runs: Sequence[LabResult], gaps: dict[str, list[float]]) -> list[dict[str, Any]]:
    """`defaults` against `direct` on every (profile, trace); with the oracle and the trace's gaps, also the
    no-prediction floor on requests at the p95 target's allowance (a tenth of the oracle's p95) beside the
    target's limit (1.5x the oracle's requests)."""
    rows = []
    index = {(r.profile, r.trace, r.policy): r for r in runs}
    for (prof, trace, name), run in index.items():
        base = index.get((prof, trace, "direct"))
        if name != "defaults" or base is None:
            continue
        oracle = index.get((prof, trace, "oracle"))
        row: dict[str, Any] = {"profile": prof, "trace": trace, **meets_targets(run, base, oracle)}
        if oracle is not None and trace in gaps:
            row |= requests_floor(gaps[trace], oracle) or {}
        others = [r for (p, t, n), r in index.items() if (p, t) == (prof, trace) and n not in ("direct", "oracle")]
        if len(others) > 1:  # a grid ran: how many of its policies meet each target, and all four, here
            checks = [meets_targets(other, base, oracle) for other in others]
            met_by = {key: sum(check[key] for check in checks) for key in checks[0]}
            row["met_by"] = met_by | {"all": sum(all(check.values()) for check in checks)}
            row["policies"] = len(others)
        rows.append(row)
    return rows


def requests_floor(gaps: Sequence[float], oracle: LabResult) -> dict[str, int] | None:
    """The no-prediction floor on requests at the p95 target's allowance (a tenth of the oracle's p95), and the
    requests target's limit (1.5x the oracle's requests); None without an oracle p95."""
    if oracle.latency_p95_ms is None:
        return None
    return {"floor": no_prediction_floor(gaps, 0.1 * oracle.latency_p95_ms),
            "limit": math.floor(1.5 * oracle.upstream_requests)}  # fmt: skip


def _bound(runs: Sequence[LabResult], prof: str, gaps: dict[str, list[float]]) -> list[tuple[float, float]]:
    """The no-prediction estimate over the mean of the traces: for a hold of d ms, (requests per edit, the oracle's
    p95 + d), each the mean over the traces: roughly where a policy that never predicts the typing can get to (not a
    strict bound: p95 lets 5 % of pauses be late, and a request may be served faster than the oracle's)."""
    oracles = [r for r in runs if r.profile == prof and r.policy == "oracle" and r.trace in gaps and r.latency_p95_ms]
    if not oracles:
        return []
    return [(statistics.fmean(no_prediction_floor(gaps[r.trace], d) / len(gaps[r.trace]) for r in oracles),
             statistics.fmean((r.latency_p95_ms or 0.0) + d for r in oracles)) for d in range(0, 501, 10)]  # fmt: skip


def _means(runs: Sequence[LabResult], prof: str) -> list[LabResult]:
    """One result per policy on `prof`: the mean over traces (p95 too: the mean of the traces' p95s)."""
    by_policy: dict[str, list[LabResult]] = {}
    for run in runs:
        if run.profile == prof:
            by_policy.setdefault(run.policy, []).append(run)
    means = []
    for name, group in by_policy.items():
        first = group[0]

        def mean(key: str, group: list[LabResult] = group) -> float:
            values = [getattr(r, key) for r in group if getattr(r, key) is not None]
            return statistics.fmean(values) if values else math.nan

        means.append(LabResult(
            policy=name, trace="mean", profile=prof, accuracy=first.accuracy, edits=sum(r.edits for r in group),
            pauses=sum(r.pauses for r in group), pause_coverage=mean("pause_coverage"),
            latency_p50_ms=mean("latency_p50_ms"), latency_p95_ms=mean("latency_p95_ms"),
            upstream_requests=sum(r.upstream_requests for r in group), requests_per_edit=mean("requests_per_edit"),
            completion_tokens=sum(r.completion_tokens for r in group),
            wasted_completion_tokens=sum(r.wasted_completion_tokens for r in group),
            prompt_tokens_computed=sum(r.prompt_tokens_computed for r in group),
            predicted_chars=sum(r.predicted_chars or 0 for r in group), reused=sum(r.reused for r in group),
            kept_per_shown=mean("kept_per_shown"),
            timeouts=sum(r.timeouts for r in group), errors=sum(r.errors for r in group),
            peak_held=max(r.peak_held for r in group), settings=first.settings,
        ))  # fmt: skip
    return means


COLUMNS = [
    ("trace", "trace", "{}"), ("policy", "policy", "{}"), ("edits", "edits", "{}"), ("pauses", "pauses", "{}"),
    ("pause_coverage", "pause coverage", "{:.1%}"), ("latency_p50_ms", "p50 ms", "{:.0f}"),
    ("latency_p95_ms", "p95 ms", "{:.0f}"), ("upstream_requests", "upstream requests", "{}"),
    ("requests_per_edit", "upstream / edit", "{:.2f}"), ("wasted_completion_tokens", "wasted tokens", "{}"),
    ("predicted_chars", "predicted chars", "{}"), ("kept_per_shown", "kept / shown", "{:.1f}"),
    ("reused", "reused", "{}"), ("timeouts", "timeouts", "{}"),
    ("peak_held", "server peak held", "{}"),
]  # fmt: skip


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]] = COLUMNS) -> list[str]:
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key), spec) for key, _, spec in columns) + " |" for row in rows]
    return lines


def render(result: Lab, command: str) -> str:
    intro = (
        "Virtual time (`mellum_proxy/tuning/runners/lab.py`): the proxy's real service and policies in front of "
        "the simulated server; "
        f"completions are what the person typed next with probability {result['accuracy']:g}, else junk; "
        f"{result['max_tokens']} tokens asked; the first {result['limit_events']} edits of each trace."
    )
    lines = [f"`{command}`", "", intro, ""]
    lines += ["Targets for `defaults` against `direct` (plugin cancels) and the `oracle` (one request per pause, sent "
              "straight to the server the moment typing stops): coverage >= direct - 1 point, p95 <= direct and <= "
              "1.1x the oracle's, upstream requests <= 1.5x the oracle's, wasted completion tokens <= 1/4 of "
              "direct's.", ""]  # fmt: skip
    marks = {True: "yes", False: "**no**"}
    lines += ["`floor / limit`: an estimate of the fewest upstream requests any policy that cannot foresee the "
              "typing can send and still start every pause's request within a tenth of the oracle's p95 of the "
              "moment typing stopped (it must send for every edit followed by a longer gap, "
              "`mellum_proxy/tuning/workloads/editor.py`), beside the target's limit. At accuracy 0 nothing is "
              "answered from an "
              "earlier completion, so where the floor is over the limit no policy is expected to meet both the "
              "requests and the p95 target.", ""]  # fmt: skip
    grid = any("met_by" in row for row in result["targets"])
    if grid:
        lines += ["With the grid, each cell also says how many of the policies met that target there, and the last "
                  "column how many met all four.", ""]  # fmt: skip
    header = "| profile | trace | coverage | p95 | requests | waste | floor / limit |" + (" all four |" if grid else "")
    lines += [header, "|" + "---|" * (8 if grid else 7)]
    for row in result["targets"]:
        bound = f"{row['floor']} / {row['limit']}" if "floor" in row else "-"
        if "floor" in row and row["floor"] > row["limit"]:
            bound = f"**{bound}**"
        met_by = row.get("met_by", {})
        cells = [marks[row[k]] + (f" ({met_by[k]}/{row['policies']})" if k in met_by else "")
                 for k in ("coverage", "p95", "requests", "waste")]  # fmt: skip
        tail = f" {met_by['all']}/{row['policies']} |" if met_by else ""
        lines.append(f"| {row['profile']} | {row['trace']} | " + " | ".join(cells) + f" | {bound} |" + tail)
    lines += lab_capacity_lines(result)
    for prof, source in result["profiles"].items():
        lines += ["", f"## {prof}", "", f"Server: {source}.", ""]
        rows = [r for r in result["runs"] if r["profile"] == prof and r["policy"] in NAMED]
        rows = rows or [r for r in result["runs"] if r["profile"] == prof]
        lines += _table(rows)
        frontier = result["frontier"].get(prof, [])
        means = {r["policy"]: r for r in result["means"][prof]}
        if len(means) > 2:
            lines += ["", f"Pareto frontier over the mean of the traces ({len(means)} policies; fewer upstream "
                      "requests per edit, more coverage, lower p95):", ""]  # fmt: skip
            lines += _table([means[name] | {"trace": "mean"} for name in frontier])
    return "\n".join(lines) + "\n"


NAMED = ("direct", "oracle", "defaults")  # the policies each profile's table shows (not a grid's)
PLOT_COLUMNS = 3  # panels a row in frontier.png


def plot(result: Mapping[str, Any], path: Path, highlight: str | None = None) -> None:
    """Upstream requests per edit against p95, one panel per server; colour: coverage; frontier ringed;
    `highlight`: one more policy to name (tune's choice)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(result["profiles"])
    columns = min(PLOT_COLUMNS, len(profiles))  # five servers in one row made a 3,300-pixel strip
    rows = math.ceil(len(profiles) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 5.2 * rows), squeeze=False)
    for axis in axes.flat[len(profiles) :]:
        axis.set_visible(False)
    for axis, prof in zip(axes.flat, profiles, strict=False):
        # a policy that answered no pause has no p95 (NaN in memory, null once read back from JSON): not drawn
        means = [m for m in result["means"][prof] if m["latency_p95_ms"] is not None
                 and not math.isnan(m["latency_p95_ms"])]  # fmt: skip
        frontier = set(result["frontier"].get(prof, []))
        points = axis.scatter([m["requests_per_edit"] for m in means], [m["latency_p95_ms"] for m in means],
                              c=[m["pause_coverage"] for m in means], cmap="viridis", vmin=0, vmax=1, s=30)  # fmt: skip
        for m in means:
            if m["policy"] in frontier:
                axis.scatter([m["requests_per_edit"]], [m["latency_p95_ms"]], s=120, facecolors="none",
                             edgecolors="red")  # fmt: skip
            if m["policy"] in ("direct", "defaults", "oracle", highlight):
                label = "chosen: " + m["policy"] if m["policy"] == highlight else m["policy"]
                axis.annotate(label, (m["requests_per_edit"], m["latency_p95_ms"]), fontsize=8)
        bound = result.get("bound", {}).get(prof) or []
        if bound:
            axis.plot([x for x, _ in bound], [y for _, y in bound], "k--", linewidth=1,
                      label="no-prediction estimate (hold d ms)")  # fmt: skip
        oracle = next((m for m in means if m["policy"] == "oracle"), None)
        if oracle is not None and oracle["latency_p95_ms"] is not None:
            axis.axvline(1.5 * oracle["requests_per_edit"], color="grey", linestyle=":", linewidth=1,
                         label="targets: 1.5x oracle requests, 1.1x its p95")  # fmt: skip
            axis.axhline(1.1 * oracle["latency_p95_ms"], color="grey", linestyle=":", linewidth=1)
        if bound or oracle is not None:  # under the panel, where it covers no point and no label
            axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False)
        axis.set_title(f"{prof}: mean over traces (red: Pareto frontier)")
        axis.set_xlabel("upstream requests per edit")
        axis.set_ylabel("pause->shown p95 (ms)")
        figure.colorbar(points, ax=axis, label="pause coverage")
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
