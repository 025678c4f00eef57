"""A relay as a process of its own (`benchmarks overhead`'s as-deployed paths): started, awaited until it listens,
its CPU read, and stopped; one that dies first is said, not waited on."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks.runners.processes import listening
from mellum_proxy.proc import cpu_seconds
from mellum_proxy.urls import free_port

SPIN_THEN_SERVE = (  # 0.2 s of CPU, then listen: the CPU is spent before the port answers, on any machine
    "import socket, sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)\n"
)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="CPU time is read from Linux's /proc")
async def test_a_listening_process_is_yielded_with_its_pid_and_stopped_after() -> None:
    port = free_port()
    async with listening([sys.executable, "-c", SPIN_THEN_SERVE, str(port)], port) as pid:
        spent = cpu_seconds(pid)
        assert spent is not None and spent >= 0.15  # its own CPU (clock ticks of 10 ms), not this process's
    assert cpu_seconds(pid) is None  # stopped and reaped: nothing left to read


async def test_a_process_that_exits_before_it_listens_is_an_error() -> None:
    port = free_port()
    with pytest.raises(RuntimeError, match="exited with 3"):
        async with listening([sys.executable, "-c", "raise SystemExit(3)"], port):
            pass
