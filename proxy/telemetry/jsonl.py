"""`JsonlLog`: the request log, one orjson line per request, appended and flushed.

Lines go through a queue to a writer task that writes in a worker thread, so a slow disk never
blocks the event loop. When the file passes `max_bytes` it is rotated (`FILE.1`, `FILE.2`, ...,
the oldest beyond `keep` dropped). `close()` writes everything queued before it returns: nothing
already recorded is lost on shutdown.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import IO, Any

import orjson

_STOP = b""


class JsonlLog:
    def __init__(self, path: Path, max_bytes: int, keep: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.written = 0
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._file: IO[bytes] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._run(), name="jsonl-log")

    def put(self, line: dict[str, Any]) -> None:
        """Queue one record (never blocks)."""
        self._queue.put_nowait(orjson.dumps(line) + b"\n")

    async def close(self) -> None:
        """Write what is queued, then close the file."""
        if self._task is not None:
            self._queue.put_nowait(_STOP)
            await self._task
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            lines = [line for line in batch if line is not _STOP]
            if lines:
                await asyncio.to_thread(self._write, lines)
            if len(lines) < len(batch):
                return

    def _write(self, lines: list[bytes]) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
        for line in lines:
            self._file.write(line)
        self._file.flush()
        self.written += len(lines)
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        for n in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if n == self.keep and older.exists():
                older.unlink()
            if newer.exists():
                newer.rename(older)
