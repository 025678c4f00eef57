"""How every `mellum-proxy` command reports bad input: one readable line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2 (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def fail(message: str) -> NoReturn:
    """Stop the command: `mellum-proxy: message` on stderr, exit code 2."""
    print(f"mellum-proxy: {message}", file=sys.stderr)
    raise SystemExit(2)
