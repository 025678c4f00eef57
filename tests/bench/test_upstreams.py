"""The bench's servers: what a request's context is, asked the way the proxy asks it."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.upstreams import upstream_for as benchmark_upstream_for
from mellum_proxy.proc import thread_ids
from mellum_proxy.tuning.runners.upstreams import context_limit, upstream_for


@pytest.mark.embedded
async def test_the_context_of_a_request_is_what_the_servers_kind_says(embedded_server: Any) -> None:
    assert await context_limit(embedded_server.url) == 2048  # llama.cpp: 4096 over 2 slots, from its /props


async def test_a_server_that_says_no_context_gives_none(sim_url: str) -> None:
    assert await context_limit(sim_url) is None  # the simulator's /props says only its slots


@pytest.mark.embedded
def test_the_embedded_server_knows_its_own_threads(embedded_server: Any) -> None:
    assert embedded_server.thread_ids & thread_ids()  # what `--pin-server` pins (a few may have ended since)


async def test_pinning_a_server_not_embedded_is_one_line(sim_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        async with upstream_for(sim_url, pin_server=True):
            pytest.fail("a server in another process cannot be pinned from here")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and "--upstream embedded" in err


async def test_the_benchmarks_add_the_fast_model_and_say_so_when_pinning_another(
    sim_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        async with benchmark_upstream_for(sim_url, pin_server=True):
            pytest.fail("a server in another process cannot be pinned from here")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and "--upstream embedded or fast" in err
