"""Start a candidate's server in a process of its own and stop it, its output kept for its allocation lines.

Two ways: the embedded llama.cpp (`embedded_child`, any GGUF through xllamacpp), or the user's own command
(`--server-cmd`, a template with `{model}`, `{context}` (per request), `{ctx_total}` (all slots: llama.cpp's
`-c`), `{batch}`, `{kv}`, `{vllm_kv}` (`auto` for f16/bf16) and `{port}`). Each runs in a session of its own, so
stopping it stops its children (vLLM's engine process) too, and nothing `fit` started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass, field

from mellum_proxy.planning.candidates import Candidate
from mellum_proxy.planning.probe import wait_healthy
from mellum_proxy.upstream.embedded import spec_flags

LOG_LIMIT = 4 * 2**20  # the start-up log and what follows; a server that talks more keeps its first 4 MiB
OOM = re.compile(r"(?i)out of memory|failed to allocate|cannot allocate|CUDA error: out|OutOfMemory|\bOOM\b")
PLACEHOLDERS = ("model", "context", "ctx_total", "batch", "kv", "vllm_kv", "port", "spec", "cache_reuse", "spec_flags")


class LoadFailed(Exception):
    """The server did not come up: `kind` is `load_oom`, `load_failed` or `load_timeout`; `line` what it said."""

    def __init__(self, kind: str, line: str, log: str = "") -> None:
        super().__init__(f"{kind}: {line}")
        self.kind, self.line, self.log = kind, line, log


@dataclass
class Running:
    """A started server: its URL, its process (the session's leader) and its output so far."""

    url: str
    process: asyncio.subprocess.Process
    output: bytearray = field(default_factory=bytearray)
    reader: asyncio.Task[None] | None = None

    @property
    def log(self) -> str:
        return self.output.decode(errors="replace")

    async def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the server's whole session, then kill what is left after `grace_s`."""
        _signal_session(self.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), grace_s)
        except TimeoutError:
            pass
        _signal_session(self.process.pid, signal.SIGKILL)  # children that outlived their leader too
        await self.process.wait()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


def _signal_session(sid: int, which: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, which)


def command_for(candidate: Candidate, server_cmd: str | None, port: int, threads: int, spec: str = "none",
                cache_reuse: int = 0) -> list[str]:  # fmt: skip
    """The argv that starts this candidate's server (with a speed candidate's speculation and cache reuse).

    Raises:
        ValueError: `server_cmd` names a placeholder `fit` does not fill.
    """
    if server_cmd is None:
        return [sys.executable, "-m", "mellum_proxy.planning.embedded_child", str(candidate.model),
                str(candidate.context * candidate.batch), str(candidate.batch), candidate.kv_type, str(port),
                str(threads), spec, str(cache_reuse)]  # fmt: skip
    values = {"model": str(candidate.model), "context": candidate.context, "batch": candidate.batch,
              "ctx_total": candidate.context * candidate.batch, "kv": candidate.kv_type, "port": port,
              "vllm_kv": "auto" if candidate.kv_type in ("f16", "bf16") else candidate.kv_type, "spec": spec,
              "cache_reuse": cache_reuse}  # fmt: skip
    try:  # `{spec_flags}`, a word of its own, is llama-server's flags for the speculation (a draft model's too)
        words = [spec_flags(spec).split() if word == "{spec_flags}" else [word] for word in shlex.split(server_cmd)]
        return [word.format(**values) for group in words for word in group]
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"--server-cmd: {exc} is not a placeholder fit fills ({', '.join(PLACEHOLDERS)})") from None


async def start(argv: list[str], port: int, timeout_s: float, env: dict[str, str] | None = None) -> Running:
    """Start the server and wait until its `/health` answers 200.

    Raises:
        LoadFailed: it exited first (its last line quoted), or did not answer within `timeout_s`.
    """
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
    except OSError as exc:
        raise LoadFailed("load_failed", f"cannot run {argv[0]}: {exc.strerror}") from None
    running = Running(f"http://127.0.0.1:{port}", process)
    running.reader = asyncio.create_task(_collect(process, running.output))
    try:
        await _healthy(running, timeout_s)
    except BaseException:
        await running.stop()
        raise
    return running


async def _collect(process: asyncio.subprocess.Process, output: bytearray) -> None:
    assert process.stdout is not None
    while chunk := await process.stdout.read(65536):
        if len(output) < LOG_LIMIT:
            output += chunk[: LOG_LIMIT - len(output)]


async def _healthy(running: Running, timeout_s: float) -> None:
    """Until the server's `/health` answers 200 (`planning.probe.wait_healthy`), or its process exits first."""
    healthy = asyncio.create_task(wait_healthy(running.url, timeout_s))
    exited = asyncio.create_task(running.process.wait())
    try:
        await asyncio.wait({healthy, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (healthy, exited):
            task.cancel()
        await asyncio.gather(healthy, exited, return_exceptions=True)
    if healthy.done() and not healthy.cancelled() and healthy.exception() is None:
        return
    if running.process.returncode is None:
        raise LoadFailed("load_timeout", f"no healthy answer within {timeout_s:.0f} s", running.log)
    if running.reader is not None:
        await running.reader  # all it said before it exited
    raise LoadFailed(*why_it_failed(running.log, running.process.returncode), running.log)


GENERIC = re.compile(r"exiting due to model loading error|cleaning up before exit")


def why_it_failed(log: str, returncode: int) -> tuple[str, str]:
    """The failure's kind and the line that says it best: an allocation that failed, else the last error line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    oom = [line for line in lines if OOM.search(line)]
    if oom:
        return "load_oom", oom[0][:240]
    errors = [line for line in lines if re.search(r"(?i)\berror\b| E ", line)]
    said = [line for line in errors if not GENERIC.search(line)]  # llama.cpp's trailer after the real reason
    last = (said or errors or lines or [f"exited with status {returncode}, saying nothing"])[-1]
    return "load_failed", last[:240]
