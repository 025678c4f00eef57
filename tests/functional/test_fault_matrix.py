"""The fault matrix: every upstream fault of `benchmarks.doubles.fault_upstream` through every completion
dialect, streamed and not, and through the pass-through chat route.

Each cell asserts what the editor gets (status, the dialect's own error shape or a stream that ends
in the dialect's own way), what the record and the log line say, and that the next request is
served. A fault "after the first event" is made to come after the client has read that event.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from benchmarks.doubles.fault_upstream import FAULTS, FaultUpstream
from mellum_proxy.http import RECORDS, TELEMETRY
from mellum_proxy.telemetry.stats import read_log
from tests.conftest import ProxyFactory
from tests.shapes import SHAPES

pytestmark = pytest.mark.slow  # seconds of real time: in `make test`, not in `make test-fast`

BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"prompt": "def f(", "suffix": ")"},
    "/infill": {"input_prefix": "def f(", "input_suffix": ")"},
    "/completion": {"prompt": "def f("},
    "/api/generate": {"prompt": "def f(", "suffix": ")", "model": "m"},
}

MID = "mid"  # streamed: 200, an error event, then the dialect's end; not streamed: a 502
# fault -> (status, outcome) of a completion request, or MID
EXPECTED: dict[str, tuple[int, str] | str] = {
    "ok": (200, "ok"),
    "status_500": (502, "upstream_error"),
    "status_503_text": (503, "upstream_error"),
    "drop_before_headers": (502, "upstream_error"),
    "drop_after_first": MID,
    "error_event_after_first": MID,
    "garbage_after_first": MID,
    "choices_object": MID,
    "choices_number": MID,
    "usage_string": MID,
    "timings_not_numbers": MID,
    "usage_not_numbers": MID,
    "huge_event": (200, "ok"),
    "multiline_data": (200, "ok"),
    "json_answer": (200, "ok"),
    "stall_before_headers": (200, "timeout"),
    "stall_after_first": (200, "timeout"),
    "stall_after_headers": (200, "timeout"),
    "slow_first": (200, "timeout"),
    "empty_stream": (502, "upstream_error"),  # an answer with nothing in it is the server's failure, said
    "done_only": (502, "upstream_error"),
    "no_done": (200, "ok"),
    "invalid_utf8": MID,
    "html_answer": (502, "upstream_error"),
}


def test_every_fault_has_an_expectation() -> None:
    assert set(EXPECTED) == set(FAULTS)


def parse_events(path: str, body: bytes) -> list[Any]:
    """A streamed answer's events (dicts, or "[DONE]"), SSE or Ollama's JSON lines."""
    events: list[Any] = []
    for line in body.splitlines():
        line = line.removeprefix(b"data: ").strip()
        if line:
            events.append("[DONE]" if line == b"[DONE]" else orjson.loads(line))
    return events


def ends_in_dialect(path: str, events: list[Any]) -> bool:
    """The last word of a stream, in the dialect's own way."""
    if path == "/v1/completions":
        return events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] is not None
    if path == "/api/generate":
        return events[-1].get("done") is True
    return events[-1].get("stop") is True


def completion_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/completions":
        return str(body["choices"][0]["text"])
    return str(body["response"] if path == "/api/generate" else body["content"])


def tabby_reads(event: Any) -> bool:
    """Tabby's llama.cpp backend (crates/http-api-bindings/src/completion/llama.rs) `unwrap`s each event
    as `CompletionResponseChunk {content: String, stop: bool}`."""
    return isinstance(event, dict) and isinstance(event.get("content"), str) and isinstance(event.get("stop"), bool)


def has_error_event(events: list[Any]) -> bool:
    return any(isinstance(event, dict) and "error" in event for event in events)


async def ask(proxy: TestClient[Any, Any], fake: FaultUpstream, path: str, stream: bool) -> tuple[int, bytes]:
    """One request; a streamed one reads the first line before the upstream goes on past its first event."""
    gate = fake.after_first = asyncio.Event()
    if not stream:
        gate.set()
    async with proxy.post(path, json=BODIES[path] | {"stream": stream}) as resp:
        if not stream or resp.status != 200:
            gate.set()
            return resp.status, await resp.read()
        first = await resp.content.readline()
        gate.set()
        return resp.status, first + await resp.read()


