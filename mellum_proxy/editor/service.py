"""`mellum-proxy service install|uninstall|status`: run `mellum-proxy serve` at login.

Linux: a systemd `--user` unit (`~/.config/systemd/user/mellum-proxy.service`). macOS: a launchd agent
(`~/Library/LaunchAgents/dev.mellum-proxy.plist`). Both restart the proxy on failure and log to the
user's log directory. The README lists the manual equivalents.
"""

from __future__ import annotations

import plistlib
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "mellum-proxy.service"
AGENT_LABEL = "dev.mellum-proxy"


@dataclass(frozen=True, slots=True)
class ServiceFiles:
    platform: str  # "systemd" or "launchd"
    unit_path: Path
    log_path: Path
    config_path: Path
    command: tuple[str, ...]


def plan(config: Path, unit_dir: Path | None = None, platform: str | None = None) -> ServiceFiles:
    """Where the unit goes and what it runs (`unit_dir` overrides the user's directory, for tests)."""
    platform = platform or ("launchd" if sys.platform == "darwin" else "systemd")
    home = Path.home()
    command = (sys.executable, "-m", "mellum_proxy", "serve", "--config", str(config))
    if platform == "launchd":
        directory = unit_dir or home / "Library" / "LaunchAgents"
        log = home / "Library" / "Logs" / "mellum-proxy.log"
        return ServiceFiles(platform, directory / f"{AGENT_LABEL}.plist", log, config, command)
    directory = unit_dir or home / ".config" / "systemd" / "user"
    log = home / ".local" / "state" / "mellum-proxy" / "mellum-proxy.log"
    return ServiceFiles(platform, directory / UNIT_NAME, log, config, command)


def systemd_unit(files: ServiceFiles) -> str:
    return "\n".join([
        "[Unit]",
        "Description=mellum-proxy: code-completion proxy in front of a local model server",
        "After=network.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.join(files.command)}",
        "Restart=on-failure",
        "RestartSec=2",
        f"StandardOutput=append:{files.log_path}",
        f"StandardError=append:{files.log_path}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ])  # fmt: skip


def launchd_plist(files: ServiceFiles) -> bytes:
    return plistlib.dumps({
        "Label": AGENT_LABEL,
        "ProgramArguments": list(files.command),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart on failure, not after a clean stop
        "StandardOutPath": str(files.log_path),
        "StandardErrorPath": str(files.log_path),
    })  # fmt: skip


def activation_commands(files: ServiceFiles, install: bool) -> list[list[str]]:
    if files.platform == "launchd":
        verb = ["load", "-w"] if install else ["unload", "-w"]
        return [["launchctl", *verb, str(files.unit_path)]]
    if install:
        return [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT_NAME]]
    return [["systemctl", "--user", "disable", "--now", UNIT_NAME], ["systemctl", "--user", "daemon-reload"]]


def write(files: ServiceFiles) -> None:
    files.unit_path.parent.mkdir(parents=True, exist_ok=True)
    files.log_path.parent.mkdir(parents=True, exist_ok=True)
    if files.platform == "launchd":
        files.unit_path.write_bytes(launchd_plist(files))
    else:
        files.unit_path.write_text(systemd_unit(files))


def run_commands(commands: list[list[str]]) -> tuple[list[str], list[str]]:
    """Run the service manager's commands: what could not be run (no such manager here: said, the unit stands)
    and what the manager refused (the command fails)."""
    absent, failed = [], []
    for command in commands:
        if shutil.which(command[0]) is None:
            absent.append(f"{command[0]} not found; run it yourself: {shlex.join(command)}")
            continue
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            why = (result.stderr or result.stdout).strip().replace("\n", " ")[:200] or f"exit {result.returncode}"
            failed.append(f"{shlex.join(command)} failed: {why}")
    return absent, failed


def is_running(files: ServiceFiles) -> bool | None:
    """Whether the service manager says it runs (None: no service manager to ask)."""
    if files.platform == "launchd":
        if shutil.which("launchctl") is None:
            return None
        result = subprocess.run(["launchctl", "list", AGENT_LABEL], capture_output=True, timeout=10, check=False)
        return result.returncode == 0
    if shutil.which("systemctl") is None:
        return None
    active = subprocess.run(["systemctl", "--user", "is-active", UNIT_NAME], capture_output=True, text=True,
                            timeout=10, check=False)  # fmt: skip
    return active.stdout.strip() == "active"
