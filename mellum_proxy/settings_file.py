"""Loading the settings: command line > environment (`MELLUM_PROXY_*`) > TOML file > defaults, and every error
in one readable line that names the setting."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from mellum_proxy.config import Settings

DEFAULT_CONFIG_FILE = Path("~/.config/mellum-proxy/config.toml")


class SettingsError(ValueError):
    """A setting is invalid or unknown; the message is one readable line that names it."""


def load_settings(cli: Mapping[str, Any] | None = None, config_file: Path | None = None) -> Settings:
    """Build the settings from CLI values, the environment and a TOML file.

    Args:
        cli: values given on the command line (only those the user typed).
        config_file: the `--config` file; without it `~/.config/mellum-proxy/config.toml` is read
            when it exists.

    Raises:
        SettingsError: one readable line naming the setting that is wrong.
    """
    path = config_file
    if path is None:
        default = DEFAULT_CONFIG_FILE.expanduser()
        path = default if default.is_file() else None
    elif not path.is_file():
        raise SettingsError(f"config file {path} does not exist")
    source = _from_file(path) if path is not None else Settings
    try:
        return source(**dict(cli or {}))
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path)) from exc
    except ValueError as exc:  # TOML syntax errors arrive as tomllib.TOMLDecodeError (a ValueError)
        raise SettingsError(f"config file {path}: {exc}") from exc


def _from_file(path: Path) -> type[Settings]:
    """`Settings` whose TOML source reads `path` (a `Settings` in every other way)."""
    config = SettingsConfigDict(**{**Settings.model_config, "toml_file": path})
    return type("Settings", (Settings,), {"model_config": config, "__module__": __name__})


def _describe(exc: ValidationError, path: Path | None) -> str:
    first = exc.errors()[0]
    name = ".".join(str(part) for part in first["loc"]) or "settings"
    if first["type"] == "extra_forbidden":
        where = f" in {path}" if path else ""
        return f"unknown setting '{name}'{where}"
    if not first["loc"]:  # a combination of settings
        return f"invalid settings: {str(first['msg']).removeprefix('Value error, ')}"
    shown = "***" if name in SECRETS else repr(first.get("input"))
    return f"invalid setting '{name}' = {shown}: {str(first['msg']).removeprefix('Value error, ')}"


SECRETS = frozenset({"auth_token", "upstream_api_key", "upstream_header"})  # never echoed, even when wrong
