"""A guard or a hold rule is one module and one registration: a guard of the test's own, registered, ends the
requests it stops before they are admitted, with its outcome in the record; a hold rule of its own is chosen by the
`dispatch` setting and holds each request as it says. The shipped comment guard and the adaptive and fixed rules are
the same kinds of thing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS
from mellum_proxy.models import NormalizedRequest, Outcome
from mellum_proxy.policies import GUARDS, HOLDS, GuardKind, HoldKind, build_guards, register, register_hold
from tests.conftest import ProxyFactory


class NoTodo:
    """Stops a completion whose line before the cursor says TODO (a made-up guard)."""

    def stops(self, request: NormalizedRequest) -> Outcome | None:
        return Outcome.SKIPPED if "TODO" in request.prefix.rpartition("\n")[2] else None


@pytest.fixture
def no_todo() -> Iterator[GuardKind]:
    before = list(GUARDS)
    kind = GuardKind("no-todo", lambda settings: NoTodo())
    register(kind)
    yield kind
    GUARDS[:] = before


@pytest.mark.usefixtures("no_todo")
async def test_a_registered_guard_ends_what_it_stops_before_admission(
    make_proxy: ProxyFactory, fake_upstream: Callable[..., Awaitable[tuple[Any, str]]]
) -> None:
    fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=0, tokenizer="chars")
    stopped = await proxy.post("/v1/completions", json={"prompt": "x = 1  # TODO", "suffix": "", "max_tokens": 4})
    assert stopped.status == 200 and (await stopped.json())["choices"][0]["text"] == ""
    assert proxy.app[RECORDS].last().outcome == "skipped" and fake.payloads == []
    passed = await proxy.post("/v1/completions", json={"prompt": "x = 1\n", "suffix": "", "max_tokens": 4})
    assert passed.status == 200 and proxy.app[RECORDS].last().outcome == "ok" and len(fake.payloads) == 1


def test_the_comment_guard_is_built_only_when_its_setting_asks() -> None:
    assert [type(g).__name__ for g in build_guards(Settings())] == []
    assert [type(g).__name__ for g in build_guards(Settings(complete_in_comments=False))] == ["InCommentOrString"]


class Steady:
    """A made-up hold rule: every request held 40 ms, whatever the load."""

    reads_load = False

    def hold_for(self, request: NormalizedRequest, busy: bool) -> float:
        return 0.04


@pytest.fixture
def steady() -> Iterator[HoldKind]:
    before = list(HOLDS)
    kind = HoldKind("steady", lambda settings, clock: Steady())
    register_hold(kind)
    yield kind
    HOLDS[:] = before


@pytest.mark.usefixtures("steady")
async def test_a_registered_hold_rule_is_chosen_by_the_dispatch_setting_and_holds(
    make_proxy: ProxyFactory, fake_upstream: Callable[..., Awaitable[tuple[Any, str]]]
) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, dispatch="steady", tokenizer="chars")
    resp = await proxy.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 4})
    assert resp.status == 200
    record = proxy.app[RECORDS].last()
    assert record.outcome == "ok" and record.debounce_ms is not None and record.debounce_ms >= 39
    with pytest.raises(ValueError, match="unknown dispatch 'stedy'"):
        Settings(dispatch="stedy")
