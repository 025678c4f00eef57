"""`mellum-proxy inspect-log FILE`: what a server says it allocated at start-up, beside the estimate.

Each server kind reads its own lines (`Memory.read_log_line`: vLLM, llama.cpp / llama-server, Ollama); each finding
keeps the line it came from.
"""

from __future__ import annotations

from typing import Any

from mellum_proxy.upstream.servers import KINDS
from mellum_proxy.upstream.servers.startup_log import StartupLog


def parse_log(text: str) -> StartupLog:
    report = StartupLog()
    readers = [kind.memory.read_log_line for kind in KINDS if kind.memory is not None]
    for line in text.splitlines():
        for read in readers:
            read(report, line)
    return report


def compare(measured: int, estimated: int) -> dict[str, Any]:
    error = (estimated - measured) / measured if measured else None
    return {"measured_bytes": measured, "estimated_bytes": estimated, "error": error}
