"""`bench replay` counts the tokens of an answer that came without `usage` (ended early by the proxy) with
the server's own tokenizer, so a cleaned completion's shown tokens are not counted as waste; and it reads the
server's own decode time a token from its counters."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mellum_proxy.tuning.runners.replay import count_unmetered
from mellum_proxy.tuning.workloads.editor import RequestResult


@pytest.mark.embedded
async def test_an_answer_without_usage_is_counted_by_the_server(embedded_server: Any) -> None:
    cleaned = RequestResult(0, "a.py", 0.0, status=200, text="return a + b")
    metered = RequestResult(1, "a.py", 0.0, status=200, text="return a * b", completion_tokens=7)
    empty = RequestResult(2, "a.py", 0.0, status=200, text="")
    async with aiohttp.ClientSession() as session:
        await count_unmetered(session, embedded_server.url, [cleaned, metered, empty])
        async with session.post(embedded_server.url + "/tokenize", json={"content": "return a + b"}) as resp:
            expected = len((await resp.json())["tokens"])
    assert cleaned.completion_tokens == expected > 0
    assert metered.completion_tokens == 7 and empty.completion_tokens == 0


async def test_a_server_that_cannot_count_leaves_it_at_zero(fake_upstream: Any) -> None:
    _, url = await fake_upstream()
    cleaned = RequestResult(0, "a.py", 0.0, status=200, text="return a + b")
    async with aiohttp.ClientSession() as session:
        await count_unmetered(session, url, [cleaned])
    assert cleaned.completion_tokens == 0


@pytest.mark.embedded
async def test_the_servers_decode_time_a_token_comes_from_its_own_counters(embedded_server: Any) -> None:
    """llama.cpp's `tokens_predicted_seconds_total` over `tokens_predicted_total`, read before and after the run:
    what `benchmarks calibrate` holds the lab's decode speed to."""
    from mellum_proxy.tuning.runners.policy import parse_policy
    from mellum_proxy.tuning.runners.replay import run_policy
    from tests.bench.bursts import burst_trace

    result = await run_policy(parse_policy("direct"), burst_trace()[:6], embedded_server.url, max_tokens=4)
    assert result.upstream_completion_tokens and result.decode_ms_per_token is not None
    assert 0 < result.decode_ms_per_token < 10_000


async def test_a_server_without_the_counters_has_no_decode_time(fake_upstream: Any) -> None:
    from mellum_proxy.tuning.runners.policy import parse_policy
    from mellum_proxy.tuning.runners.replay import run_policy
    from tests.bench.bursts import burst_trace

    _, url = await fake_upstream()
    result = await run_policy(parse_policy("direct"), burst_trace()[:3], url, max_tokens=4)
    assert result.decode_ms_per_token is None


def test_counters_that_went_back_give_no_decode_time() -> None:
    """A server restarted between the readings before and after a run: its counters start again at 0."""
    from mellum_proxy.tuning.reporting.results import ms_per_token

    assert ms_per_token(0.5, 100) == 5.0
    assert ms_per_token(-3.0, -600) is None and ms_per_token(0.5, -10) is None and ms_per_token(None, 100) is None
