"""`mellum-proxy bench ...`: the user's tuning engine (replay a trace, the lab, `tune`, the quality set, reports);
each command is added by the module that runs it (`add_commands`).

The project's measurements of its own claims (overhead, soak, memory, ...) are not shipped: they run from a clone of
the repository as `python -m benchmarks NAME` (`benchmarks/`)."""

from __future__ import annotations

import sys

from mellum_proxy.console import Parser, fail, subcommands
from mellum_proxy.tuning.reporting import replay_report
from mellum_proxy.tuning.runners import lab, quality, replay, tune
from mellum_proxy.tuning.workloads import convert, synth

COMMANDS = (replay, convert, quality, replay_report, synth, lab, tune)
# Commands that moved out of the wheel into the repository's `benchmarks/` (a user's script gets one line saying so).
MOVED = ("team", "ladder", "overhead", "budget", "first-run", "memory", "soak", "calibrate", "lanes",
         "fast-model", "capacity", "day", "breaks")  # fmt: skip


def build_parser() -> Parser:
    return subcommands("mellum-proxy bench", "replay keystroke traces through the proxy, compare policies", COMMANDS)


def main(argv: list[str]) -> None:
    """`mellum-proxy bench ...` (the proxy's CLI hands over everything after `bench`)."""
    if argv[:1] and argv[0] in MOVED:
        fail(f"`mellum-proxy bench {argv[0]}` measures the project itself and is not installed with it: from a clone "
             f"of the repository, run `python -m benchmarks {argv[0]}` (or `make bench-{argv[0]}`)")  # fmt: skip
    args = build_parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
