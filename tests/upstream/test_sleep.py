"""`Sleep` in virtual time: what the health watch reads, the idle limit it learns, and one wake for a burst of
keystrokes that no cancelled keystroke cuts short."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from mellum_proxy.errors import UpstreamError, UpstreamStatusError, UpstreamTimeoutError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest
from mellum_proxy.observe import Changes
from mellum_proxy.upstream.sleep import Sleep
from tests.virtual_time import run_virtual

LOAD_S = 1.5
REQUEST = NormalizedRequest(id="r", route="openai", session="s", prefix="def f(")
PROMPT = BudgetedPrompt("def f(", None, 16, (), 3, 3, False, "bytes")


@dataclass
class SleepyServer:
    """A server kind whose model sleeps when told, and loads in `LOAD_S` when woken."""

    sleeping: bool = False
    woken: int = 0
    saves: list[float] = field(default_factory=list)  # when the prompt caches were saved
    restores: int = 0
    save_slots: Any = None  # as a kind that cannot save them (`SavingServer` can)
    restore_slots: Any = None

    async def asleep(self, client: Any) -> bool:
        return self.sleeping

    async def wake(self, client: Any) -> None:
        self.woken += 1
        await asyncio.sleep(LOAD_S)
        self.sleeping = False


@dataclass
class SavingServer(SleepyServer):
    """llama.cpp with `--slot-save-path`: its prompt caches saved, and restored by the wake."""

    def __post_init__(self) -> None:
        self.save_slots, self.restore_slots = self._save, self._restore

    failures: list[UpstreamError] = field(default_factory=list)  # what the next saves meet, in turn

    async def _save(self, client: Any) -> int:
        assert not self.sleeping, "a save wakes a sleeping server"
        self.saves.append(asyncio.get_running_loop().time())
        if self.failures:
            raise self.failures.pop(0)
        return 2

    async def _restore(self, client: Any) -> int:
        self.restores += 1
        return 2


@dataclass
class Client:
    kind: SleepyServer = field(default_factory=SleepyServer)
    shown_url: str = "http://127.0.0.1:8080"


def test_a_burst_of_keystrokes_after_a_break_makes_one_wake_that_no_cancel_cuts() -> None:
    async def scenario() -> None:
        client: Any = Client()
        sleep, changes = Sleep(), Changes()
        loop = asyncio.get_running_loop()
        assert await sleep.awake(client, REQUEST, PROMPT, changes) is None  # awake: nothing to wait for
        await asyncio.sleep(3.0)
        client.kind.sleeping = True
        await sleep.read(client, changes)  # the health watch
        assert sleep.asleep and sleep.idle_limit_s == 3.0  # learned from the quiet before it slept
        first = asyncio.create_task(sleep.awake(client, REQUEST, PROMPT, changes))
        await asyncio.sleep(0.2)
        second = asyncio.create_task(sleep.awake(client, REQUEST, PROMPT, changes))
        await asyncio.sleep(0.2)
        first.cancel()  # superseded by the next keystroke: the wake goes on
        started = loop.time()
        waited = await second
        assert loop.time() - started == pytest.approx(LOAD_S - 0.4) and waited == pytest.approx((LOAD_S - 0.2) * 1000)
        assert client.kind.woken == 1 and sleep.wakes == 1 and sleep.last_wake_s == LOAD_S and not sleep.asleep
        assert await sleep.awake(client, REQUEST, PROMPT, changes) is None  # awake again

    run_virtual(scenario())


def test_a_quiet_past_the_learned_idle_limit_wakes_it_before_the_watch_has_looked() -> None:
    async def scenario() -> None:
        client: Any = Client()
        sleep, changes = Sleep(), Changes()
        sleep.says, sleep.idle_limit_s = True, 2.0
        await sleep.awake(client, REQUEST, PROMPT, changes)
        await asyncio.sleep(2.5)  # slept meanwhile; the next health check has not come yet
        assert await sleep.awake(client, REQUEST, PROMPT, changes) == pytest.approx(LOAD_S * 1000)
        assert client.kind.woken == 1

    run_virtual(scenario())


def test_a_kind_that_cannot_say_is_never_asked_again_nor_woken() -> None:
    async def scenario() -> None:
        client: Any = Client()
        sleep, changes = Sleep(), Changes()

        async def cannot_say(_: Any) -> None:
            return None

        client.kind.asleep = cannot_say
        await sleep.read(client, changes)
        assert sleep.says is False
        await asyncio.sleep(600.0)
        assert await sleep.awake(client, REQUEST, PROMPT, changes) is None and client.kind.woken == 0

    run_virtual(scenario())


def test_prompt_caches_are_saved_in_the_quiet_before_the_sleep_and_restored_by_the_wake() -> None:
    async def scenario() -> None:
        client: Any = Client(SavingServer())
        sleep, changes = Sleep(), Changes()
        sleep.says, sleep.idle_limit_s = True, 4.0  # learned late, by a health check: the server sleeps after 2 s
        loop = asyncio.get_running_loop()
        sleep.answered(client, loop.time(), changes)
        await asyncio.sleep(0.5)
        sleep.answered(client, loop.time(), changes)  # typing on: the quiet starts again
        ended = loop.time()
        await changes.wait_for(lambda: sleep.saved, timeout_s=10)
        assert client.kind.saves == [pytest.approx(ended + 1.0)]  # a quarter of the idle limit after the last one
        client.kind.sleeping = True
        await sleep.read(client, changes)
        assert await sleep.awake(client, REQUEST, PROMPT, changes) == pytest.approx(LOAD_S * 1000)
        assert client.kind.restores == 1 and sleep.restored == 2
        sleep.answered(client, loop.time(), changes)
        client.kind.sleeping = True  # asleep before the save was due (the health watch has not looked)
        await asyncio.sleep(5.0)
        assert len(client.kind.saves) == 1  # not asked: a save would have woken it

    run_virtual(scenario())


def test_a_save_that_failed_once_is_tried_again_and_only_a_refusal_stops_the_asking() -> None:
    async def scenario() -> None:
        refusal = UpstreamStatusError(501, "This server does not support slots action")
        server = SavingServer(failures=[UpstreamTimeoutError("late"), UpstreamStatusError(503, "loading"), refusal])
        client: Any = Client(server)
        sleep, changes = Sleep(), Changes()
        sleep.says, sleep.idle_limit_s = True, 4.0
        loop = asyncio.get_running_loop()

        def tried(times: int) -> Callable[[], bool]:
            return lambda: sleep._saving is None and len(server.saves) == times

        for times in (1, 2):  # a timeout, then a server still loading: the next quiet asks again
            sleep.answered(client, loop.time(), changes)
            await changes.wait_for(tried(times), timeout_s=10)
            assert sleep.saves is None
        sleep.answered(client, loop.time(), changes)
        await changes.wait_for(lambda: sleep.saves is not None, timeout_s=10)
        assert sleep.saves is False and len(server.saves) == 3  # llama-server without --slot-save-path: 501
        sleep.answered(client, loop.time(), changes)
        await asyncio.sleep(5.0)
        assert len(server.saves) == 3  # not asked again

    run_virtual(scenario())
