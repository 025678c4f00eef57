"""The request log under write faults: reported at once, bounded, resumed, never a partial line.

The faults are real: a path whose directory cannot be created, a full disk (`/dev/full` put under
the log's open descriptor), and a read-only directory as an unprivileged user (run in a child
process that drops root, when the suite runs as root).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest

from mellum_proxy.telemetry import JsonlLog
from mellum_proxy.telemetry.stats import read_log


def ids(path: Path) -> list[int]:
    return [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]


async def test_an_unwritable_log_is_reported_at_once_and_resumes_when_writable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the log's directory should be")
    log = JsonlLog(blocker / "requests.jsonl", max_bytes=1 << 20)
    log.start()
    with caplog.at_level(logging.WARNING, "mellum_proxy"):
        for i in range(10):
            log.put({"id": i})
        await log.wait_until(lambda sink: sink.errors >= 1)
    assert log.error is not None and log.written == 0
    assert any("cannot be written" in message for message in caplog.messages)  # reported before shutdown
    blocker.unlink()  # the disk is writable again
    for i in range(10, 20):
        log.put({"id": i})
    await log.wait_until(lambda sink: sink.written == 20)
    assert log.error is None and ids(blocker / "requests.jsonl") == list(range(20))
    await log.close()


async def test_a_full_disk_mid_run_leaves_no_partial_line_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = JsonlLog(path, max_bytes=1 << 20)
    log.start()
    for i in range(5):
        log.put({"id": i})
    await log.flushed()
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        assert log._fd is not None
        os.dup2(full, log._fd)  # the open log now writes to a full disk (ENOSPC)
    finally:
        os.close(full)
    for i in range(5, 50):
        log.put({"id": i, "pad": "x" * 100})
    await log.wait_until(lambda sink: sink.errors >= 1)
    await log.wait_until(lambda sink: sink.written == 50)  # reopened the file and wrote the rest
    await log.close()
    assert ids(path) == list(range(50)) and log.dropped == 0


async def test_the_queue_is_bounded_while_the_log_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("")
    log = JsonlLog(blocker / "requests.jsonl", max_bytes=1 << 20, max_queued=100)
    log.start()
    for i in range(1000):
        log.put({"id": i})
    await log.wait_until(lambda sink: sink.errors >= 1)
    assert log.dropped == 900 and len(log._lines) == 100
    blocker.unlink()
    await log.wait_until(lambda sink: sink.written == 100)
    await log.close()
    assert ids(blocker / "requests.jsonl") == list(range(900, 1000))  # the newest are kept


READ_ONLY_MID_RUN = """
import asyncio, concurrent.futures.thread, os, sys  # imported before root is dropped: its home is closed to nobody
from pathlib import Path
import orjson
from mellum_proxy.telemetry import JsonlLog
from mellum_proxy.telemetry.stats import read_log

async def main(folder: Path) -> None:
    path = folder / "requests.jsonl"
    log = JsonlLog(path, max_bytes=2000)
    log.start()
    for i in range(10):
        log.put({"id": i})
    await log.flushed()
    folder.chmod(0o500)  # read-only mid-run: rotation cannot rename, reopening cannot create
    for i in range(10, 200):
        log.put({"id": i, "pad": "x" * 40})
    await log.wait_until(lambda sink: sink.written == 200 and sink.rotate_error is not None)
    assert log.error is None, log.error
    folder.chmod(0o700)  # writable again: the next rotation works
    for i in range(200, 260):
        log.put({"id": i, "pad": "x" * 40})
    await log.wait_until(lambda sink: sink.written == 260 and sink.rotate_error is None)
    await log.close()
    lines = b"".join(p.read_bytes() for p in sorted(folder.iterdir(), reverse=True)).splitlines()
    assert sorted(orjson.loads(line)["id"] for line in lines) == list(range(260)), "lines lost or cut"
    print("ok", log.errors)

if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # nobody: a read-only directory means something again
asyncio.run(main(Path(sys.argv[1])))
"""


def test_a_directory_made_read_only_mid_run(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="mellum-log-"))
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            [sys.executable, "-c", READ_ONLY_MID_RUN, str(folder)], cwd=root, capture_output=True, text=True, timeout=60
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok") and int(done.stdout.split()[1]) >= 1


CHILD = r"""
import asyncio, resource, signal, sys
from pathlib import Path
from mellum_proxy.telemetry import JsonlLog
from mellum_proxy.telemetry.stats import read_log

async def main(path):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # the disk is full at 64 KB
    log = JsonlLog(Path(path), max_bytes=1 << 30)
    log.start()
    for i in range(4000):  # ~1.2 MB of backlog
        log.put({"id": i, "pad": "x" * 280})
    await log.wait_until(lambda sink: sink.errors >= 2)
    stuck = log.written
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024 + 300 * 1024, hard))  # 300 KB freed: less than the backlog
    await log.wait_until(lambda sink: sink.written > stuck, timeout_s=20)
    print(stuck, log.written)

asyncio.run(main(sys.argv[1]))
"""


def test_the_log_resumes_when_less_room_is_freed_than_its_backlog(tmp_path: Path) -> None:
    """A full disk that frees 300 KB under a 1.2 MB backlog: written a batch at a time, it goes on (one write
    of the whole backlog never fitted: the log never resumed)."""
    path = tmp_path / "requests.jsonl"
    result = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    stuck, written = map(int, result.stdout.split())
    assert written > stuck and path.stat().st_size <= (64 + 300) * 1024
    lines = path.read_bytes().splitlines()
    assert [orjson.loads(line)["id"] for line in lines] == list(range(len(lines)))  # whole lines, in order


async def test_a_torn_last_line_is_closed_before_the_next_run_appends(tmp_path: Path) -> None:
    """A crash cut the last write short: the next run's first record must not join it (3 sent, 2 counted)."""
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b'{"event": "request", "id": "a", "outcome": "ok"}\n{"event": "request", "id": "b", "outc')
    sink = JsonlLog(path, max_bytes=1 << 20)
    sink.start()
    sink.put({"event": "request", "id": "c", "outcome": "ok"})
    await sink.close()
    records, malformed = read_log(path)
    assert [r["id"] for r in records] == ["a", "c"] and malformed == 1


def test_stats_reads_every_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    for name, ident in ((path.name + ".2", "oldest"), (path.name + ".1", "older"), (path.name, "newest")):
        (tmp_path / name).write_bytes(orjson.dumps({"event": "request", "id": ident, "outcome": "ok"}) + b"\n")
    assert [r["id"] for r in read_log(path)[0]] == ["oldest", "older", "newest"]
