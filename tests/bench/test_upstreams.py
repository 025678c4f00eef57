"""The bench's servers: what a request's context is, asked the way the proxy asks it."""

from __future__ import annotations

from typing import Any

import pytest

from mellum_proxy.bench.runners.upstreams import context_limit


@pytest.mark.embedded
async def test_the_context_of_a_request_is_what_the_servers_kind_says(embedded_server: Any) -> None:
    assert await context_limit(embedded_server.url) == 2048  # llama.cpp: 4096 over 2 slots, from its /props


async def test_a_server_that_says_no_context_gives_none(sim_url: str) -> None:
    assert await context_limit(sim_url) is None  # the simulator's /props says only its slots
