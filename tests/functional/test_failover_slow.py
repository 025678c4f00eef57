"""Members that are slow but healthy: failover judges a member by its own recent first answers, and fails over only
when the next one can still answer within what is left of the deadline (a primary at 0.6 s was failed over again
and again under a 1.5 s deadline, to a fallback at 1.2 s that could not answer in time: empty answers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mellum_proxy.config import Settings
from mellum_proxy.errors import UpstreamTimeoutError
from mellum_proxy.http import RECORDS, UPSTREAMS
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.failover import Member, Upstreams
from tests.conftest import ProxyFactory

BODY = {"prompt": "def f(", "suffix": ")"}


@pytest.mark.slow  # seconds of real time
async def test_a_slow_primary_that_answers_within_the_deadline_keeps_serving(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    _primary, primary_url = await fake_upstream(first_token_delay_s=0.6, slots=8)
    _fallback, fallback_url = await fake_upstream(first_token_delay_s=1.2, slots=8)
    proxy = await make_proxy(upstream=[primary_url, fallback_url], tokenizer="chars", reuse=False)
    assert Settings().timeout_ms == 1500

    async def one(n: int) -> tuple[str, str | None]:
        resp = await proxy.post("/v1/completions", json=BODY, headers={"X-Session-Id": f"editor-{n}"})
        text = (await resp.json())["choices"][0]["text"]
        record = next(r for r in proxy.app[RECORDS] if r.id == resp.headers["X-Request-Id"])
        return text, record.upstream

    requests = []
    for n in range(30):
        requests.append(asyncio.create_task(one(n)))
        await asyncio.sleep(0.2)  # the pace of the requests, as the run sent them
    answers = await asyncio.gather(*requests)
    assert all(text for text, _ in answers), answers  # none emptied by a failover
    assert sum(served == fallback_url for _, served in answers) <= 3
    assert proxy.app[UPSTREAMS].members[0].up


def pool(timeout_s: float) -> Upstreams:
    clients = [UpstreamClient(None, f"http://127.0.0.1:{port}") for port in (1, 2)]  # type: ignore[arg-type]
    return Upstreams(clients, failover_answer_s=timeout_s / 3, timeout_s=timeout_s)


def answered(member: Member, *seconds: float) -> None:
    for value in seconds:
        member.answered(value)


def test_the_wait_leaves_the_next_member_what_it_needs_or_does_not_fail_over() -> None:
    upstreams = pool(1.5)
    first, second = upstreams.members
    assert upstreams.wait_s(first, second, 0.0) == 1.0  # nothing known: a third of the deadline for the next
    answered(second, 0.2, 0.2, 0.2)
    assert abs((upstreams.wait_s(first, second, 0.0) or 0) - 1.1) < 1e-9  # the next needs twice its median
    answered(second, 1.2, 1.2, 1.2, 1.2)
    assert upstreams.wait_s(first, second, 0.0) is None  # it could not answer in what would be left: no failover
    answered(first, 0.6, 0.6, 0.6)
    assert upstreams.wait_s(first, second, 0.0) is None
    assert upstreams.wait_s(second, None, 0.0) is None  # the last one: its own answer timeout


def test_one_timeout_of_a_member_that_answers_does_not_take_it_down_two_do() -> None:
    member = pool(1.5).members[0]
    timeout = UpstreamTimeoutError("slow")
    assert member.looks_down(timeout)  # it never answered: down
    answered(member, 0.3, 0.3, 0.3)
    member.timeouts.clear()
    assert not member.looks_down(timeout)  # one slow request among answers
    assert member.looks_down(timeout)  # a second of its last four


def test_strikes_are_shed_only_after_several_answers_in_a_row() -> None:
    member = pool(1.5).members[0]
    member.strikes = 3
    member.answered(0.1)
    member.answered(0.1)
    assert member.strikes == 3  # one or two answers are no evidence yet
    member.answered(0.1)
    assert member.strikes == 0
