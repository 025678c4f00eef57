"""`mellum-proxy tune`'s report: what the chosen settings bought against the defaults, per trace and accuracy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import orjson


class Tuned(TypedDict):
    """`tune.json`."""

    profile: str
    source: str
    chosen: str
    settings: dict[str, Any]
    targets: dict[str, dict[str, bool]]
    waived: list[tuple[str, float]]
    runs: list[dict[str, Any]]
    frontier: dict[str, Any]


def render(result: Tuned, command: str) -> str:
    """What the chosen settings bought against the defaults, per trace and accuracy."""
    lines = [f"`{command}`", "", f"Server: {result['profile']} ({result['source']}).", "",
             f"Chosen: **{result['chosen']}** `{orjson.dumps(result['settings']).decode()}`", "",
             "| trace | accuracy | policy | pause coverage | p95 ms | upstream requests | wasted tokens |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    shown = {"direct", "oracle", "defaults", result["chosen"]}
    for run in result["runs"]:
        if run["policy"] in shown:
            lines.append(f"| {run['trace']} | {run['accuracy']:g} | {run['policy']} | {run['pause_coverage']:.0%} | "
                         f"{_ms(run['latency_p95_ms'])} | {run['upstream_requests']} | "
                         f"{run['wasted_completion_tokens']} |")  # fmt: skip
    met = result["targets"].get(result["chosen"], {})
    lines += ["", "Targets met on every trace at both accuracies (coverage >= direct - 1 point; p95 <= direct and "
              "<= 1.1x the oracle; requests <= 1.5x the oracle; waste <= 1/4 of direct): "
              + ", ".join(f"{key} {'yes' if ok else 'no'}" for key, ok in met.items())]  # fmt: skip
    for trace, accuracy in result.get("waived", []):
        lines += [f"Requests not held on {trace} at accuracy {accuracy:g}: no policy is expected to meet it there "
                  "(its no-prediction floor is over 1.5x the oracle's requests, see `bench lab`)."]  # fmt: skip
    lines += [verdict(result)[0]]
    return "\n".join(lines) + "\n"


def verdict(result: Mapping[str, Any]) -> list[str]:
    """What the report concludes, in the words stdout says it: how many candidates met every target, which of them
    the chosen one misses, and whether its config changes anything."""
    qualified = [name for name, targets in result["targets"].items() if all(targets.values())]
    missed = [key for key, ok in result["targets"].get(result["chosen"], {}).items() if not ok]
    lines = [f"{len(qualified)} of {len(result['targets'])} candidates met every target."]
    if missed:
        lines.append(f"The chosen {result['chosen']} misses: {', '.join(missed)} (tune.md has the figures).")
    if not result["settings"] or result["chosen"] == "defaults":
        lines.append("No setting differs from the defaults: the defaults stand (config.toml changes nothing).")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"  # None: no pause answered
