"""The simulated server's timing as `mellum-proxy profile` measures a real one: a cost per prompt token paid cached
or not, each request's own luck (`spread`), and the slower start of a server a moment idle (`idle_slowdown`)."""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import replace

import pytest

from mellum_proxy.planning.profile import _overhead, spread
from mellum_proxy.tuning.sim.engine import SimEngine
from mellum_proxy.tuning.sim.server import PROFILES
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from tests.virtual_time import run_virtual

ONE = replace(PROFILES["embedded-cpu"], slots=2, overhead_ms=10, batch_penalty=0, decode_tps=100)  # 10 ms a token


def took(spec: ServerProfile, prompts: list[str], seed: int = 0, tokens: int = 4) -> list[float]:
    """Each prompt sent alone, one after another: its time from submit to done (virtual seconds)."""

    async def run() -> list[float]:
        engine, times = SimEngine(spec, seed=seed), []
        loop = asyncio.get_running_loop()
        for prompt in prompts:
            started = loop.time()
            task = engine.submit(prompt, tokens, "abcdefghijklmnop")
            await task.changes.wait_for(lambda task=task: task.done, timeout_s=math.inf)  # type: ignore[misc]
            times.append(loop.time() - started)
        return times

    return run_virtual(run())


def test_without_spread_or_idle_slowdown_every_request_takes_the_same() -> None:
    times = took(ONE, ["x"] * 5)
    assert max(times) - min(times) < 1e-9


def test_a_cost_for_each_prompt_token_is_paid_even_when_the_prompt_is_cached() -> None:
    spec = replace(ONE, overhead_per_token_ms=0.1)
    short, long = took(spec, ["x" * 33] * 2), took(spec, ["x" * 3300] * 2)
    assert long[1] - short[1] == pytest.approx((1000 - 10) * 0.1 / 1000, rel=0.02)  # both cached the second time


def test_each_request_has_its_own_luck_and_a_seed_repeats_it() -> None:
    spec = replace(ONE, spread=0.2)
    times = took(spec, ["x"] * 200)
    assert took(spec, ["x"] * 200) == times  # the same seed: the same run
    assert took(spec, ["x"] * 200, seed=1) != times
    base = took(ONE, ["x"])[0]
    assert statistics.median(times) == pytest.approx(base, rel=0.1)
    assert spread([t * 1000 for t in times]) == pytest.approx(0.2, rel=0.25)  # measured as the profile does


def test_a_request_that_finds_the_server_idle_runs_slower_one_beside_another_does_not() -> None:
    spec = replace(ONE, idle_slowdown=1.5)
    (alone,) = took(spec, ["x"])
    assert alone == pytest.approx(1.5 * took(ONE, ["x"])[0], rel=1e-3)  # virtual time counts in µs

    async def together() -> float:
        engine = SimEngine(spec)
        first = engine.submit("x", 16, "abcdefghijklmnop")
        await asyncio.sleep(0.02)  # virtual: the first is decoding
        second = engine.submit("y", 4, "abcdefghijklmnop")
        started = asyncio.get_running_loop().time()
        await second.changes.wait_for(lambda: second.done, timeout_s=math.inf)
        assert not first.done
        return asyncio.get_running_loop().time() - started

    assert run_virtual(together()) == pytest.approx(took(ONE, ["y"])[0], rel=1e-3)  # the server was busy: no slow start


def test_the_overhead_is_the_line_through_the_cached_first_tokens_less_one_decode_step() -> None:
    rows = [{"prompt_tokens": n, "cached_ms": 8.0 + 0.01 * n, "cold_ms": 0.0} for n in (100, 400, 800, 1600)]
    fixed, per_token = _overhead(rows, decode_tps=250)  # a decode step: 4 ms
    assert fixed == pytest.approx(4.0) and per_token == pytest.approx(0.01)
    flat = [{"prompt_tokens": n, "cached_ms": 9.0, "cold_ms": 0.0} for n in (100, 400)]
    fixed, per_token = _overhead(flat, decode_tps=250)  # no growth seen: all of it fixed
    assert fixed == pytest.approx(5.0) and per_token == 0.0


def test_decode_time_is_counted_as_llama_cpp_counts_it_first_token_to_last_cancelled_tasks_too() -> None:
    """`tokens_predicted_seconds_total` runs from a task's first token to its last, and a task whose client left
    counts the tokens it made (measured on the embedded server: 12 tokens of a stream left after 10)."""

    async def run() -> tuple[float, int, int]:
        engine = SimEngine(replace(ONE, overhead_ms=0, spread=0, idle_slowdown=1), seed=0)
        whole = engine.submit("a", 4, "abcdefghijklmnop")
        await whole.changes.wait_for(lambda: whole.done, timeout_s=math.inf)
        left = engine.submit("b", 4, "abcdefghijklmnop")
        await left.changes.wait_for(lambda: len(left.pieces) == 2, timeout_s=math.inf)
        left.leave()
        await engine.idle()
        return engine.decode_seconds, engine.tokens_predicted, len(left.pieces)

    seconds, tokens, made = run_virtual(run())
    assert 2 <= made < 4 and tokens == 4 + made  # the one left stopped at its next token
    assert seconds == pytest.approx((4 - 1) * 0.010 + (made - 1) * 0.010)  # each: the steps after its first token
