"""`mellum-proxy editor-config NAME` and `mellum-proxy service install|uninstall|status`."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mellum_proxy.config import Settings
from mellum_proxy.console import fail
from mellum_proxy.editor import service
from mellum_proxy.editor.configs import CONFIGS, render
from mellum_proxy.settings_file import DEFAULT_CONFIG_FILE, SettingsError, load_settings
from mellum_proxy.settings_flags import add_settings_flags, settings_given


def _settings(config: Path | None, given: dict[str, Any] | None = None) -> Settings:
    try:
        return load_settings(given or {}, config)
    except SettingsError as exc:
        fail(str(exc))


def add_commands(commands: Any) -> None:
    editor = commands.add_parser("editor-config", help="print a plugin's config filled in with the proxy's settings")
    editor.add_argument("name", choices=sorted(CONFIGS))
    add_settings_flags(editor)  # the settings `serve` would run with the same flags (`--embedded` included)
    editor.add_argument("--offline", action="store_true", help="do not read a running proxy's /status")

    svc = commands.add_parser("service", help="run the proxy at login (systemd --user or launchd)")
    svc.add_argument("action", choices=["install", "uninstall", "status"])
    svc.add_argument("--config", type=Path, help=f"settings the service serves with [default: {DEFAULT_CONFIG_FILE}]")
    svc.add_argument("--unit-dir", type=Path, help="write the unit here instead of the user's service directory")
    svc.add_argument("--no-activate", action="store_true", help="write the unit only; do not start or stop it")


# What a plugin's config takes from the proxy; a running proxy's `/status` says what it runs with.
CONFIG_FIELDS = ("dispatch", "debounce_ms", "timeout_ms", "max_context_tokens", "max_tokens")


STATUS_LIMIT_BYTES = 4 << 20  # a proxy's /status is tens of KB; an answer past this is no proxy's
STATUS_CHUNK_BYTES = 1 << 16


def running_settings(settings: Settings, timeout_s: float = 2.0) -> tuple[Settings, str] | None:
    """`settings` with what the proxy listening at their address runs with (its context as fitted to its
    server), and the `/status` URL read; None when no proxy answers there, or when what answers sends more
    than `STATUS_LIMIT_BYTES` or takes over `timeout_s` in all (said on stderr)."""
    url = f"http://{settings.listen}/status"
    request = urllib.request.Request(url)
    if settings.auth_token:
        request.add_header("Authorization", f"Bearer {settings.auth_token}")
    try:
        body = _read_bounded(request, timeout_s)
        status = json.loads(body) if body is not None else None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if status is None:
        print(f"editor-config: warning: what answers at {url} sent over {STATUS_LIMIT_BYTES >> 20} MB or took over "
              f"{timeout_s:g} s; using the flags instead", file=sys.stderr)  # fmt: skip
        return None
    try:
        running = {name: status["settings"][name] for name in CONFIG_FIELDS}
        context = (status.get("discovered") or {}).get("context_tokens")
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            running["max_context_tokens"] = min(running["max_context_tokens"], context)
        # validated as the settings they are (nan, a negative deadline, a wrong type are refused), not trusted
        checked = Settings.model_validate({**settings.model_dump(), **running})
    except (KeyError, TypeError, AttributeError, ValidationError) as exc:
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else f"no {exc}"
        print(f"editor-config: warning: the proxy at {url} answered settings that do not hold ({why}); "
              "using the flags instead", file=sys.stderr)  # fmt: skip
        return None
    return checked, url


def _read_bounded(request: urllib.request.Request, timeout_s: float) -> bytes | None:
    """The answer's body, or None once it passes `STATUS_LIMIT_BYTES` or the `timeout_s` deadline (the socket's
    own timeout bounds each read only: a server trickling bytes would hold the command)."""
    deadline = time.monotonic() + timeout_s
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        chunks: list[bytes] = []
        size = 0
        while chunk := resp.read1(STATUS_CHUNK_BYTES):
            size += len(chunk)
            if size > STATUS_LIMIT_BYTES or time.monotonic() > deadline:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


def run_editor_config(args: argparse.Namespace) -> None:
    """The plugin's config for the settings `serve` would run with these flags, or for the proxy that runs at
    their address (said on stderr, so the config on stdout stays a file to paste)."""
    settings = _settings(args.config, settings_given(args))
    running = None if args.offline else running_settings(settings)
    if running is not None:
        settings, url = running
        print(f"editor-config: the settings of the proxy running at {url}", file=sys.stderr)
    print(render(args.name, settings), end="")


def _config_path(args: argparse.Namespace) -> Path:
    return (args.config or DEFAULT_CONFIG_FILE).expanduser().resolve()


def run_service(args: argparse.Namespace) -> None:
    config = _config_path(args)
    files = service.plan(config, args.unit_dir)
    if args.action == "install":
        if not config.exists():  # the service must not depend on the shell's environment
            settings = _settings(None)
            config.parent.mkdir(parents=True, exist_ok=True)
            upstreams = ", ".join(f'"{url}"' for url in settings.upstream)
            config.write_text(f'listen = "{settings.listen}"\nupstream = [{upstreams}]\n')
            print(f"wrote {config}")
        else:
            _settings(config)  # refuse to install a service that would fail on its settings
        service.write(files)
        print(f"wrote {files.unit_path} ({files.platform}); logs go to {files.log_path}")
        _activate(files, args.no_activate, install=True)
    elif args.action == "uninstall":
        if files.unit_path.exists():
            _activate(files, args.no_activate, install=False)  # stopped before its unit goes
            files.unit_path.unlink()
            print(f"removed {files.unit_path}")
        else:
            print(f"no unit at {files.unit_path}")
    else:
        _status(files)


def _activate(files: service.ServiceFiles, skip: bool, install: bool) -> None:
    """Start (or stop) the service; a service manager that refuses ends the command with its reason, exit 1."""
    absent, failed = ([], []) if skip else service.run_commands(service.activation_commands(files, install))
    for note in absent:
        print(f"note: {note}")
    if failed:
        print(f"mellum-proxy: service {'install' if install else 'uninstall'}: {'; '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)


def _status(files: service.ServiceFiles) -> None:
    installed = files.unit_path.exists()
    running = service.is_running(files) if installed else False
    settings = _settings(files.config_path if files.config_path.exists() else None)
    url = f"http://{settings.listen}/health"
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            answers = f"answers on {url} (HTTP {resp.status})"
    except urllib.error.HTTPError as exc:
        answers = f"answers on {url} (HTTP {exc.code}: upstream unreachable)"
    except (urllib.error.URLError, OSError):
        answers = f"nothing answers on {url}"
    state = {True: "running", False: "not running", None: "unknown (no service manager)"}[running]
    print(f"service: {'installed at ' + str(files.unit_path) if installed else 'not installed'}; {state}")
    print(f"proxy: {answers}")


HANDLERS = {"editor-config": run_editor_config, "service": run_service}
