"""The policies through HTTP against a controllable fake upstream (deterministic, no model)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.http import POLICIES, RECORDS
from tests.conftest import ProxyFactory
from tests.sse import collect_text, events
from tests.virtual_time import Answer, proxy_before, run_virtual


def records(proxy: Any) -> Any:
    return proxy.app[RECORDS]


def outcomes(proxy: Any) -> list[str]:
    return [record.outcome.value for record in proxy.app[RECORDS]]


def test_burst_of_twenty_yields_one_upstream_request() -> None:
    async def main() -> tuple[FakeUpstream, list[Answer]]:
        fake = FakeUpstream()
        async with proxy_before(fake.app(), debounce_ms=150) as proxy:
            tasks = []
            for i in range(20):
                body = {"prompt": f"x{i}"}
                tasks.append(asyncio.create_task(proxy.post("/v1/completions", body, {"X-Session-Id": "ed"})))
                await asyncio.sleep(0.01)  # keystrokes 10 ms apart (virtual time: exactly)
            return fake, await asyncio.gather(*tasks)

    fake, answers = run_virtual(main())
    assert len(fake.payloads) == 1
    assert fake.payloads[0]["prompt"] == "x19"  # the newest request is the one computed
    texts = [(a.status, a.outcome, a.body["choices"][0]["text"]) for a in answers]
    assert texts[-1] == (200, "ok", "t0 t1 t2 t3 ")
    assert texts[:-1] == [(200, "debounced", "")] * 19


def test_two_sessions_keep_their_own_windows() -> None:
    async def main() -> FakeUpstream:
        fake = FakeUpstream(slots=2)
        async with proxy_before(fake.app(), debounce_ms=150) as proxy:
            tasks = []
            for i in range(10):
                session = "a" if i % 2 == 0 else "b"
                body = {"prompt": f"{session}{i}"}
                tasks.append(asyncio.create_task(proxy.post("/v1/completions", body, {"X-Session-Id": session})))
                await asyncio.sleep(0.01)
            await asyncio.gather(*tasks)
        return fake

    assert sorted(p["prompt"] for p in run_virtual(main()).payloads) == ["a8", "b9"]


async def test_newer_request_cancels_a_running_stream(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream(tokens=400, token_delay_s=0.02)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0)
    old = await proxy.post("/v1/completions", json={"prompt": "old", "stream": True})
    seen = []
    async for event in events(old):
        seen.append(event)
        if len(seen) == 3:
            break
    newer = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "new", "max_tokens": 2}))
    rest = [event async for event in events(old)]
    assert rest[-1] == "[DONE]"
    assert (
        isinstance(rest[-2], dict) and rest[-2]["choices"][0]["finish_reason"] == "length"
    )  # cut: a normal end, but not a complete one
    await fake.wait_until(lambda f: f.disconnects == 1)  # the upstream saw the connection drop
    assert (await (await newer).json())["choices"][0]["text"] == "t0 t1 "
    await records(proxy).changes.wait_for(lambda: len(records(proxy)) == 2)
    assert outcomes(proxy) == ["cancelled", "ok"]


async def test_two_anonymous_editors_on_two_files_do_not_cancel_each_other(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """llama.vim in two windows: both curl, no session id. Each file is a session of its own, while a keystroke
    in one file still supersedes that file's request."""
    fake, url = await fake_upstream(tokens=2, slots=4)
    fake.gate = asyncio.Event()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, tokenizer="chars", reuse=False)
    curl = {"User-Agent": "curl/8.5.0"}
    files = {
        "a": "import os\n\ndef load(path):\n    with open(path) as f:\n        return f.read()\n\ndef ",
        "b": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, world")\n}\n\nfunc ',
    }

    def infill(name: str, typed: str) -> Any:
        body = {"input_prefix": files[name], "input_suffix": "\n", "prompt": typed, "n_predict": 8}
        return asyncio.create_task(proxy.post("/infill", json=body, headers=curl))

    first_a, first_b = infill("a", "sa"), infill("b", "ad")
    await fake.wait_until(lambda f: f.active == 2)
    second_a = infill("a", "sav")  # supersedes the first in file a only
    await fake.wait_until(lambda f: len(f.payloads) == 3)
    fake.gate.set()
    for task in (first_a, first_b, second_a):
        assert (await task).status == 200
    await records(proxy).changes.wait_for(lambda: len(records(proxy)) == 3)
    by_prompt = {r.prompt_chars: r.outcome for r in records(proxy)}
    assert sorted(by_prompt.values()) == ["cancelled", "ok", "ok"]
    assert len({r.session for r in records(proxy)}) == 2


