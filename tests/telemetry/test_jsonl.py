"""JsonlLog: appended lines, rotation by size, nothing lost at close."""

from __future__ import annotations

from pathlib import Path

import orjson

from mellum_proxy.telemetry import JsonlLog


async def test_lines_are_appended_and_flushed_at_close(tmp_path: Path) -> None:
    path = tmp_path / "log" / "requests.jsonl"
    log = JsonlLog(path, max_bytes=1 << 20)
    log.start()
    for i in range(500):
        log.put({"id": i})
    await log.close()  # everything queued is written before close returns
    assert [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()] == list(range(500))


async def test_rotation_keeps_the_newest_files(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = JsonlLog(path, max_bytes=200, keep=2)
    log.start()
    for i in range(100):
        log.put({"id": i, "pad": "x" * 20})
        await log.close()  # one write (and possible rotation) per line, deterministically
        log.start()
    await log.close()
    sizes = file_sizes(tmp_path)
    assert sorted(sizes) == ["requests.jsonl", "requests.jsonl.1", "requests.jsonl.2"]
    assert all(size <= 200 + 40 for size in sizes.values())
    newest = [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]
    assert newest[-1] == 99


def file_sizes(folder: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in folder.iterdir()}
