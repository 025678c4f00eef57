"""The `mellum-proxy` command. `serve`'s flags are generated from `proxy.config.Settings`, so the
CLI, the environment and the TOML file always know the same settings."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from proxy import __version__
from proxy.config import Settings, SettingsError, load_settings


class _Parser(argparse.ArgumentParser):
    """Errors are one readable line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.default
        help_text = f"{field.description} [default: {default}]"
        if field.annotation is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, metavar=name.upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mellum-proxy", description="A completion proxy in front of a local model server.")
    parser.add_argument("--version", action="version", version=f"mellum-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser("serve", help="run the proxy in the foreground")
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings file [default: ~/.config/mellum-proxy/config.toml if present]",
    )
    _add_settings_flags(serve)
    return parser


def _fail(message: str) -> NoReturn:
    print(f"mellum-proxy: {message}", file=sys.stderr)
    raise SystemExit(2)


def _serve(args: argparse.Namespace) -> None:
    cli_values: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    try:
        settings = load_settings(cli_values, args.config)
    except SettingsError as exc:
        _fail(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from proxy.server import serve

    try:
        asyncio.run(serve(settings))
    except (OSError, RuntimeError) as exc:  # port in use, model missing, embedded extra absent
        _fail(str(exc))


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        _serve(args)