async def served_next(proxy: TestClient[Any, Any], fake: FaultUpstream) -> bool:
    fault, fake.fault, fake.after_first = fake.fault, "ok", None
    try:
        resp = await proxy.post("/v1/completions", json={"prompt": "x"})
        return resp.status == 200 and (await resp.json())["choices"][0]["text"] == "t0 t1 t2 "
    finally:
        fake.fault = fault


async def logged(proxy: TestClient[Any, Any]) -> list[dict[str, Any]]:
    sink = proxy.app[TELEMETRY].log
    assert sink is not None
    await sink.flushed()
    return read_log(sink.path)[0]


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_fault_through_every_dialect(
    fault: str, make_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    fake = FaultUpstream(fault)
    upstream = await aiohttp_server(fake.app())
    proxy = await make_proxy(
        upstream=str(upstream.make_url("")), timeout_ms=300, tokenizer="chars", max_concurrency=4, reuse=False,
        log=tmp_path / "requests.jsonl",
    )  # fmt: skip
    expected = EXPECTED[fault]
    for path in BODIES:
        for stream in (False, True):
            cell = (fault, path, stream)
            status, body = await ask(proxy, fake, path, stream)
            record = proxy.app[RECORDS].last()
            if expected == MID:
                want_status, want_outcome = (200 if stream else 502), "upstream_error"
            else:
                assert isinstance(expected, tuple)
                want_status, want_outcome = expected
            assert status == want_status, (cell, body[-300:])
            assert record.outcome == want_outcome, cell
            if status >= 400:
                assert SHAPES[path](orjson.loads(body), status), (cell, body)
            elif want_outcome == "ok" and not stream:
                text = completion_text(path, orjson.loads(body))
                assert text.startswith("t0 ") and len(text) > 3, (cell, body[-300:])  # more than the first event
            elif stream:
                events = parse_events(path, body)
                assert ends_in_dialect(path, events), (cell, body[-300:])
                assert has_error_event(events) == (expected == MID), (cell, body[-300:])
                if path in ("/infill", "/completion"):  # Tabby reads every event as {content, stop}, or panics
                    assert all(tabby_reads(event) for event in events), (cell, body[-300:])
            assert await served_next(proxy, fake), cell
            line = (await logged(proxy))[-2]  # the cell's own line, before the next request's
            assert (line["id"], line["outcome"]) == (record.id, want_outcome), cell


@pytest.mark.parametrize("fault", ["ok", "status_500", "status_503_text", "drop_before_headers", "drop_after_first",
                                   "stall_before_headers", "stall_after_first"])  # fmt: skip
async def test_fault_through_the_chat_pass_through(fault: str, make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
    fake = FaultUpstream(fault)
    upstream = await aiohttp_server(fake.app())
    proxy = await make_proxy(upstream=str(upstream.make_url("")), passthrough_timeout_ms=300, tokenizer="chars")
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    fake.after_first = gate = asyncio.Event()
    async with proxy.post("/v1/chat/completions", json=chat) as resp:
        if resp.status == 200:
            first = await resp.content.readline()
            gate.set()
            body = first + await resp.read()
        else:
            gate.set()
            body = await resp.read()
    want = {"status_500": 502, "status_503_text": 503, "drop_before_headers": 502, "stall_before_headers": 504}
    assert resp.status == want.get(fault, 200), body
    if resp.status == 200:
        events = parse_events("/v1/completions", body)
        assert events[-1] == "[DONE]"  # never a second response inside the body
        assert has_error_event(events) == (fault in ("drop_after_first", "stall_after_first")), body
    else:
        assert SHAPES["/v1/completions"](orjson.loads(body), resp.status)
    models = await proxy.get("/v1/models")  # the other forwarded route, under the same deadline
    assert models.status == (504 if fault == "stall_before_headers" else 200)
    assert await served_next(proxy, fake)
