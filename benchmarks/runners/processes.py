"""The proxy (or a router) as a process of its own: a free port, waiting for `/health`, what the
process holds, and cores kept busy meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence

import aiohttp

from mellum_proxy.planning.probe import host_rss_mib
from mellum_proxy.proc import open_files, threads


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, timeout_s: float = 60.0, exited: asyncio.subprocess.Process | None = None
) -> float:
    """Poll `url/health` until it answers 200; the seconds that took.

    Raises:
        TimeoutError: not healthy within `timeout_s`.
        RuntimeError: the `exited` process ended first.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < timeout_s:
        if exited is not None and exited.returncode is not None:
            raise RuntimeError(f"the proxy exited with {exited.returncode}")
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return loop.time() - started
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)  # polling: the process has no event to wait on
    raise TimeoutError(f"the proxy was not healthy after {timeout_s:.0f} s")


def rss_mib(pid: int) -> float:
    """Resident memory of a live process (Linux /proc)."""
    rss = host_rss_mib(pid)
    if rss is None:
        raise RuntimeError(f"no VmRSS for process {pid}")
    return rss


def process_state(pid: int) -> dict[str, float]:
    """VmRSS (MiB), open file descriptors and threads of a live process, from /proc."""
    fds, running = open_files(pid), threads(pid)
    if fds is None or running is None:
        raise RuntimeError(f"no /proc state for process {pid}")
    return {"rss_mib": rss_mib(pid), "fds": fds, "threads": running}


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """`count` processes that spin a core each, for the duration."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextlib.asynccontextmanager
async def listening(argv: Sequence[str], port: int, timeout_s: float = 60.0) -> AsyncIterator[int]:
    """`argv` as a process of its own for the body of the `async with`, from when it accepts connections on
    127.0.0.1:`port`; yields its pid.

    Raises:
        RuntimeError: it exited first.
        TimeoutError: it did not listen within `timeout_s`.
    """
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{' '.join(argv[:4])} exited with {process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if loop.time() - started > timeout_s:
                    raise TimeoutError(f"{' '.join(argv[:4])} did not listen within {timeout_s:.0f} s") from None
                await asyncio.sleep(0.05)  # polling: a process that binds its port sends no event
                continue
            writer.close()
            await writer.wait_closed()
            break
        yield process.pid
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
