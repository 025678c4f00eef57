"""`mellum_proxy.proc`: what /proc says of a live process, and None for one that is gone (or without /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

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
    assert (proc.threads(me) or 0) >= threading.active_count() and len(proc.thread_ids()) >= threading.active_count()
    files = proc.open_files(me)
    with open(__file__) as _held:
        assert files is not None and proc.open_files(me) == files + 1
    assert me in proc.pids()


def test_a_process_that_is_gone_reads_as_none() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(child.stdout)
    assert proc.memory_mib(gone) is None and proc.session_id(gone) is None and proc.cpu_seconds(gone) is None
    assert proc.threads(gone) is None and proc.open_files(gone) is None


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="pinning apart needs 2 CPUs"
)


@needs_two_cpus
def test_threads_pinned_apart_run_on_cpus_of_their_own_and_later_threads_take_their_makers() -> None:
    allowed = os.sched_getaffinity(0)
    started, done = threading.Event(), threading.Event()

    def wait() -> None:
        started.set()
        done.wait()

    kept = threading.Thread(target=wait)
    kept.start()
    started.wait()
    try:
        theirs, ours = proc.pin_apart({kept.native_id or 0}, 1)
        assert len(theirs) == 1 and theirs | ours == allowed and not theirs & ours
        assert os.sched_getaffinity(kept.native_id or 0) == theirs
        assert os.sched_getaffinity(0) == ours  # this (the calling) thread is one of the others
        seen: list[set[int]] = []
        later = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        later.start()
        later.join()
        assert seen == [ours]
    finally:
        done.set()
        kept.join()
        for tid in proc.thread_ids():
            os.sched_setaffinity(tid, allowed)


def test_one_cpu_cannot_be_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda _pid, _cpus: None, raising=False)
    with pytest.raises(ValueError, match="two CPUs or more; this process may use 1"):
        proc.pin_apart(set(), 1)
