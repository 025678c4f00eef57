"""Several processes writing one request log: no record lost at rotation, no line torn (`JsonlLog`'s lock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from mellum_proxy.telemetry.stats import log_files

MAX_BYTES = 4096
WRITER = """
import asyncio, sys
from pathlib import Path
from mellum_proxy.telemetry import JsonlLog

async def main(path, name, lines, keep):
    log = JsonlLog(Path(path), max_bytes=int(sys.argv[5]), keep=keep)
    log.start()
    for i in range(lines):
        log.put({"writer": name, "n": i, "pad": "x" * 60})
        if i % 20 == 0:
            await log.flushed()  # many small writes: many rotations, each racing the other process's appends
    await log.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def write_together(path: Path, lines: int, keep: int) -> dict[str, set[int]]:
    """Two processes write `lines` records each into `path`; the numbers of each one's records read back."""
    args = [str(path), "", str(lines), str(keep), str(MAX_BYTES)]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, *args[:1], name, *args[2:]]) for name in "ab"]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    for part in log_files(path):
        for line in part.read_bytes().splitlines():
            record = orjson.loads(line)  # a torn or joined line would not parse
            seen[record["writer"]].add(record["n"])
    return seen


@pytest.mark.slow  # seconds of real time
def test_two_processes_share_a_rotating_log_without_losing_a_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    seen = write_together(path, 2000, keep=10_000)
    assert {name: len(numbers) for name, numbers in seen.items()} == {"a": 2000, "b": 2000}
    rotated = log_files(path)[:-1]
    assert len(rotated) > 20
    # each rotated file was rotated once full, by one process, and nobody appended to it after: a process that
    # rotated the other's fresh file, or wrote into one rotated away, leaves files far from the size
    sizes = sorted(part.stat().st_size for part in rotated)
    assert MAX_BYTES <= sizes[0] and sizes[-1] < 2 * MAX_BYTES, sizes


def test_with_few_files_kept_only_the_oldest_records_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    seen = write_together(path, 2000, keep=3)
    assert any(seen.values())
    for numbers in seen.values():  # what is kept of each writer is its newest records, with no gap (or none)
        assert not numbers or numbers == set(range(min(numbers), 2000))
