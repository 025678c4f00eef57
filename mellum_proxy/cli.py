"""The `mellum-proxy` command. `serve`'s flags are generated from `mellum_proxy.config.Settings`, so the
CLI, the environment and the TOML file always know the same settings."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import orjson

from mellum_proxy import __version__
from mellum_proxy.config import Settings
from mellum_proxy.console import INDEX, POSITIVE, Parser, fail, real
from mellum_proxy.settings_file import SettingsError, load_settings
from mellum_proxy.settings_flags import add_settings_flags, settings_given
from mellum_proxy.stopping import run_as_command
from mellum_proxy.text_checks import unknown_environment


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mellum-proxy", description="A completion proxy in front of a local model server.")
    parser.add_argument("--version", action="version", version=f"mellum-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    serve = commands.add_parser("serve", help="run the proxy in the foreground")
    add_settings_flags(serve)

    stats = commands.add_parser("stats", help="summarize a request log (--log FILE.jsonl)")
    stats.add_argument("log", type=Path, nargs="?", help="a JSONL request log [default: the one serve writes]")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument(
        "--by",
        choices=["outcome", "session", "dialect", "lane"],
        help="one row per group (lane: the bulk requests, chat and agents, beside the completions)",
    )

    probe = commands.add_parser("probe", help="print GPU memory over time (NVML), like nvidia-smi -l")
    probe.add_argument("--interval-ms", type=POSITIVE, default=1000, help="time between readings [default: 1000]")
    probe.add_argument("--gpu", type=INDEX, default=0, help="NVML device index [default: 0]")
    probe.add_argument("--out", type=Path, help="also write the CSV to this file")
    probe.add_argument("--count", type=POSITIVE, help="stop after this many readings [default: until Ctrl-C]")

    base = commands.add_parser("baseline", help="the four memory readings: before start, loaded, idle, first request")
    base.add_argument("--upstream", required=True, help="server base URL, or 'embedded' to start one and watch it")
    base.add_argument("--idle-s", type=real(0), default=30.0, help="idle wait before the first request [default: 30]")
    base.add_argument("--gpu", type=INDEX, default=0, help="NVML device index [default: 0]")
    base.add_argument("--upstream-pid", type=POSITIVE, help="server PID, for its own memory readings")
    base.add_argument("--model", type=Path, help="GGUF for --upstream embedded [default: packaged gemma-3-270m]")
    base.add_argument("--out", type=Path, default=Path("baseline.json"), help="JSON output [default: baseline.json]")

    from mellum_proxy.editor import cli as editor_cli
    from mellum_proxy.planning import cli as planner_cli
    from mellum_proxy.planning import fit as fit_cli

    planner_cli.add_commands(commands)
    fit_cli.add_commands(commands)
    editor_cli.add_commands(commands)
    # The tuning engine (plots, traces, HumanEval) loads only when asked for: `main` hands it the rest.
    commands.add_parser("packaged-model", help="print the packaged gemma-3-270m GGUF's path (for --model, inspect)")
    commands.add_parser("tune", help="the policy settings for your typing on your server (see tune --help)")
    bench = commands.add_parser("bench", help="replay keystroke traces, the policy lab, quality set (see bench --help)")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _serve(args: argparse.Namespace) -> None:
    try:
        settings = load_settings(settings_given(args), args.config)
    except SettingsError as exc:
        fail(str(exc))
    for variable in unknown_environment(list(Settings.model_fields)):
        print(f"mellum-proxy: warning: {variable}; ignored", file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mellum_proxy.http.server import serve

    try:
        asyncio.run(serve(settings))
    except (OSError, RuntimeError) as exc:  # port in use, model missing, embedded extra absent
        fail(str(exc))


def _stats(args: argparse.Namespace) -> None:
    from mellum_proxy.telemetry.stats import log_to_read, read_log, render_table, stats

    try:
        path = log_to_read(args.log)
        records, malformed = read_log(path, every_lane=args.by == "lane")
    except (ValueError, SettingsError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    result = stats(records, malformed, args.by)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_table(result))


def _probe(args: argparse.Namespace) -> None:
    from mellum_proxy.planning.probe import probe
    from mellum_proxy.telemetry import GpuUnavailableError

    if args.interval_ms < 10:
        fail("--interval-ms must be at least 10")
    try:
        with contextlib.ExitStack() as files:
            out: IO[str] | _Tee = sys.stdout
            if args.out is not None:
                out = _Tee(sys.stdout, files.enter_context(args.out.open("w", newline="")))
            summary = probe(args.gpu, args.interval_ms, out, args.count)
    except GpuUnavailableError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {args.out}: {exc.strerror}")
    if summary["samples"]:
        print(f"samples={summary['samples']} min={summary['min_mib']:.0f} MiB max={summary['max_mib']:.0f} MiB "
              f"peak at {summary['peak_at']}", file=sys.stderr)  # fmt: skip


def _baseline(args: argparse.Namespace) -> None:
    from mellum_proxy.planning.probe import baseline
    from mellum_proxy.upstream.health import server_problem, unreachable_line
    from mellum_proxy.urls import upstream_base_url

    if args.upstream != "embedded":  # a server the user started: it must answer now, not in 120 s
        url = upstream_base_url(args.upstream)
        problem = asyncio.run(server_problem(url))
        if problem is not None:
            fail(unreachable_line(url, problem))
    try:
        book = asyncio.run(baseline(args.upstream, args.idle_s, args.gpu, args.upstream_pid, args.model))
    except (OSError, RuntimeError, TimeoutError) as exc:
        fail(f"baseline failed: {exc or 'the server did not become healthy in time'}")
    print(book.table())
    args.out.write_bytes(book.as_json())
    print(f"saved {args.out}")


def _packaged_model(args: argparse.Namespace) -> None:
    from mellum_proxy.upstream.embedded import packaged_model

    try:
        print(packaged_model())
    except (RuntimeError, OSError) as exc:
        fail(str(exc))


class _Tee:
    """Write to several text streams at once (probe's terminal output and its --out file)."""

    def __init__(self, *streams: IO[str]) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


_COMMANDS = {"serve": _serve, "stats": _stats, "probe": _probe, "baseline": _baseline,
             "packaged-model": _packaged_model}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run one command (`stopping.run_as_command`: a closed pipe, Ctrl-C, SIGTERM or SIGHUP end it in one line)."""
    run_as_command(lambda: _run(argv), "mellum-proxy")


def _run(argv: Sequence[str] | None) -> None:
    from mellum_proxy.editor.cli import HANDLERS as EDITOR
    from mellum_proxy.planning.cli import HANDLERS as PLANNER
    from mellum_proxy.planning.fit import run_fit

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tune"]:  # `mellum-proxy tune` is `mellum-proxy bench tune`: the lab does the work
        argv = ["bench", *argv]
    if argv[:1] == ["bench"]:
        from mellum_proxy.tuning.cli import main as bench

        bench(argv[1:])
        return
    args = build_parser().parse_args(argv)
    {**_COMMANDS, **PLANNER, **EDITOR, "fit": run_fit}[args.command](args)
