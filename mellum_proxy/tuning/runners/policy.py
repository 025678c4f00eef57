"""A policy to replay: a name, the proxy settings (or none: straight to the server) and the simulated
plugin's own options; and the proxy it runs in."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.console import fail
from mellum_proxy.http import RECORDS, build_app, serve_app
from mellum_proxy.telemetry import RecentRecords


@dataclass(frozen=True)
class Policy:
    name: str
    settings: dict[str, Any] | None  # proxy settings; None: direct to the upstream
    plugin_cancel: bool = True  # the plugin cancels its open request on the next edit
    plugin_debounce_ms: float = 0  # the plugin's own debounce (real-time replay only)
    oracle: bool = False  # straight to the server, one request per pause, sent the moment typing stops


def parse_policy(text: str) -> Policy:
    """`NAME[:key=value,...]`; a NAME of `direct` or `direct-...` is the no-proxy baseline, `oracle` the best
        possible: one request per pause, sent straight to the server the moment typing stops (it knows the future);
    any other NAME the proxy with the settings given.

        Raises:
            ValueError: malformed, or a setting the proxy does not have.
    """
    name, _, rest = text.partition(":")
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"policy '{text}': expected key=value, got '{part}'")
        options[key.strip()] = value.strip()
    cancel = options.pop("plugin_cancel", "true").lower() not in ("false", "0", "no")
    debounce = float(options.pop("plugin_debounce_ms", "0"))
    if name in ("direct", "oracle") or name.startswith("direct-"):
        if options:
            raise ValueError(f"policy '{text}': {name} takes only plugin_* options")
        return Policy(name, None, cancel, debounce, oracle=name == "oracle")
    unknown = set(options) - set(Settings.model_fields)
    if unknown:
        raise ValueError(f"policy '{text}': unknown proxy setting(s) {', '.join(sorted(unknown))}")
    return Policy(name, options, cancel, debounce)


def add_proxy_options(parser: argparse.ArgumentParser) -> None:
    """`--via-proxy` and its `--proxy-setting KEY=VALUE`s, read back by `chosen_policy`."""
    parser.add_argument("--via-proxy", action="store_true", help="run the same workload through the proxy")
    parser.add_argument("--proxy-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a proxy setting for --via-proxy (repeatable)")  # fmt: skip


def chosen_policy(args: argparse.Namespace) -> Policy:
    """`direct`, or the proxy with the `--proxy-setting`s (a setting it does not have: one line, exit 2)."""
    try:
        return parse_policy("proxy:" + ",".join(args.proxy_setting) if args.via_proxy else "direct")
    except ValueError as exc:
        fail(str(exc))


@contextlib.asynccontextmanager
async def proxy_for(policy: Policy, upstream: str) -> AsyncIterator[tuple[str, web.Application | None]]:
    """The URL the plugin talks to: the upstream itself (direct) or a fresh in-process proxy."""
    if policy.settings is None:
        yield upstream, None
        return
    settings = Settings.model_validate({"upstream": upstream, **policy.settings})  # a policy may name its own
    app = build_app(settings)
    app[RECORDS] = RecentRecords(size=1 << 20)  # every record of the replay, not only the last 256
    async with serve_app(app) as url:
        yield url, app
