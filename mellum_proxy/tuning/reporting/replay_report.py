"""Results of a replay: `results.json`, `report.md` (a table with the command on top) and PNG plots."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.console import command, fail
from mellum_proxy.tuning.reporting.cells import cell
from mellum_proxy.tuning.reporting.results import PolicyResult
from mellum_proxy.tuning.reporting.writing import command_line


def add_commands(commands: Any) -> None:
    about = (
        "one report from the policies of several results.json files (a later file's policy replaces a same-named one)"
    )
    merged = command(commands, "report", about, _report)
    merged.add_argument("results", nargs="+", type=Path)
    merged.add_argument("--out", type=Path, required=True)
    merged.add_argument("--only", help="comma-separated policy names to keep [default: all]")


def _report(args: argparse.Namespace) -> None:
    results: list[PolicyResult] = []
    notes: list[str] = []
    try:
        for path in args.results:
            loaded, data = load(path)
            if args.only:
                loaded = [r for r in loaded if r.policy in args.only.split(",")]
            replaced = {r.policy for r in loaded}  # a later file's policy replaces an earlier one of that name
            results = [r for r in results if r.policy not in replaced] + loaded
            notes.append(f"{', '.join(r.policy for r in loaded)} from `{data['command']}`")
            notes += [
                note for note in data.get("notes", []) if note not in notes and not note.startswith("policy order")
            ]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        fail(f"cannot read the results: {exc}")
    for path in write(results, args.out, command_line(), notes):
        print(f"wrote {path}")


COLUMNS = [
    ("policy", "policy", "{}"),
    ("client_requests", "client requests", "{}"),
    ("upstream_requests", "upstream requests", "{}"),
    ("per_edit", "upstream / edit", "{:.2f}"),
    ("shown", "shown", "{}"),
    ("pause_coverage", "pause coverage", "{:.0%}"),
    ("latency_p50_ms", "pause->shown p50 ms", "{:.0f}"),
    ("latency_p95_ms", "p95 ms", "{:.0f}"),
    ("upstream_prompt_tokens", "prompt tokens", "{:.0f}"),
    ("upstream_completion_tokens", "completion tokens", "{:.0f}"),
    ("wasted_completion_tokens", "wasted completion tokens", "{:.0f}"),
    ("timeouts", "timeouts", "{}"),
    ("max_queue_depth", "max queue", "{}"),
    ("max_inflight", "max in flight", "{}"),
    ("vram_peak_mib", "VRAM peak MiB", "{:.0f}"),
    ("idle_wait_s", "idle wait s", "{:.1f}"),
    ("drain_s", "server drain s", "{:.1f}"),
    ("predicted_chars", "predicted chars", "{}"),
    ("kept_per_shown", "kept chars / shown", "{:.1f}"),
]


ORACLE_COLUMNS = [("requests_x_oracle", "requests / oracle", "{:.2f}"), ("p95_x_oracle", "p95 / oracle", "{:.2f}")]


def markdown(results: list[PolicyResult], command: str, notes: list[str]) -> str:
    """The table; with an `oracle` row (one request per pause, the moment typing stopped), each policy's
    requests and p95 also as a multiple of the oracle's: its distance from the best possible."""
    oracle = next((r for r in results if r.policy == "oracle"), None)
    columns = COLUMNS + (ORACLE_COLUMNS if oracle is not None else [])
    lines = [f"`{command}`", ""]
    lines += [f"- {note}" for note in notes]
    lines += ["", "| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for result in results:
        row = result.summary()
        row["per_edit"] = result.upstream_requests / result.edits if result.edits else None
        if oracle is not None:
            row["requests_x_oracle"] = _ratio(result.upstream_requests, oracle.upstream_requests)
            row["p95_x_oracle"] = _ratio(result.latency_p95_ms, oracle.latency_p95_ms)
        lines.append("| " + " | ".join(cell(row[key], fmt) for key, _, fmt in columns) + " |")
    return "\n".join(lines) + "\n"


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def plots(results: list[PolicyResult], out: Path) -> list[Path]:
    """Latency CDF per policy, and upstream requests in flight over time per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for result in results:
        values = sorted(result.latencies_ms)
        if values:
            axis.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=result.policy)
    axis.set_xlabel("pause start to suggestion shown (ms)")
    axis.set_ylabel("share of covered pauses")
    axis.set_title("Pause-to-suggestion latency (CDF)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path = out / "latency_cdf.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)

    figure, axes = plt.subplots(len(results), 1, figsize=(8, 1.8 * len(results) + 0.6), sharex=True, squeeze=False)
    for axis, result in zip(axes[:, 0], results, strict=True):
        series = result.inflight_series
        axis.step([s[0] for s in series], [s[1] + s[2] for s in series], where="post", color="tab:red", lw=0.8)
        axis.set_ylabel("in flight", fontsize=8)
        axis.set_title(result.policy, fontsize=9, loc="left")
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("replay time (s)")
    figure.suptitle("Requests held by the upstream (running + queued)")
    figure.tight_layout()
    path = out / "inflight.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)
    return written


def write(results: list[PolicyResult], out: Path, command: str, notes: list[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    series = {r.policy: {"inflight": r.inflight_series, "latencies_ms": r.latencies_ms} for r in results}
    body = {"command": command, "notes": notes, "policies": [r.summary() for r in results], "series": series}
    (out / "results.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
    (out / "report.md").write_text(markdown(results, command, notes))
    return [out / "results.json", out / "report.md", *plots(results, out)]


def load(path: Path) -> tuple[list[PolicyResult], dict[str, Any]]:
    """The policies of a `results.json` (with their series), and its command and notes."""
    data = orjson.loads(path.read_bytes())
    results = []
    for summary in data["policies"]:
        series = data["series"][summary["policy"]]
        inflight = [tuple(point) for point in series["inflight"]]
        results.append(PolicyResult(**summary, inflight_series=inflight, latencies_ms=series["latencies_ms"]))
    return results, data


def cached_share(result: PolicyResult) -> float | None:
    """Of the prompt tokens the server was sent, the share it served from its cache."""
    if not result.record_prompt_tokens:
        return None
    return result.record_cached_tokens / result.record_prompt_tokens


def developers_markdown(
    results: Sequence[PolicyResult], workers: dict[str, dict[str, int]] | None = None, fallback: str | None = None
) -> str:
    """One row per developer: coverage, p95, failures, cache share, and where their requests went (the
    workers' own counts when known, and the answers of the fallback upstream)."""
    lines = ["| developer | edits | upstream requests | pause coverage | p95 ms | failed | cached share | served by |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        developer = r.policy.rpartition("/")[2]
        where = dict(workers.get(developer, {})) if workers is not None else dict(r.served_by)
        if fallback is not None and r.served_by.get(fallback):
            where["local fallback"] = r.served_by[fallback]
        served = ", ".join(f"{k}: {v}" for k, v in sorted((where or {}).items())) or "-"
        share = cached_share(r)
        lines.append(
            f"| {r.policy} | {r.edits} | {r.upstream_requests} | {(r.pause_coverage or 0):.0%} | "
            f"{r.latency_p95_ms or 0:.0f} | {r.upstream_errors} | "
            f"{'-' if share is None else f'{share:.0%}'} | {served} |"
        )
    return "\n".join(lines) + "\n"
