"""What every bench command shares to show its result: the command line as a reader would retype it,
`NAME.json` and `NAME.md` written together, and a progress bar. (Its parser comes from `console.command`.)

The contract: a runner's `measure` returns its report's typed result (a `TypedDict` in `bench/reporting/`, the
JSON's keys), and that module's `render(result, command)` writes the Markdown; `measured` or `write_report` joins
the two."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from mellum_proxy.console import fail

Result = TypeVar("Result", bound=Mapping[str, Any])  # a report's typed result (a TypedDict)
Render = Callable[[Result, str], str]  # a report module's `render(result, command)`


def command_line(prefix: str = "mellum-proxy bench", skip: int = 2) -> str:
    """The command line as a reader would retype it (`prefix`, then the arguments after the first `skip`); the
    home directory is written `~`, so no report carries a user's own paths. Run as `python -m PACKAGE ...` (the
    repository's `benchmarks`), it is written so."""
    if Path(sys.argv[0]).name == "__main__.py":
        prefix, skip = f"python -m {Path(sys.argv[0]).parent.name}", 1
    home = str(Path.home())
    args = ["~" + arg[len(home) :] if arg == home or arg.startswith(home + "/") else arg for arg in sys.argv[skip:]]
    return f"{prefix} " + " ".join(arg if arg.startswith("~/") else shlex.quote(arg) for arg in args)


def write_report(out: Path, name: str, result: Result, render: Render[Result]) -> None:
    """`NAME.json` and `NAME.md` in `out`, and the Markdown on stdout."""
    command = command_line()
    text = render(result, command)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_bytes(orjson.dumps({**result, "command": command}))
        (out / f"{name}.md").write_text(text)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    print(text, end="")
    print(f"wrote {out}/{name}.md and {name}.json")


def progress_bar(name: str, total: int) -> Callable[[int, int], None] | None:
    """A tqdm bar on stderr fed `(position, in_flight)`; None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(total=total, desc=name, unit="event", leave=True, file=sys.stderr)

    def update(position: int, in_flight: int) -> None:
        bar.n = position + 1
        bar.set_postfix(in_flight=in_flight, refresh=False)
        if position % 25 == 0 or position + 1 == total:
            bar.refresh()
        if position + 1 == total:
            bar.close()

    return update


def measured(
    name: str,
    measure: Callable[[argparse.Namespace], Coroutine[Any, Any, Result]],
    render: Render[Result],
) -> Callable[[argparse.Namespace], None]:
    """A command's handler: run `measure(args)`, then write `NAME.json` and `NAME.md` in `--out`."""

    def run(args: argparse.Namespace) -> None:
        write_report(args.out, name, asyncio.run(measure(args)), render)

    return run
