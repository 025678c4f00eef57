"""`mellum_proxy.proc`: what /proc says of a live process, and None for one that is gone (or without /proc)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mellum_proxy import proc

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux's /proc")


def test_a_live_process_has_memory_a_session_and_cpu_time() -> None:
    me = os.getpid()
    resident, peak = proc.memory_mib(me), proc.memory_mib(me, "VmHWM")
    assert resident is not None and peak is not None and 0 < resident <= peak
    assert proc.session_id(me) == os.getsid(0)
    spent = proc.cpu_seconds(me)
    assert spent is not None and spent > 0
    assert me in proc.pids()


def test_a_process_that_is_gone_reads_as_none() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(child.stdout)
    assert proc.memory_mib(gone) is None and proc.session_id(gone) is None and proc.cpu_seconds(gone) is None