async def test_newer_request_cancels_a_non_stream_one_before_any_token(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream()
    fake.gate = asyncio.Event()  # the upstream holds every request before its first token
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0)
    old = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "old"}))
    await fake.wait_until(lambda f: f.active == 1)
    newer = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "new"}))
    resp = await old
    assert resp.status == 200
    assert resp.headers["X-Mellum-Outcome"] == "cancelled"
    assert (await resp.json())["choices"][0] == {
        "text": "",
        "index": 0,
        "logprobs": None,
        "finish_reason": "stop",
    }
    await fake.wait_until(lambda f: f.disconnects == 1)
    fake.gate.set()
    assert (await newer).headers["X-Mellum-Outcome"] == "ok"


async def test_queue_never_exceeds_its_bound(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream()
    fake.gate = asyncio.Event()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, max_concurrency=1, max_queue=2)
    admission = proxy.app[POLICIES].admission

    def post(i: int) -> asyncio.Task[Any]:
        return asyncio.create_task(
            proxy.post("/v1/completions", json={"prompt": str(i)}, headers={"X-Session-Id": str(i)})
        )

    running = post(0)
    await fake.wait_until(lambda f: f.active == 1)
    queued = [post(1), post(2)]
    await admission.changes.wait_for(lambda: admission.depth == 2)
    refused = [await post(3), await post(4)]  # answered at once, while the queue is full
    assert [r.headers["X-Mellum-Outcome"] for r in refused] == ["queue_full", "queue_full"]
    assert [(await r.json())["choices"][0]["text"] for r in refused] == ["", ""]
    fake.gate.set()
    done = await asyncio.gather(running, *queued)
    assert [r.headers["X-Mellum-Outcome"] for r in done] == ["ok", "ok", "ok"]
    assert fake.max_active == 1
    assert admission.max_depth_seen == 2
    assert [p["prompt"] for p in fake.payloads] == ["0", "1", "2"]  # FIFO


async def test_concurrency_defaults_to_the_upstream_slots(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    _, url = await fake_upstream(slots=3)
    proxy = await make_proxy(upstream=url)
    assert proxy.app[POLICIES].admission.limit == 3
    _, url = await fake_upstream(slots=None)
    proxy = await make_proxy(upstream=url)
    assert proxy.app[POLICIES].admission.limit == 1


async def test_first_token_deadline(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream(first_token_delay_s=30)
    proxy = await make_proxy(upstream=url, debounce_ms=0, ttft_timeout_ms=200, timeout_ms=0, keep_prefill=False)
    resp = await proxy.post("/v1/completions", json={"prompt": "x"})
    assert resp.headers["X-Mellum-Outcome"] == "timeout"
    assert (await resp.json())["choices"][0]["finish_reason"] == "length"
    await fake.wait_until(lambda f: f.disconnects == 1)


async def test_a_timed_out_request_may_finish_its_prefill(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    """Answered at the deadline, but the upstream request goes on to its first token (the prompt cache
    is then warm for the next keystroke) and stops there."""
    fake, url = await fake_upstream(first_token_delay_s=0.5, tokens=1000, token_delay_s=0.01)
    proxy = await make_proxy(upstream=url, debounce_ms=0, ttft_timeout_ms=100, timeout_ms=0, keep_prefill=True)
    resp = await proxy.post("/v1/completions", json={"prompt": "x"})
    assert resp.headers["X-Mellum-Outcome"] == "timeout"
    assert fake.disconnects == 0  # still prefilling
    await fake.wait_until(lambda f: f.disconnects == 1)
    assert 0 < fake.sent_tokens < 1000


async def test_total_deadline_returns_the_text_so_far(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream(tokens=1000, token_delay_s=0.01)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=300)
    resp = await proxy.post("/v1/completions", json={"prompt": "x", "stream": True})
    text, seen = await collect_text(resp)
    assert text.startswith("t0 t1 ")
    assert len(text.split()) < 1000
    assert isinstance(seen[-2], dict) and seen[-2]["choices"][0]["finish_reason"] == "length"
    await fake.wait_until(lambda f: f.disconnects == 1)
    await records(proxy).changes.wait_for(lambda: len(records(proxy)) == 1)
    assert outcomes(proxy) == ["timeout"]


async def test_queue_wait_counts_against_the_deadline(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream()
    fake.gate = asyncio.Event()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=300, max_concurrency=1)
    # The slot holder is a warm-up (max_tokens 0): it has no deadline, so it cannot free the slot before
    # the queued request's deadline passes, however slow the machine. (A completion holder timed out
    # first, at its own 300 ms, and on a loaded machine handed the slot on in time.)
    holder = {"prompt": "a", "max_tokens": 0}
    first = asyncio.create_task(proxy.post("/v1/completions", json=holder, headers={"X-Session-Id": "a"}))
    await fake.wait_until(lambda f: f.active == 1)
    second = await proxy.post("/v1/completions", json={"prompt": "b"}, headers={"X-Session-Id": "b"})
    assert second.headers["X-Mellum-Outcome"] == "timeout"
    assert len(fake.payloads) == 1  # it timed out in the queue, never reaching the upstream
    fake.gate.set()
    assert (await first).headers["X-Mellum-Outcome"] == "ok"
    timed_out = [r for r in records(proxy) if r.outcome == "timeout"]
    assert len(timed_out) == 1 and timed_out[0].reached_upstream is False


async def test_client_gone_while_queued_never_reaches_the_upstream(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream()
    fake.gate = asyncio.Event()
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0, max_concurrency=1)
    admission = proxy.app[POLICIES].admission
    first = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "a"}, headers={"X-Session-Id": "a"}))
    await fake.wait_until(lambda f: f.active == 1)
    gone = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "b"}, headers={"X-Session-Id": "b"}))
    await admission.changes.wait_for(lambda: admission.depth == 1)
    gone.cancel()  # the editor closes the connection
    await admission.changes.wait_for(lambda: admission.depth == 0)
    await records(proxy).changes.wait_for(lambda: len(records(proxy)) == 1)
    fake.gate.set()
    await first
    assert [p["prompt"] for p in fake.payloads] == ["a"]
    assert outcomes(proxy) == ["client_gone", "ok"]


