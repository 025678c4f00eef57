"""How a long-running command stops: SIGTERM and SIGHUP (a `timeout`, a closed terminal, `kill`) as Ctrl-C does.

Ctrl-C inside `asyncio.run` cancels the main task (outside it, it raises `KeyboardInterrupt`), so the `finally` blocks
and context managers that stop a command's servers, children and temp folders run. The other two signals end a
process at once by default, leaving all of that behind; under `stopped_like_ctrl_c` they call whatever handles
Ctrl-C at that moment. `mellum-proxy` runs every
command under it and ends an interrupted one in one line, exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType


@contextlib.contextmanager
def stopped_like_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP (a `timeout`, a closed terminal, `kill`) stop the body as Ctrl-C does: `asyncio.run`
    cancels its task, so the `finally` blocks stop the processes and servers a bench started."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        on_ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(on_ctrl_c):  # ignored or the default: Ctrl-C's exception all the same
            raise KeyboardInterrupt
        on_ctrl_c(signal.SIGINT, frame)  # asyncio.run's own: it cancels the main task (a raise here would land
        # in whatever callback the loop runs now)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_as_command(run: Callable[[], None], name: str) -> None:
    """Run one command; output into a pipe that closed early (`stats | head -1`) ends it quietly, and so does
    Ctrl-C, SIGTERM or SIGHUP: what the command started is stopped on the way out, one line, exit 130."""
    try:
        with stopped_like_ctrl_c():
            run()
        sys.stdout.flush()
    except KeyboardInterrupt:
        print(f"{name}: interrupted; what it started is stopped", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # what is still buffered cannot be written: send it nowhere, so the interpreter's own flush at exit
        # does not raise again (the recipe of Python's `signal` documentation)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
