"""`mellum-proxy bench ...`: each command is added by the module that runs it (`add_commands`)."""

from __future__ import annotations

from mellum_proxy.bench.reporting import replay_report
from mellum_proxy.bench.runners import (
    breaks,
    budget,
    calibration,
    capacity_real,
    day,
    fast_model,
    first_run,
    lab,
    ladder,
    lanes,
    memory,
    overhead,
    pauses,
    quality,
    replay,
    soak,
    team,
    tune,
)
from mellum_proxy.bench.workloads import convert, synth
from mellum_proxy.console import Parser

COMMANDS = (replay, team, convert, ladder, quality, replay_report, overhead, budget, first_run, memory, soak, synth,
            calibration, lab, tune, pauses, lanes, fast_model, capacity_real, day, breaks)  # fmt: skip


def build_parser() -> Parser:
    bench = Parser(prog="mellum-proxy bench", description="replay keystroke traces through the proxy, compare policies")
    commands = bench.add_subparsers(dest="bench_command", required=True, parser_class=Parser)
    for module in COMMANDS:
        module.add_commands(commands)
    return bench


def main(argv: list[str]) -> None:
    """`mellum-proxy bench ...` (the proxy's CLI hands over everything after `bench`)."""
    args = build_parser().parse_args(argv)
    args.run(args)
