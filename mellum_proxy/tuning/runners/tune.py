"""`mellum-proxy tune TRACE... --profile FILE.json --out DIR`: the policy settings for one person's typing on
one server, chosen in the lab and written as a config file `serve --config` takes.

The traces are the person's own (`serve --record FILE`, read as `bench convert --from recording` reads it, or
any trace `bench replay` takes); the server is a profile (`mellum-proxy profile`, or a sim profile's name). Every
policy of the lab's grid, the defaults, `direct` and the `oracle` run over every trace in virtual time, with the
model's accuracy at 0 (it never predicts the typing) and at 0.3. A candidate qualifies where it meets the lab's
targets (against direct and the oracle) on every trace at both accuracies; of those, the one with the lowest
mean p95 wins (the defaults when none qualifies). `DIR/config.toml` holds the settings that
differ from the defaults; `DIR/tune.md` what each bought, `DIR/frontier.png` the
candidates per accuracy with the no-prediction estimate, `DIR/tune.json` every run.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.config import Settings
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.telemetry.stats import log_to_read
from mellum_proxy.tuning.reporting import lab_report
from mellum_proxy.tuning.reporting.lab_report import meets_targets, requests_floor
from mellum_proxy.tuning.reporting.results import LabResult
from mellum_proxy.tuning.reporting.tune_report import Tuned, render, verdict
from mellum_proxy.tuning.runners.lab import FIXED, GRID_AXES, MAX_GAP_MS, ORACLE, grid, run_lab
from mellum_proxy.tuning.runners.playback import gaps_after
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.sim.server import profile
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.tuning.workloads.convert import from_recording, load_trace
from mellum_proxy.tuning.workloads.trace import Event, Trace, TraceError, limited

ACCURACIES = (0.0, 0.3)


def add_commands(commands: Any) -> None:
    tune = command(commands, "tune", "the policy settings for your typing on your server: writes config.toml", _tune)
    tune.add_argument("traces", type=Path, nargs="*",
                      help="`serve --record` files, request logs, or traces `bench replay` takes "
                           "[default: the request log serve writes]")  # fmt: skip
    tune.add_argument("--profile", required=True, help="`mellum-proxy profile` JSON, or a sim profile's name")
    tune.add_argument("--out", type=Path, required=True, help="where config.toml, tune.md and tune.json go")
    tune.add_argument("--limit-events", type=POSITIVE, default=1500, help="edits of each trace [default: 1500]")
    tune.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")


def read_typing(path: Path) -> list[Event]:
    """A `serve --record` file or a trace, as events.

    Raises:
        TraceError, OSError, ValueError: not readable as either.
    """
    if path.name.endswith(".jsonl"):
        with path.open("rb") as handle:
            first = handle.readline()
        if b'"prefix_chars"' in first or b'"received_at"' in first:  # the proxy's own recording, or its log
            return list(from_recording(path).events)
    return list(load_trace(path).events)


def candidates() -> list[Policy]:
    """The defaults, the lab's grid of the adaptive hold, and the fixed debounce for comparison."""
    return [Policy("defaults", {}),
            *grid({"dispatch": "adaptive"}, GRID_AXES),
            *(Policy(f"fixed={ms}", {"dispatch": "fixed", "debounce_ms": ms}) for ms in FIXED)]  # fmt: skip


def choose(
    runs: Sequence[LabResult], gaps: dict[str, list[float]] | None = None
) -> tuple[str, dict[str, dict[str, bool]], list[tuple[str, float]]]:
    """The winning policy's name; per candidate whether it met each target everywhere; and the (trace, accuracy)
    places where the requests target was not held, because no policy is expected to meet it: at accuracy 0 (nothing is
    answered from an earlier completion) where the no-prediction floor (`gaps`: the trace's gaps after each edit)
    is over the target's limit."""
    index = {(r.trace, r.accuracy, r.policy): r for r in runs}
    places = {(r.trace, r.accuracy) for r in runs}
    waived = []
    for t, a in sorted(places):
        oracle = index.get((t, a, "oracle"))
        bound = requests_floor(gaps[t], oracle) if a == 0 and oracle is not None and gaps and t in gaps else None
        if bound is not None and bound["floor"] > bound["limit"]:
            waived.append((t, a))
    met: dict[str, dict[str, bool]] = {}
    for name in dict.fromkeys(r.policy for r in runs if r.policy not in ("direct", "oracle")):
        checks = [meets_targets(index[(t, a, name)], index[(t, a, "direct")], index.get((t, a, "oracle")))
                  | ({"requests": True} if (t, a) in waived else {}) for t, a in places]  # fmt: skip
        met[name] = {key: all(check[key] for check in checks) for key in checks[0]}
    p95 = {name: statistics.fmean(r.latency_p95_ms or 0.0 for r in runs if r.policy == name) for name in met}
    qualified = [name for name, targets in met.items() if all(targets.values())]
    return (min(qualified, key=lambda name: p95[name]) if qualified else "defaults"), met, waived


