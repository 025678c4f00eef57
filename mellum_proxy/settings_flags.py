"""The settings as command-line flags: one per `Settings` field (`debounce_ms` -> `--debounce-ms`), for `serve` and
for every command that must see the settings `serve` would run with (`editor-config`)."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from mellum_proxy.config import Settings


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and a flag per setting; a flag the user did not type leaves no value (`settings_given`)."""
    parser.add_argument(
        "--config", type=Path, default=None,
        help="TOML settings file [default: ~/.config/mellum-proxy/config.toml if present]",
    )  # fmt: skip
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.default
        if isinstance(default, tuple):
            default = ", ".join(default) or "none"
        help_text = field.description if field.default_factory else f"{field.description} [default: {default}]"
        if typing.get_origin(field.annotation) is tuple:  # a list setting: a repeatable flag
            parser.add_argument(flag, dest=name, action="append", default=argparse.SUPPRESS, metavar=name.upper(),
                                help=help_text)  # fmt: skip
        elif field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)  # fmt: skip
        else:
            parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, metavar=name.upper(), help=help_text)


def settings_given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user typed on the command line, by name."""
    return {name: value for name, value in vars(args).items() if name in Settings.model_fields}
