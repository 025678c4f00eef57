"""`Sleep`: a model server that unloads its model when idle, as the proxy sees it, and its wakes.

Servers that sleep (llama.cpp's `--sleep-idle-seconds`, Ollama's `keep_alive`, vLLM's sleep mode) unload their
model when idle. The health watch reads it from the serving one (`read`: its kind's `asleep`, which neither
wakes it nor keeps it awake) and learns its idle limit from the quiet before it slept. The first completion after
a quiet that long, or to a server found asleep, wakes it (`awake`) with the kind's cheapest request: for llama.cpp
a prefill-only completion of that prompt, so the model is loaded and the prompt cached by the time the person
pauses. The wake runs in a task of its own, which no later keystroke cancels; the completions that come meanwhile
wait for it in the proxy, each superseded by the next as usual, instead of queueing at a server that cannot start
them (each cancelled one then held a slot until the server let go of it: the pause's request timed out). The
proxy never keeps a sleeping server awake: it asks only when the person types.

A server whose kind can save its slots' prompt caches (llama.cpp with `--slot-save-path`; the embedded server has
one) has them saved once the typing has been quiet for a quarter of its idle limit as learned (at most
`SAVE_QUIET_MAX_S`; the limit is learned from a health check that found it asleep, so later than it was), and the
wake restores them before its prefill: the prompt the person left is cached again by the time the model is loaded,
and the prefill is the few tokens typed since (a wake and its prefill took 1.9 s for gemma-3-270m on one thread
here; the load and the restore 0.7 s, and the prefill after it 50 ms). The save is a task for the server: it sleeps
that much later (an idle limit of 2 s, learned as 4 s, becomes 3 s; 300 s, 305 s). A server already asleep (its
kind's own reading, just before) is not asked: the save would wake it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from mellum_proxy.errors import UpstreamError, UpstreamStatusError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest
from mellum_proxy.observe import Changes
from mellum_proxy.upstream.client import UpstreamClient

log = logging.getLogger("mellum_proxy")

SAVE_QUIET_MAX_S = 5.0  # the longest quiet before a sleeping server's prompt caches are saved


@dataclass(slots=True)
class Sleep:
    """What the health watch read of one server's sleep, what the proxy learned of its idle limit, its wakes."""

    asleep: bool = False
    says: bool | None = None  # whether its kind can say (None: not asked yet)
    last_used: float | None = None  # the loop's time of the last completion sent to it, or ended
    idle_limit_s: float | None = None  # the shortest quiet after which it was found asleep
    waking: asyncio.Task[float] | None = None
    wakes: int = 0
    last_wake_s: float | None = None  # how long its last wake took
    woke_at: float | None = None  # unix seconds
    saves: bool | None = None  # whether it saves its prompt caches across a sleep (None: not tried yet)
    saved: bool = False  # they are saved, for the next wake to restore
    restored: int = 0  # slots restored by the last wake
    _save_at: asyncio.TimerHandle | None = None
    _saving: asyncio.Task[None] | None = None

    def status(self) -> dict[str, Any]:
        """Its part of `/status`' upstream entry."""
        return {
            "asleep": self.asleep,
            "waking": self.waking is not None,
            "idle_limit_s": None if self.idle_limit_s is None else round(self.idle_limit_s, 1),
            "wakes": self.wakes,
            "last_wake_s": None if self.last_wake_s is None else round(self.last_wake_s, 3),
            "woke_at": None if self.woke_at is None else round(self.woke_at, 3),
            "saves_cache": self.saves,
            "restored_slots": self.restored,
        }

    async def awake(
        self, client: UpstreamClient, request: NormalizedRequest, prompt: BudgetedPrompt, changes: Changes,
        reveal: bool = False,
    ) -> float | None:  # fmt: skip
        """Before a completion is sent: wake the server if it sleeps (found asleep, or quiet longer than its
        learned idle limit) and wait for the wake, in progress or begun here; the milliseconds this request
        waited for it, or None when there was no wake to wait for. Cancelling the wait leaves the wake going."""
        if self.says is False and self.waking is None:
            return None  # its kind cannot say it sleeps: nothing to learn or wake (and nothing more on the hot path)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.waking is None:
            quiet = None if self.last_used is None else now - self.last_used
            overdue = self.idle_limit_s is not None and quiet is not None and quiet > self.idle_limit_s
            self.last_used = now
            if not (self.asleep or overdue):
                return None
            self.waking = asyncio.create_task(self._wake(client, request, prompt, quiet, changes, reveal),
                                              name="upstream-wake")  # fmt: skip
            changes.notify()
        await asyncio.shield(self.waking)
        return (loop.time() - now) * 1000

    async def _wake(
        self, client: UpstreamClient, request: NormalizedRequest, prompt: BudgetedPrompt, quiet: float | None,
        changes: Changes, reveal: bool,
    ) -> float:  # fmt: skip
        """Load its model with the kind's cheapest request (without a wake of its own: a prefill-only completion of
        `prompt`); how long that took (said once it is done)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if not self.asleep:  # found by the quiet alone: said now
            log.info("upstream %s has been idle %.0f s, past its %.0f s idle limit: waking it", client.shown_url,
                     quiet or 0.0, self.idle_limit_s or 0.0)  # fmt: skip
        try:
            restore = client.kind.restore_slots
            if self.saved and restore is not None:  # the prompt left before the sleep, cached again
                self.restored = await restore(client)
            if client.kind.wake is not None:
                await client.kind.wake(client)
            else:
                await _prefill(client, replace(request, id=f"{request.id}-wake", max_tokens=0),
                               replace(prompt, max_tokens=0))  # fmt: skip
        except UpstreamError as error:
            log.info("upstream %s: the wake-up request failed (%s)", client.shown_url,
                     error.message if reveal else error.shown)  # fmt: skip
        finally:
            took = loop.time() - started
            self.asleep, self.waking, self.last_used = False, None, loop.time()
            self.wakes, self.last_wake_s, self.woke_at = self.wakes + 1, took, time.time()
            changes.notify()
        restored = f"; {self.restored} slot prompt caches restored" if self.restored else ""
        log.info("upstream %s woke in %.2f s (the model loaded after %s of quiet%s)", client.shown_url, took,
                 "an unknown time" if quiet is None else f"{quiet:.1f} s", restored)  # fmt: skip
        return took

    def answered(self, client: UpstreamClient, at: float, changes: Changes) -> None:
        """A completion ended at the loop's time `at`: once the typing has been quiet for a quarter of the learned
        idle limit (at most `SAVE_QUIET_MAX_S`), the server's prompt caches are saved for its next wake, where its
        kind can (a newer completion starts the quiet again)."""
        self.last_used = at
        if self._save_at is not None:
            self._save_at.cancel()
            self._save_at = None
        if client.kind.save_slots is None or self.saves is False or self.idle_limit_s is None:
            return
        quiet = min(SAVE_QUIET_MAX_S, self.idle_limit_s / 4)  # the limit is learned late by a health check
        self._save_at = asyncio.get_running_loop().call_later(quiet, self._save, client, changes)

    def _save(self, client: UpstreamClient, changes: Changes) -> None:
        self._save_at = None
        if self._saving is None and not self.asleep and self.waking is None:
            self._saving = asyncio.create_task(self._saved(client, changes), name="upstream-save-caches")

    async def _saved(self, client: UpstreamClient, changes: Changes) -> None:
        save, asleep = client.kind.save_slots, client.kind.asleep
        assert save is not None
        try:
            if asleep is not None and await asleep(client) is not False:
                return  # asleep already (or it cannot say): a save would wake it, and save an empty cache
            slots = await save(client)
        except UpstreamError as error:
            if not _refused(error):  # a timeout, a restart, a 503: the next quiet asks again
                log.debug("upstream %s: its prompt caches were not saved this time (%s)", client.shown_url, error.shown)
                return
            self.saves = False  # asked once: a server without a place to save says so every time
            log.info("upstream %s does not save its prompt caches across a sleep (%s): each wake computes the "
                     "prompt again; llama-server keeps them with --slot-save-path DIR", client.shown_url,
                     error.shown)  # fmt: skip
        else:
            self.saves = self.saved = True
            log.debug("upstream %s: %d slot prompt caches saved for its next wake", client.shown_url, slots)
        finally:
            self._saving = None
            changes.notify()

    async def close(self) -> None:
        """Stop a save that is due or running (at shutdown: the session it uses closes next)."""
        if self._save_at is not None:
            self._save_at.cancel()
        if self._saving is not None:
            self._saving.cancel()
            await asyncio.gather(self._saving, return_exceptions=True)

    async def read(self, client: UpstreamClient, changes: Changes) -> None:
        """What the server's kind says of its sleep (a health check), said on the console when it falls asleep."""
        asleep_of = client.kind.asleep
        if asleep_of is None or self.says is False or self.waking is not None:
            return
        asleep = await asleep_of(client)
        if asleep is None:
            self.says = self.says or False  # never said: not asked again; said once: a hiccup
            return
        self.says = True
        if asleep and not self.asleep:
            self.asleep = True
            now = asyncio.get_running_loop().time()
            quiet = None if self.last_used is None else now - self.last_used
            if quiet is not None and quiet > 0:
                self.idle_limit_s = quiet if self.idle_limit_s is None else min(self.idle_limit_s, quiet)
            after = "" if quiet is None else f" after {quiet:.0f} s without a completion"
            log.info("upstream %s is asleep (its model unloaded%s): the next keystroke wakes it", client.shown_url,
                     after)  # fmt: skip
            changes.notify()
        elif not asleep and self.asleep:
            self.asleep = False  # woken by someone else
            changes.notify()


def _refused(error: UpstreamError) -> bool:
    """The server answered that it cannot save (llama.cpp without `--slot-save-path`: 501; a 4xx), as it will every
    time; not a failure of this once (no answer, a timeout, a 503 while loading, a 500)."""
    if not isinstance(error, UpstreamStatusError):
        return False
    return error.upstream_status == 501 or 400 <= error.upstream_status < 500


async def _prefill(client: UpstreamClient, request: NormalizedRequest, prompt: BudgetedPrompt) -> None:
    """A prefill-only completion, waiting as long as the model takes to load."""
    async with aclosing(client.stream_completion(request, prompt, loading=True)) as batches:
        async for _ in batches:
            pass
