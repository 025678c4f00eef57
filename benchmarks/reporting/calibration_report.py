"""`benchmarks calibrate`'s report: the real server and the lab side by side, per policy and metric, each held to the
other within `TOLERANCE`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from mellum_proxy.tuning.reporting.cells import cell

TOLERANCE = 0.15
METRICS = (
    ("pause_coverage", "pause coverage", "{:.0%}"),
    ("latency_p95_ms", "p95 ms", "{:.0f}"),
    ("peak_held", "server peak held", "{:.0f}"),
    ("upstream_requests", "upstream requests", "{:.0f}"),
    ("predicted_chars", "predicted chars", "{:.0f}"),
    ("decode_ms_per_token", "server decode ms a token", "{:.2f}"),
)
INFORMATION = {"predicted_chars", "decode_ms_per_token"}  # shown, not held to the tolerance


class CalibrationRow(TypedDict):
    """One policy: each side's median per metric (`real`, `sim`) and each run's (`runs`, `sim_runs`)."""

    policy: str
    real: dict[str, float | None]
    runs: list[dict[str, Any]]
    sim: dict[str, float | None]
    sim_runs: list[dict[str, Any]]


class Calibration(TypedDict):
    """`calibration.json` (and `command`, added as it is written)."""

    trace: str
    edits: int
    upstream: str
    profile: str
    rows: list[CalibrationRow]
    max_tokens: int
    accuracy: float
    turn_profiles: list[dict[str, float]]  # with `--profile measure`: each turn's profile, measured before it


def agrees(real: float | None, sim: float | None) -> bool:
    """Within `TOLERANCE` of the real figure."""
    if real is None or sim is None:
        return False
    return abs(sim - real) <= TOLERANCE * max(abs(real), 1e-9)


def _range(values: Sequence[float | None], spec: str) -> str:
    seen = [v for v in values if v is not None]
    return f"{spec.format(min(seen))}-{spec.format(max(seen))}" if len(seen) > 1 else "-"


def _lab_line(result: Calibration) -> str:
    turns = result.get("turn_profiles") or []
    if len(turns) < 2:
        return f"- sim: the lab in virtual time on {result['profile']}"
    idle, decode, spread = ([turn[key] for turn in turns] for key in ("idle_slowdown", "decode_tps", "spread"))
    return (
        f"- sim: the lab in virtual time, run i on the server's profile measured before real turn i "
        f"({len(turns)} profiles: idle slowdown {min(idle):.2f}-{max(idle):.2f}x, decode "
        f"{min(decode):.0f}-{max(decode):.0f} tokens/s, spread {min(spread):.2f}-{max(spread):.2f}; "
        f"the first: {result['profile']})"
    )


def render(result: Calibration, command: str) -> str:
    trace = f"- trace: {result['trace']}, {result['edits']} edits, {result['max_tokens']} tokens asked"
    trace += f"; simulated accuracy {result.get('accuracy', 0):g}"
    runs = max((len(row["runs"]) for row in result["rows"]), default=1) or 1
    real = "real" if runs == 1 else f"real: median of {runs}"
    sim = "sim" if runs == 1 else f"sim: median of {runs}"
    lines = [f"`{command}`", "", trace,
             f"- real: {result['upstream']} (real time, through `bench replay`, {runs} run(s) a policy)",
             _lab_line(result), "",
             f"| policy | metric | {real} | real range | {sim} | sim range | within 15 % |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in result["rows"]:
        for key, title, spec in METRICS:
            median, simulated = row["real"][key], row["sim"][key]
            cells = [cell(median, spec), cell(simulated, spec)]
            ranges = [_range([r[key] for r in row["runs"]], spec), _range([r[key] for r in row["sim_runs"]], spec)]
            agree = "-" if key in INFORMATION else "yes" if agrees(median, simulated) else "**no**"
            lines.append(
                f"| {row['policy']} | {title} | {cells[0]} | {ranges[0]} | {cells[1]} | {ranges[1]} | {agree} |"
            )
    return "\n".join(lines) + "\n"
