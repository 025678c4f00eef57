"""`python -m benchmarks pauses`: fit the pause model's prior on traces, and score it on traces it did not see.

Each trace is typed out as the lab plays it (gaps over `MAX_GAP_MS` shortened to it), one request per edit
with the lab editor's window around the cursor, and each edit labelled: a pause when the next edit is
`PAUSE_S` or more later. The prior is a logistic regression (L2, Newton steps) over every trace; its threshold
sends at once all but `--held-pauses` of the pauses it was fitted on.

Leave one trace out: for each trace, a prior fitted on the others scores it, without and with the online
update, beside the two yardsticks: the oracle (it knows: recall and precision 1) and no foresight (every
request sent at once: recall 1, precision = the share of edits that begin a pause).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.reporting.pauses_report import Pauses, render
from mellum_proxy.console import POSITIVE, SHARE, command, fail
from mellum_proxy.policies.pause_model import FEATURES, PAUSE_S, PauseModel, Prior, probability
from mellum_proxy.tuning.reporting.writing import write_report
from mellum_proxy.tuning.runners.lab import MAX_GAP_MS, default_traces
from mellum_proxy.tuning.runners.playback import gaps_after, schedule
from mellum_proxy.tuning.workloads.convert import load_trace
from mellum_proxy.tuning.workloads.editor import window
from mellum_proxy.tuning.workloads.trace import Documents, Edit, Event, Trace, TraceError, limited

L2 = 1.0
STEPS = 30


def add_commands(commands: Any) -> None:
    about = "fit the pause model's prior on traces; score it on traces it did not see"
    pauses = command(commands, "pauses", about, _pauses, out="pauses")
    pauses.add_argument("traces", nargs="*", type=Path, help="traces [default: the lab's five]")
    pauses.add_argument("--limit-events", type=POSITIVE, default=1500, help="edits per trace [default: 1500]")
    pauses.add_argument("--held-pauses", type=SHARE, default=0.03,
                        help="share of the fitted pauses the threshold may hold [default: 0.03]")  # fmt: skip
    pauses.add_argument("--prior", type=Path, help="write the prior here (the shipped one: "
                        "mellum_proxy/policies/pause_prior.json) [default: pause_prior.json in --out]")  # fmt: skip


def _pauses(args: argparse.Namespace) -> None:
    try:
        traces = [(p.name, list(load_trace(p).events)) for p in args.traces] if args.traces else default_traces()
    except (OSError, TraceError) as exc:
        fail(str(exc))
    result = measure(traces, args.limit_events, args.held_pauses)
    prior = orjson.dumps(result["prior"], option=orjson.OPT_INDENT_2)
    path = args.prior or args.out / "pause_prior.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(prior + b"\n")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror}")
    print(f"wrote {path}")
    write_report(args.out, "pauses", result, render)


def samples(events: Sequence[Event], limit_events: int) -> tuple[list[tuple[float, str, str | None]], list[float]]:
    """Each edit's request as the lab sends it, (time s, prefix, suffix), and its label (1: begins a pause)."""
    events = list(limited(Trace(list(events)), limit_events))
    documents, gaps = Documents(), gaps_after(events, MAX_GAP_MS)
    requests: list[tuple[float, str, str | None]] = []
    labels: list[float] = []
    for position, (event, at) in enumerate(zip(events, schedule(events, MAX_GAP_MS), strict=True)):
        documents.apply(event)
        if isinstance(event, Edit):
            prefix, suffix = window(documents.texts[event.file], documents.cursor[event.file])
            requests.append((at / 1000, prefix, suffix))
            labels.append(float(gaps[position] >= PAUSE_S * 1000))
    return requests, labels


def predictions(prior: Prior, requests: Sequence[tuple[float, str, str | None]], learn: bool) -> list[bool]:
    """Whether the model, playing the trace as one session, would send each request at once."""
    model = PauseModel(prior, learn=learn)
    return [model.likely_pause("trace", at, prefix, suffix) for at, prefix, suffix in requests]