async def test_client_gone_while_streaming_aborts_the_upstream(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream(tokens=1000, token_delay_s=0.01)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=0)
    resp = await proxy.post("/v1/completions", json={"prompt": "x", "stream": True})
    await anext(events(resp))
    resp.close()
    await fake.wait_until(lambda f: f.disconnects == 1)
    await records(proxy).changes.wait_for(lambda: len(records(proxy)) == 1)
    assert outcomes(proxy) == ["client_gone"]
    admission = proxy.app[POLICIES].admission
    await admission.changes.wait_for(lambda: admission.running == 0)  # once the server has let it go


@pytest.mark.parametrize("stream", [False, True])
async def test_debounced_answer_in_the_clients_shape(
    make_proxy: ProxyFactory, fake_upstream: Any, stream: bool
) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, debounce_ms=300)
    first = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "a", "stream": stream}))
    debouncer = proxy.app[POLICIES].debouncer
    await debouncer.changes.wait_for(lambda: debouncer.held() == 1)
    second = asyncio.create_task(proxy.post("/v1/completions", json={"prompt": "b", "stream": stream}))
    resp = await first
    assert resp.status == 200
    assert resp.headers["X-Mellum-Outcome"] == "debounced"
    if stream:
        text, seen = await collect_text(resp)
        assert (text, seen[-1]) == ("", "[DONE]")
    else:
        assert (await resp.json())["choices"][0]["text"] == ""
    await second


@pytest.mark.parametrize("stream", [False, True])
async def test_a_completion_cut_at_the_deadline_counts_what_it_generated(
    make_proxy: ProxyFactory, fake_upstream: Any, stream: bool
) -> None:
    """The upstream's usage never came (the proxy closed the stream at the deadline): llama.cpp's answer still
    counts the tokens shown, not `tokens_predicted: 0` after real text."""
    _, url = await fake_upstream(tokens=100, stall_after=3)
    proxy = await make_proxy(upstream=url, debounce_ms=0, timeout_ms=1000, tokenizer="chars")  # room on busy cores
    resp = await proxy.post("/infill", json={"input_prefix": "x = ", "input_suffix": "\n", "stream": stream})
    if stream:
        sent = [orjson.loads(line[6:]) for line in (await resp.read()).splitlines() if line.startswith(b"data: ")]
        final, content = sent[-1], "".join(event["content"] for event in sent)
    else:
        final = await resp.json()
        content = final["content"]
    assert content == "t0 t1 t2 " and final["stop"] is True
    assert final["tokens_predicted"] == 3 and final["timings"]["predicted_n"] == 3
