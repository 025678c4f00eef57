"""Each server kind is one module and one registry line: a kind of the test's own, registered, is taken by the
setting, told apart by its probe, discovered, completed through its own wire, and said in its own flags."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pydantic
import pytest
from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS
from mellum_proxy.models import BudgetedPrompt, Chunk, NormalizedRequest
from mellum_proxy.upstream.servers import KINDS, Found, Memory, ServerKind, Transport, kind_named, register
from mellum_proxy.upstream.servers.startup_log import StartupLog
from tests.conftest import ProxyFactory


class LineWire:
    """A made-up server: `POST /line/complete` with `{"text"}`, answering JSON lines `{"piece", "last"}`."""

    path = "/line/complete"
    answers_at_once = True

    def body(self, request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None,
             defaults: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        return {"text": prompt.prompt, "limit": prompt.max_tokens}

    async def read(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[Chunk]]:
        async for line in resp.content:
            event = orjson.loads(line)
            yield [Chunk(event["piece"], "stop" if event["last"] else None)]


async def discover_line(upstream: Transport) -> Found:
    info = await upstream.get_json("/line/info")
    return Found("line", info["model"], info["context"], info["slots"])


async def count_line_slots(upstream: Transport) -> int | None:
    return int((await upstream.get_json("/line/info"))["slots"])


def read_line_log(report: StartupLog, line: str) -> None:
    if line.startswith("line-server: weights "):
        report.backend, report.weights_bytes = "line", int(line.split()[-1])
        report.facts["cells"] = 640


LINE = ServerKind(
    name="line", title="Line server", discover=discover_line, wire=LineWire(),
    probe=("/line/info", lambda answer: isinstance(answer, dict) and answer.get("server") == "line"),
    count_slots=count_line_slots, start_flags=lambda context, batch, kv: f"line-server --ctx {context} -n {batch}",
    memory=Memory(2.25, read_line_log, lambda facts, text: (facts["cells"], 1), command_words=("line-server",)),
)  # fmt: skip


@pytest.fixture
def line_kind() -> Iterator[ServerKind]:
    before = list(KINDS)
    register(LINE)
    yield LINE
    KINDS[:] = before


def line_server() -> tuple[web.Application, list[dict[str, Any]]]:
    asked: list[dict[str, Any]] = []

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"server": "line", "model": "line-1", "context": 777, "slots": 3})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def complete(request: web.Request) -> web.StreamResponse:
        asked.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "application/jsonl"})
        await resp.prepare(request)
        for piece, last in (("return ", False), ("a + b", True)):
            await resp.write(orjson.dumps({"piece": piece, "last": last}) + b"\n")
        return resp

    app = web.Application()
    app.router.add_get("/line/info", info)
    app.router.add_get("/health", health)
    app.router.add_post("/line/complete", complete)
    return app, asked


def test_the_setting_takes_a_registered_kind_and_only_known_ones(line_kind: ServerKind) -> None:
    assert Settings(upstream_kind="line").upstream_kind == "line"
    assert kind_named("line") is line_kind
    with pytest.raises(pydantic.ValidationError, match="auto or one of"):
        Settings(upstream_kind="lime")
    assert KINDS[-1].name == "openai"  # the fallback stays last: detection tries the new kind before it


def test_the_planning_tools_plan_for_a_registered_kind_from_its_own_facts(line_kind: ServerKind) -> None:
    """`sweep --backend line` takes its overhead, `inspect-log` reads its lines, `fit --server-cmd` knows its
    command: nothing of the planning tools names a kind."""
    from mellum_proxy.cli import build_parser
    from mellum_proxy.planning.fit import _kind_started_by
    from mellum_proxy.planning.logs import parse_log
    from mellum_proxy.planning.sweep import SweepSpec, overhead_gib

    assert overhead_gib(SweepSpec(24, ("q8",), (4096,), (1,), backend="line")) == 2.25
    found = parse_log("loading\nline-server: weights 1234\n")
    assert (found.backend, found.weights_bytes) == ("line", 1234)
    assert _kind_started_by("line-server --model m.gguf") == "line"
    args = build_parser().parse_args(["sweep", "--total-b", "4", "--gpu-gib", "24", "--backend", "line"])
    assert args.backend == "line"


async def test_a_registered_kind_is_detected_discovered_and_completed_through(
    line_kind: ServerKind, make_proxy: ProxyFactory, aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app, asked = line_server()
    server = await aiohttp_server(app)
    with caplog.at_level(logging.INFO, "mellum_proxy"):
        proxy = await make_proxy(upstream=str(server.make_url("")), debounce_ms=0, fim_template="prefix")
        resp = await proxy.post("/v1/completions", json={"prompt": "def add(a, b):\n    ", "max_tokens": 8})
        body = await resp.json()
    assert resp.status == 200 and body["choices"][0]["text"] == "return a + b"
    assert asked == [{"text": "def add(a, b):\n    ", "limit": 8}]
    assert any("kind line, model line-1, 777 tokens per request, 3 slots" in m for m in caplog.messages)
    record = proxy.app[RECORDS].last()
    assert record.outcome == "ok" and record.reached_upstream and record.inflight is not None
