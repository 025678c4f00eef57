"""`JsonlLog`: the request log, one orjson line per request, appended and flushed.

Lines go through a bounded queue to a writer task that writes in a worker thread, so a slow disk
never blocks the event loop; it gathers them for `GATHER_S` first, so a stream of requests costs a write (a
thread hop) a quarter second, not one each. When the file passes `max_bytes` it is rotated (`FILE.1`, `FILE.2`,
..., the oldest beyond `keep` dropped). `close()` writes everything queued before it returns:
nothing already recorded is lost on shutdown.

A log that cannot be written (a read-only directory, a full disk) never fails a request. The first
failure is reported at once (a warning on stderr; `error` for `/status`, `errors` for `/metrics`);
the writer keeps the lines and tries again with a growing pause, and resumes when the file can be
written again. Each batch is written as whole lines: what a failed write left of it is cut off
again. A batch is at most `BATCH_BYTES`, so a disk that frees less room than the whole backlog still
takes the log back a batch at a time. While it cannot write, the queue keeps the newest `max_queued`
lines and counts the ones it drops (`dropped`).

Several processes may write one log (a `make run` beside the installed service, a restart that overlaps the old
process): each write holds an exclusive `flock` on the file, and rotation happens under it. A writer that finds
the path no longer names the file it holds open (another process rotated it) opens the new one before it
writes, so no process appends to a file that was rotated away (two proxies at 0.2 MB lost 37 % of their
records that way) and no line is torn.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("mellum_proxy")

MAX_QUEUED = 50_000  # lines kept while the file cannot be written (~830 B each: ~40 MB at most)
RETRY_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)  # pauses between attempts to write again
CLOSING_ATTEMPTS = 3  # at shutdown, the log is given up after this many more failed attempts
BATCH_BYTES = 256 * 1024  # written at once at most (one line more when a single line is larger)
GATHER_S = 0.25  # lines are gathered this long before a write: a thread hop per request cost 0.25 ms of each


class JsonlLog:
    def __init__(self, path: Path, max_bytes: int, keep: int = 3, max_queued: int = MAX_QUEUED) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.max_queued = max_queued
        self.written = 0  # lines on disk
        self.dropped = 0  # lines dropped because the queue was full
        self.errors = 0  # failed write attempts
        self.error: str | None = None  # the current failure, None while writing works
        self._lines: deque[bytes] = deque()
        self._first = 0  # the number of the oldest line queued (lines are numbered as they come)
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # write what is queued now (someone waits for it, or the log closes)
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._fd: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._size = 0  # of the file, after the last write
        self._rotate_at = max_bytes
        self.rotate_error: str | None = None

    def start(self) -> None:
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="jsonl-log")

    def put(self, line: dict[str, Any]) -> None:
        """Queue one record (never blocks; past `max_queued` the oldest queued line is dropped)."""
        if len(self._lines) >= self.max_queued:
            self._lines.popleft()
            self._first += 1
            self.dropped += 1
        self._lines.append(orjson.dumps(line) + b"\n")
        self._idle.clear()
        self._wake.set()

    async def flushed(self) -> None:
        """Wait until every line queued so far is written (or dropped)."""
        self._hurry.set()
        await self._idle.wait()

    async def close(self) -> None:
        """Write what is queued (trying until it can, or for one last round of retries), then close."""
        if self._task is not None:
            self._closing = True
            self._hurry.set()
            self._wake.set()
            await self._task
            self._task = None
        if self._lines:
            log.warning("request log %s: %d lines could not be written: %s", self.path, len(self._lines), self.error)
        self._close_fd()

    async def _run(self) -> None:
        attempt = 0
        while True:
            if not self._lines:
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if attempt == 0 and not self._hurry.is_set():  # gather: one write for the requests of a moment
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), GATHER_S)
            if not self._closing:
                self._hurry.clear()
            batch = _head(self._lines, BATCH_BYTES)
            end = self._first + len(batch)
            try:
                await asyncio.to_thread(self._write, b"".join(batch))
            except Exception as exc:  # OSError above all; anything else must not stop the writer either
                self._failed(exc)
                await self._notify()
                if self._closing and attempt >= CLOSING_ATTEMPTS:
                    return
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
                continue
            while self._lines and self._first < end:  # the lines written (the oldest may be dropped already)
                self._lines.popleft()
                self._first += 1
            self.written += len(batch)
            if self.error is not None:
                log.warning("request log %s: writing again (%d lines dropped meanwhile)", self.path, self.dropped)
                self.error = None
            attempt = 0
            await self._notify()

    def _rotated(self, failure: OSError | None) -> None:
        """After a rotation (under the lock, in `_write`): when it failed (a read-only directory), go on in the
        current file and try again once it has grown by another `max_bytes`."""
        if failure is None:
            self._rotate_at, self.rotate_error = self.max_bytes, None
            return
        self.errors += 1
        self._rotate_at = self._size + self.max_bytes
        log.warning("request log %s cannot be rotated: %s; it goes on growing", self.path, failure.strerror or failure)
        self.rotate_error = str(failure.strerror or failure)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[JsonlLog], bool], timeout_s: float = 10.0) -> None:
        """Wait until `predicate(self)` holds after a write attempt (for tests and the soak)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self._close_fd()  # reopened on the next attempt: the file may come back elsewhere
        if isinstance(exc, OSError):
            message = f"{exc.strerror or exc} ({exc.filename or self.path})"
        else:
            message = f"{type(exc).__name__}: {exc}"
        if self.error is None:
            log.warning("request log %s cannot be written: %s; retrying, requests go on", self.path, message)
        self.error = message

    def _write(self, data: bytes) -> None:
        """Append `data` whole, or not at all (a partial write is cut off again), holding the file's lock; rotate
        under the same lock when the file has passed its size."""
        fd = self._locked()
        try:
            start = os.fstat(fd).st_size
            if start > 0 and os.pread(fd, 1, start - 1) != b"\n":  # a crash cut its last line: close it first
                data = b"\n" + data
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                with contextlib.suppress(OSError):  # not a regular file (or not even that works): nothing to do
                    os.ftruncate(fd, start)
                raise
            self._size = start + len(data)
            if self._size >= self._rotate_at:
                failure: OSError | None = None
                try:
                    self._rotate()
                except OSError as exc:
                    failure = exc
                self._rotated(failure)
        finally:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _locked(self) -> int:
        """The log file open and locked: reopened first when the path names another file now (a process
        beside this one rotated it) or none (removed)."""
        while True:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            fd = self._fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                self._close_fd()
                raise
            try:
                named = os.stat(self.path)
            except FileNotFoundError:
                named = None
            held = os.fstat(fd)
            if not stat.S_ISREG(held.st_mode):  # a pipe or a device (`--log /dev/stdout`): nothing rotates it
                return fd
            if named is not None and (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
                return fd
            self._close_fd()  # closing drops the lock

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def _rotate(self) -> None:
        """Shift `FILE` -> `FILE.1` -> ... (the oldest beyond `keep` dropped), under the lock of `FILE`; the file
        stays open (and locked) until `_write` lets go of it, and the next write opens the new one."""
        for n in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if n == self.keep and older.exists():
                older.unlink()
            if newer.exists():
                newer.rename(older)


def _head(lines: deque[bytes], limit: int) -> list[bytes]:
    """The oldest lines whose size adds up to at most `limit` bytes (at least one)."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > limit:
            break
        batch.append(line)
        size += len(line)
    return batch
