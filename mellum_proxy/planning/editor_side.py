"""Then the editor side (the guide: server first): the chosen server profiled (`mellum-proxy profile`), and the
proxy's policies replayed over the person's typing on that profile (`mellum-proxy tune`); its choice joins
`config.toml`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mellum_proxy.planning.candidates import Candidate
from mellum_proxy.planning.launch import command_for, start
from mellum_proxy.planning.measure import FitOptions
from mellum_proxy.urls import free_port


async def profile_chosen(candidate: Candidate, options: FitOptions, say: Callable[[str], None], spec: str = "none",
                         cache_reuse: int = 0) -> Any:  # fmt: skip
    """The chosen candidate's server (with the chosen speed knobs) started again and profiled, then stopped."""
    from mellum_proxy.planning.profile import profile

    port = free_port()
    server = await start(command_for(candidate, options.server_cmd, port, options.threads, spec, cache_reuse), port,
                         options.load_timeout_s)  # fmt: skip
    try:
        return await profile(server.url, f"fit's choice: {candidate.name}", say, shown_as="fit's choice")
    finally:
        await server.stop()


def tune_on(measured: Any, traces: list[Path], limit_events: int, say: Callable[[str], None]) -> Mapping[str, Any]:
    """`mellum-proxy tune` over the traces on the measured profile.

    Raises:
        OSError, ValueError: a trace that cannot be read.
    """
    from mellum_proxy.tuning.runners.tune import read_typing, tune
    from mellum_proxy.tuning.workloads.trace import Trace, limited

    typing = [(path.name, list(limited(Trace(read_typing(path)), limit_events))) for path in traces]
    return tune(typing, measured, progress=say)


def merged_toml(config: str, settings: dict[str, Any]) -> str:
    """`config.toml` with tune's settings that differ from the defaults (fit's own lines win)."""
    from mellum_proxy.tuning.runners.tune import config_toml

    present = {line.split("=", 1)[0].strip() for line in config.splitlines() if "=" in line}
    added = [line for line in config_toml(settings).splitlines()[2:] if line.split("=", 1)[0].strip() not in present]
    if not added:
        return config
    return (
        config
        + "\n# the editor side, chosen by `mellum-proxy tune` on the chosen server's profile\n"
        + "\n".join(added)
        + "\n"
    )
