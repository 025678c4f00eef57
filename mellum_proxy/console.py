"""How every `mellum-proxy` command reports bad input: one readable line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2 (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def fail(message: str) -> NoReturn:
    """Stop the command: `mellum-proxy: message` on stderr, exit code 2."""
    print(f"mellum-proxy: {message}", file=sys.stderr)
    raise SystemExit(2)


def whole(minimum: int = 1) -> Callable[[str], int]:
    """An argparse `type`: a whole number of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def real(minimum: float = 0.0, maximum: float = math.inf, above: bool = False) -> Callable[[str], float]:
    """An argparse `type`: a finite number from `minimum` (excluded when `above`) to `maximum`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
        low_ok = value > minimum if above else value >= minimum
        if not math.isfinite(value) or not low_ok or value > maximum:
            low = f"above {minimum:g}" if above else f"at least {minimum:g}"
            high = f" and at most {maximum:g}" if math.isfinite(maximum) else ""
            raise argparse.ArgumentTypeError(f"must be {low}{high}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


POSITIVE = whole(1)
INDEX = whole(0)  # a device index, a seed
SHARE = real(0.0, 1.0)


def subcommands(prog: str, description: str, modules: Sequence[Any]) -> Parser:
    """A parser whose commands are added by `modules`, each by its own `add_commands` (`bench`, `benchmarks`)."""
    parser = Parser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in modules:
        module.add_commands(commands)
    return parser


def command(
    commands: Any, name: str, help: str, run: Callable[[argparse.Namespace], None], out: str | None = None
) -> argparse.ArgumentParser:
    """A command's parser, run by `run`; with `out`, an `--out` folder that defaults to `bench-out/OUT`."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help)
    if out is not None:
        parser.add_argument("--out", type=Path, default=Path("bench-out") / out)
    parser.set_defaults(run=run)
    return parser
