"""Quiet under churn: editors that leave while their answer waits or is written are `client_gone` records, not
tracebacks (3,980 of them, 8.2 MB of stderr, in two minutes of such load)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS
from mellum_proxy.http.app import build_app
from mellum_proxy.http.server import serve_app

pytestmark = pytest.mark.slow


async def test_clients_that_leave_cost_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeUpstream(tokens=20, token_delay_s=0.005, first_token_delay_s=0.05, slots=4)
    requests, answered = 120, []
    with caplog.at_level(logging.WARNING):
        async with serve_app(fake.app()) as upstream:
            app = build_app(Settings(upstream=(upstream,), tokenizer="chars", log=None, max_concurrency=1,
                                     max_queue=256))  # fmt: skip
            async with serve_app(app) as proxy, aiohttp.ClientSession() as session:

                async def one(i: int) -> None:
                    body = {"prompt": f"x{i}", "stream": i % 2 == 0}
                    leaves_after = None if i % 5 == 0 else 0.01 * (1 + i % 40)  # a fifth stay to the end
                    try:  # the others leave at their own moment: queued, waiting, streaming, or being answered
                        async with asyncio.timeout(leaves_after):
                            async with session.post(proxy + "/v1/completions", json=body,
                                                    headers={"X-Session-Id": f"s{i}"}) as resp:  # fmt: skip
                                await resp.read()
                        answered.append(i)
                    except TimeoutError:
                        pass

                await asyncio.gather(*(one(i) for i in range(requests)))
                records = app[RECORDS]
                await records.changes.wait_for(lambda: len(records) >= len(answered), timeout_s=30)
                assert answered and sum(r.outcome != "client_gone" for r in records) >= len(answered)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors][:3]


async def test_an_answer_written_to_an_editor_that_left_is_client_gone_and_quiet(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case the churn above meets by chance, made certain: the editor is gone when its answer is written."""
    from aiohttp.client_exceptions import ClientConnectionResetError

    from mellum_proxy.http.answer import HttpAnswer

    async def gone(self: HttpAnswer, completion: object, outcome: object) -> None:
        raise ClientConnectionResetError("Cannot write to closing transport")

    monkeypatch.setattr(HttpAnswer, "finish", gone)
    fake = FakeUpstream(tokens=2)
    with caplog.at_level(logging.WARNING):
        async with serve_app(fake.app()) as upstream:
            app = build_app(Settings(upstream=(upstream,), tokenizer="chars", log=None))
            async with serve_app(app) as proxy, aiohttp.ClientSession() as session:
                async with session.post(proxy + "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                    await resp.read()  # here the connection is whole: only the answer's writer says it is gone
                records = app[RECORDS]
                await records.changes.wait_for(lambda: len(records) == 1, timeout_s=10)
                assert records.last().outcome == "client_gone"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
