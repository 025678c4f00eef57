"""`FaultUpstream`: an OpenAI-compatible completion server that misbehaves on purpose.

Each request is answered by one named fault from `FAULTS`: the server's default `fault`, or the one
a prompt names with a `[fault:NAME]` marker (so one run can mix them: `benchmarks soak`). The faults are
the ways real servers and networks have failed a completion: errors before and after the first
event, dropped connections, stalls, events of the wrong shape, oversized or split events, a JSON
answer to a streamed request. It counts what it served and how many clients went away early. A
test that must see the first event reach its client before the fault sets `after_first` (an
`asyncio.Event`) and opens it once it has.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

from aiohttp import web

from mellum_proxy.dialects.openai import DONE, sse, text_completion
from mellum_proxy.tuning.sim.responder import Responder, answering, routes

FAULTS: dict[str, str] = {
    "ok": "a normal stream of a few events",
    "status_500": "HTTP 500 with an OpenAI error body",
    "status_503_text": "HTTP 503 with a plain-text body",
    "drop_before_headers": "the connection closes before any answer",
    "drop_after_first": "the first event, then the connection closes",
    "error_event_after_first": "the first event, then an `error` event (llama.cpp's mid-stream report)",
    "garbage_after_first": "the first event, then an event that is not JSON",
    "choices_object": "an event whose `choices` is an object",
    "choices_number": "an event whose `choices` is a number",
    "usage_string": "the last event's `usage` is a string",
    "timings_not_numbers": "the last event's llama.cpp `timings` values are strings",
    "usage_not_numbers": "the last event's `usage` token counts are strings",
    "huge_event": "one event of 600 KiB",
    "multiline_data": "an event split over two `data:` lines",
    "json_answer": "a JSON body although `stream: true` was asked",
    "stall_before_headers": "no answer at all until the client gives up",
    "stall_after_first": "the first event, then silence",
    "stall_after_headers": "the answer's status and headers, then silence",
    "slow_first": "the answer's headers at once, its first event after 2 s",
    "empty_stream": "200 and an event stream that ends without an event",
    "done_only": "200 and an event stream of `data: [DONE]` alone",
    "no_done": "the stream ends without `[DONE]`",
    "invalid_utf8": "an event whose text holds bytes that are not UTF-8",
    "html_answer": "a 200 answer in text/html",
}

SLOW_FIRST_S = 2.0
_MARKER = re.compile(r"\[fault:([a-z0-9_]+)\]")


class FaultUpstream:
    def __init__(self, fault: str = "ok", tokens: int = 3) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.fault = fault
        self.tokens = tokens
        self.after_first: asyncio.Event | None = None  # when set: each answer waits for it after its first event
        self.served: Counter[str] = Counter()
        self.disconnects = 0
        self.active = 0

    def app(self) -> web.Application:
        return routes({"POST /v1/completions": self._completions, "POST /v1/chat/completions": self._completions,
                       "GET /v1/models": self._models, "GET /health": answering({"status": "ok"}),
                       "GET /props": answering({"total_slots": 4})})  # fmt: skip

    def fault_for(self, payload: dict[str, Any]) -> str:
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            messages = payload.get("messages") or [{}]
            prompt = str(messages[-1].get("content", "")) if isinstance(messages[-1], dict) else ""
        found = _MARKER.search(prompt)
        return found.group(1) if found and found.group(1) in FAULTS else self.fault

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if self.fault == "stall_before_headers":
            await asyncio.Event().wait()
        return web.json_response({"object": "list", "data": [{"id": "fault", "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        fault = self.fault_for(payload)
        self.served[fault] += 1
        self.active += 1
        try:
            return await self._answer(request, fault)
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        except ConnectionResetError:  # the proxy dropped the request (its client went away): expected
            self.disconnects += 1
            return web.Response(status=499)
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request, fault: str) -> web.StreamResponse:
        answer = Responder(request, {"stream": True}, f"fault-{sum(self.served.values())}", "fault")
        event = answer.event

        if fault == "status_500":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if fault == "status_503_text":
            return web.Response(status=503, text="Service Unavailable: loading model")
        if fault == "stall_before_headers":
            await asyncio.Event().wait()
        if fault == "drop_before_headers":
            _drop(request)
            return web.Response()
        if fault == "json_answer":
            usage = {"prompt_tokens": 3, "completion_tokens": 2}
            return web.json_response(text_completion(answer.ident, answer.created, "fault", "t0 t1 ", "length", usage))
        if fault == "html_answer":
            return web.Response(text="<html>hello</html>", content_type="text/html")
        await answer.start()
        response = answer.response
        assert response is not None
        if fault == "stall_after_headers":
            await asyncio.Event().wait()
        if fault in ("empty_stream", "done_only"):
            await response.write(DONE if fault == "done_only" else b": nothing\n\n")
            await response.write_eof()
            return response
        if fault == "slow_first":
            await asyncio.sleep(SLOW_FIRST_S)
        await response.write(event("t0 "))
        if self.after_first is not None:
            await self.after_first.wait()  # a test reads the first event through the proxy first
        if fault == "drop_after_first":
            _drop(request)
            return response
        if fault == "stall_after_first":
            await asyncio.Event().wait()
        bad = {
            "error_event_after_first": sse(
                {"error": {"code": 500, "message": "decode failed", "type": "server_error"}}
            ),
            "garbage_after_first": b"data: this is not json\n\n",
            "choices_object": b'data: {"choices": {"text": "x"}}\n\n',
            "choices_number": b'data: {"choices": 3}\n\n',
            "huge_event": event("x" * (600 * 1024)),
            "multiline_data": b'data: {"choices": [{"text": "t1 ",\ndata:  "finish_reason": null}]}\n\n',
            "invalid_utf8": b'data: {"choices": [{"text": "t1 \xff\xfe", "finish_reason": null}]}\n\n',
        }
        if fault in bad:
            await response.write(bad[fault])
        for i in range(1, self.tokens):
            await response.write(event(f"t{i} "))
        counts: Any = {"prompt_tokens": 3, "completion_tokens": self.tokens}
        extra: dict[str, Any] = {"usage": counts}
        if fault == "usage_string":
            extra = {"usage": "three"}
        elif fault == "usage_not_numbers":
            extra = {"usage": {"prompt_tokens": "3", "completion_tokens": "x"}}
        elif fault == "timings_not_numbers":
            extra["timings"] = {"prompt_n": "3", "prompt_ms": "fast", "predicted_n": 2, "predicted_ms": "slow"}
        await response.write(event("", "length", **extra))
        if fault != "no_done":
            await response.write(DONE)
        await response.write_eof()
        return response


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def captive_portal() -> web.Application:
    """Every path answered 200 with an HTML page, as a captive portal or a gateway's login page does: an
    upstream that looks up and is no model server."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>Please sign in to the network</body></html>", content_type="text/html")

    return routes({"* /{tail:.*}": page})


class SilentServer:
    """A server that accepts connections and never says a word (a hung process, a black-holing firewall)."""

    def __init__(self) -> None:
        self.held: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.url

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held.append(writer)

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.held:
            writer.close()
        if self.server is not None:
            self.server.close()
