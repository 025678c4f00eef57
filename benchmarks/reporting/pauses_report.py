"""`bench pauses`'s report: the pause model's prior and each trace scored by a prior fitted on the others."""

from __future__ import annotations

from typing import Any, TypedDict

from mellum_proxy.policies.pause_model import MIN_PAUSES


class Pauses(TypedDict):
    """`pauses.json` (and `command`, added as it is written)."""

    prior: dict[str, Any]  # as `pause_prior.json` ships it
    weights: dict[str, float]
    leave_one_out: list[dict[str, Any]]
    max_gap_ms: float  # gaps longer than this were played as this


def render(result: Pauses, command_line: str) -> str:
    prior = result["prior"]
    lines = [
        f"`{command_line}`", "",
        f"The pause model's prior: a logistic regression over {len(prior['features'])} features, fitted on "
        f"{', '.join(prior['traces'])} (the first {prior['limit_events']} edits of each, gaps over "
        f"{result['max_gap_ms']:g} ms played as {result['max_gap_ms']:g}). A pause: no further edit within "
        f"{prior['pause_s'] * 1000:.0f} "
        f"ms. Its threshold, {prior['threshold']}, holds {prior['held_pauses']:.0%} of the pauses it was fitted on; "
        "it is used only with `foresight_learn` off. Learning (the default), a session sends every request at once "
        f"until it has shown {MIN_PAUSES} pauses, then draws its own line under {prior['held_pauses']:.0%} of its "
        "recent pauses.", "",
        "Leave one trace out: each trace scored by a prior fitted on the others, with the prior's threshold "
        "(`prior`) and learning (`online`). Recall: the pauses whose request is sent at once. Precision: of the "
        "requests sent at once, those that began a pause. Held: the other edits held (each one a request a newer "
        "keystroke can replace). The oracle knows the future; no foresight sends every request at once.", "",
        "| trace | edits | pauses | AUC | recall prior / online | precision prior / online "
        "| held prior / online | no foresight precision |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in result["leave_one_out"]:
        pr, on = row["prior"], row["online"]
        lines.append(
            f"| {row['trace']} | {row['edits']} | {row['pauses']} | {_f(row['auc'])} "
            f"| {_pct(pr['recall'])} / {_pct(on['recall'])} | {_pct(pr['precision'])} / {_pct(on['precision'])} "
            f"| {_pct(pr['held_others'])} / {_pct(on['held_others'])} | {_pct(row['no_foresight']['precision'])} |"
        )
    lines += ["", "Weights: " + ", ".join(f"{k} {v:+.2f}" for k, v in result["weights"].items()), ""]
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