def feature_rows(requests: Sequence[tuple[float, str, str | None]]) -> list[list[float]]:
    model = PauseModel(Prior((0.0,) * len(FEATURES)), learn=False)
    return [model.step("trace", at, prefix, suffix)[0] for at, prefix, suffix in requests]


def fit(rows: Sequence[list[float]], labels: Sequence[float], held_pauses: float, about: dict[str, Any]) -> Prior:
    """The logistic regression over `rows`; the threshold under which `held_pauses` of the pauses fall."""
    import numpy as np  # the bench extra's (matplotlib's)

    x, y = np.array(rows), np.array(labels)
    w = np.zeros(x.shape[1])
    for _ in range(STEPS):
        p = 1 / (1 + np.exp(-x @ w))
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + L2 * np.eye(len(w))
        w += np.linalg.solve(hessian, x.T @ (y - p) - L2 * w)
    p = 1 / (1 + np.exp(-x @ w))
    threshold = float(np.quantile(p[y == 1], held_pauses)) if y.any() else 0.5
    return Prior(tuple(round(float(v), 4) for v in w), round(threshold, 4), held_pauses, about)


def score(sent: Sequence[bool], labels: Sequence[float]) -> dict[str, Any]:
    """Pause recall (pauses sent at once), precision (sent at once that began a pause), the share of other edits
    held."""
    pauses = sum(labels)
    hits = sum(s and y == 1 for s, y in zip(sent, labels, strict=True))
    others = len(labels) - pauses
    held_others = sum(not s and y == 0 for s, y in zip(sent, labels, strict=True))
    return {"recall": hits / pauses if pauses else None, "precision": hits / sum(sent) if any(sent) else None,
            "held_others": held_others / others if others else None}  # fmt: skip


def auc(probabilities: Sequence[float], labels: Sequence[float]) -> float | None:
    """The chance that a pause ranks above an edit typed on (ties count half)."""
    ranked = sorted(zip(probabilities, labels, strict=True))
    positives = sum(labels)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        rank_sum += sum(y for _, y in ranked[i:j]) * (i + j + 1) / 2
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def measure(traces: Sequence[tuple[str, Sequence[Event]]], limit_events: int, held_pauses: float) -> Pauses:
    """The prior over every trace, and per trace the leave-one-out scores beside the yardsticks."""
    data = {}
    for name, events in traces:
        requests, labels = samples(events, limit_events)
        data[name] = (requests, labels, feature_rows(requests))

    about = {"features": list(FEATURES), "traces": list(data), "limit_events": limit_events,
             "held_pauses": held_pauses, "pause_s": PAUSE_S}  # fmt: skip
    rows = [row for _, _, trace_rows in data.values() for row in trace_rows]
    labels = [label for _, trace_labels, _ in data.values() for label in trace_labels]
    prior = fit(rows, labels, held_pauses, about)
    scores = []
    for name, (requests, trace_labels, _) in data.items():
        others = [n for n in data if n != name]
        if not others:
            break
        fold = fit([r for n in others for r in data[n][2]], [y for n in others for y in data[n][1]], held_pauses, {})
        pauses = sum(trace_labels)
        scores.append({
            "trace": name, "edits": len(trace_labels), "pauses": int(pauses),
            "auc": auc([probability(fold.weights, row) for row in data[name][2]], trace_labels),
            "prior": score(predictions(fold, requests, False), trace_labels),
            "online": score(predictions(fold, requests, True), trace_labels),
            "oracle": {"recall": 1.0, "precision": 1.0, "held_others": 1.0},
            "no_foresight": {"recall": 1.0, "precision": pauses / len(trace_labels), "held_others": 0.0},
        })  # fmt: skip
    weights = dict(zip(FEATURES, prior.weights, strict=True))
    return Pauses(
        prior={**about, "weights": list(prior.weights), "threshold": prior.threshold},
        weights=weights,
        leave_one_out=scores,
        max_gap_ms=MAX_GAP_MS,
    )