def config_toml(settings: dict[str, Any]) -> str:
    """The chosen settings that differ from the defaults, as TOML (`serve --config` reads it)."""
    defaults = Settings.model_fields
    lines = ["# written by `mellum-proxy tune`: the policy settings that differ from the defaults", ""]
    for key, value in settings.items():
        if defaults[key].default == value:
            continue
        lines.append(f"{key} = {orjson.dumps(value).decode()}")
    if len(lines) == 2:
        lines.append("# none does: the defaults stand")
    return "\n".join(lines) + "\n"


def tune(
    typing: Sequence[tuple[str, list[Event]]], spec: ServerProfile, max_tokens: int = 16,
    policies: Sequence[Policy] | None = None, progress: Callable[[str], None] = print,
) -> Tuned:  # fmt: skip
    """Every candidate over every trace at both accuracies; the choice and the runs."""
    chosen_from = list(policies or candidates())
    runs = []
    for name, events in typing:
        for accuracy in ACCURACIES:
            for policy in [Policy("direct", None), ORACLE, *chosen_from]:
                runs.append(run_lab(policy, events, spec, name, accuracy, max_tokens=max_tokens))
            progress(f"{name} at accuracy {accuracy:g}: {len(chosen_from) + 2} policies")
    gaps = {name: list(gaps_after(events, MAX_GAP_MS).values()) for name, events in typing}
    best, met, waived = choose(runs, gaps)
    settings = next(p.settings for p in chosen_from if p.name == best) or {}
    return Tuned(
        profile=spec.name,
        source=spec.source,
        chosen=best,
        settings=settings,
        targets=met,
        waived=waived,
        runs=[r.summary() for r in runs],
        frontier=_frontier(runs, spec, max_tokens, gaps),
    )


def _frontier(
    runs: Sequence[LabResult], spec: ServerProfile, max_tokens: int, gaps: dict[str, list[float]]
) -> dict[str, Any]:
    """The lab's frontier summary with one panel per accuracy (what `lab_report.plot` draws)."""
    panels: dict[str, Any] = {"profiles": {}, "means": {}, "frontier": {}, "bound": {}}
    for accuracy in ACCURACIES:
        name = f"accuracy {accuracy:g}"
        mine = [replace(run, profile=name) for run in runs if run.accuracy == accuracy]
        summary = lab_report.summarize(mine, [replace(spec, name=name)], accuracy, max_tokens, 0, gaps)
        panels["profiles"] |= summary["profiles"]
        panels["means"] |= summary["means"]
        panels["frontier"] |= summary["frontier"]
        panels["bound"] |= summary["bound"]
    return panels


def _tune(args: argparse.Namespace) -> None:
    try:
        spec = profile(args.profile)
        paths = args.traces or [log_to_read(None)]
        typing = [(path.name, list(limited(Trace(read_typing(path)), args.limit_events))) for path in paths]
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    result = tune(typing, spec, args.max_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.toml").write_text(config_toml(result["settings"]))
    (args.out / "tune.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (args.out / "tune.md").write_text(render(result, _command()))
    lab_report.plot(result["frontier"], args.out / "frontier.png", highlight=result["chosen"])
    print(f"chosen: {result['chosen']}")
    for line in verdict(result):
        print(line)
    print(f"wrote {args.out / 'config.toml'} (serve --config {args.out / 'config.toml'}), {args.out / 'tune.md'}, "
          f"{args.out / 'frontier.png'}")  # fmt: skip


def _command() -> str:
    words = sys.argv[sys.argv.index("tune") + 1 :] if "tune" in sys.argv else []
    return "mellum-proxy tune " + shlex.join(words)
