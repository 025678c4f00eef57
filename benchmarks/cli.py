"""`python -m benchmarks NAME`: each measurement is added by the module that runs it (`add_commands`)."""

from __future__ import annotations

from benchmarks.runners import (
    breaks,
    budget,
    calibration,
    capacity_real,
    day,
    fast_model,
    first_run,
    gpu_check,
    ladder,
    lanes,
    memory,
    overhead,
    soak,
    team,
)
from mellum_proxy.console import Parser, subcommands
from mellum_proxy.stopping import run_as_command

COMMANDS = (team, ladder, overhead, budget, first_run, memory, soak, calibration, lanes, fast_model,
            capacity_real, day, breaks, gpu_check)  # fmt: skip


def build_parser() -> Parser:
    return subcommands("python -m benchmarks", "the project's measurements of its own claims", COMMANDS)


def main(argv: list[str]) -> None:
    """One measurement; Ctrl-C, SIGTERM or SIGHUP stop what it started and end it in one line, exit 130."""

    def run() -> None:
        args = build_parser().parse_args(argv)
        args.run(args)

    run_as_command(run, "benchmarks")
