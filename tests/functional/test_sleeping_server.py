"""Servers that sleep: the real llama.cpp unloads its model after an idle second (`--sleep-idle-seconds`); the
proxy reads that it sleeps, wakes it on the first keystroke after a break with one request no keystroke cancels,
says so, and never keeps it awake. (How much sooner the pause's text comes is measured in `benchmarks breaks`.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS, UPSTREAMS, build_app
from mellum_proxy.http.server import serve_app
from mellum_proxy.upstream.embedded import EmbeddedServer

pytestmark = pytest.mark.embedded
TEXT = "def load(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef save(path, text):\n    with "


@pytest.fixture(scope="module")
def sleepy_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(ctx_tokens=1024, slots=2, sleep_idle_s=1)
    server.start()
    yield server
    server.stop()


async def is_sleeping(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url + "/props") as resp:
        return bool((await resp.json())["is_sleeping"])


async def keystroke(session: aiohttp.ClientSession, url: str, prefix: str) -> str:
    body = {"prompt": prefix, "max_tokens": 8, "stream": True}
    text = []
    async with session.post(url + "/v1/completions", json=body, headers={"X-Session-Id": "typist"}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                text.append(orjson.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


async def test_a_keystroke_after_a_break_wakes_the_sleeping_server_once_and_it_sleeps_again(
    sleepy_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert sleepy_server.url is not None
    app = build_app(Settings(upstream=sleepy_server.url, log=None, health_interval_ms=100, timeout_ms=20000))
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        async with serve_app(app) as proxy, aiohttp.ClientSession() as session:
            member = app[UPSTREAMS].members[0]
            for brk in range(2):
                await app[UPSTREAMS].changes.wait_for(lambda: member.sleep.asleep, timeout_s=20)  # the watch saw it
                assert await is_sleeping(session, sleepy_server.url)
                typing = []
                for end in range(4):  # keystrokes while it wakes: each supersedes the one before
                    typing.append(asyncio.create_task(keystroke(session, proxy, TEXT[: 60 + 2 * end])))
                    await asyncio.sleep(0.05)  # the pace of the keystrokes, not a synchronisation
                await asyncio.gather(*typing)
                kept = app[RECORDS]
                records = sorted(list(kept)[-4:], key=lambda record: record.received_at)
                assert records[-1].outcome == "ok" and records[-1].reached_upstream  # the pause, after the wake
                assert all(record.wake_ms is not None for record in records)  # each met the wake
                assert member.sleep.wakes == brk + 1  # one wake for the whole burst
            await app[UPSTREAMS].changes.wait_for(lambda: member.sleep.asleep, timeout_s=20)  # not kept awake
            assert await is_sleeping(session, sleepy_server.url)
    said = caplog.messages
    assert sum("is asleep" in message for message in said) == 3, said  # before each burst, and after the last
    assert sum("woke in" in message for message in said) == 2, said


async def test_the_proxy_does_not_keep_an_idle_server_awake(sleepy_server: EmbeddedServer) -> None:
    """Its health checks, sleep reads and identity checks ask nothing that counts as a task."""
    assert sleepy_server.url is not None
    app = build_app(Settings(upstream=sleepy_server.url, log=None, health_interval_ms=50))
    async with serve_app(app), aiohttp.ClientSession() as session:
        member = app[UPSTREAMS].members[0]
        await app[UPSTREAMS].changes.wait_for(lambda: member.sleep.asleep, timeout_s=20)
        checks = app[UPSTREAMS]._checks
        await app[UPSTREAMS].changes.wait_for(lambda: app[UPSTREAMS]._checks >= checks + 20, timeout_s=20)
        assert await is_sleeping(session, sleepy_server.url) and member.sleep.asleep  # twenty health checks later


async def prompt_tokens_computed(session: aiohttp.ClientSession, url: str) -> float:
    """llama.cpp's count of the prompt tokens it has computed (`/metrics` neither wakes it nor keeps it awake)."""
    async with session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("llamacpp:prompt_tokens_total "):
                return float(line.split()[1])
    raise AssertionError("no llamacpp:prompt_tokens_total on /metrics")


async def test_the_prompt_cache_saved_before_a_sleep_is_restored_by_the_wake(sleepy_server: EmbeddedServer) -> None:
    """Once its idle limit is known, the prompt caches are saved in the quiet after a completion; the wake after the
    sleep restores them, so the keystroke after the break computes only what was typed since, not its whole prompt
    again (the embedded server saves into a folder of its own)."""
    assert sleepy_server.url is not None
    app = build_app(Settings(upstream=sleepy_server.url, log=None, health_interval_ms=100, timeout_ms=20000))
    prompt = TEXT * 8  # about 300 tokens: a prefill that would show
    async with serve_app(app) as proxy, aiohttp.ClientSession() as session:
        member = app[UPSTREAMS].members[0]
        changes = app[UPSTREAMS].changes
        assert await keystroke(session, proxy, TEXT)
        await changes.wait_for(lambda: member.sleep.asleep, timeout_s=20)  # its idle limit learned from the quiet
        assert member.sleep.idle_limit_s is not None
        assert await keystroke(session, proxy, prompt)  # the wake, then the answer
        await changes.wait_for(lambda: member.sleep.saved, timeout_s=20)  # saved in the quiet
        await changes.wait_for(lambda: member.sleep.asleep, timeout_s=20)  # and it still slept
        before = await prompt_tokens_computed(session, sleepy_server.url)
        assert await keystroke(session, proxy, prompt + "x")
        computed = await prompt_tokens_computed(session, sleepy_server.url) - before
        assert member.sleep.restored >= 1
        assert computed < 20, computed  # the typed character and a little, not ~300 tokens
