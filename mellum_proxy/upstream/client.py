"""`UpstreamClient`: the proxy's one connection to a model server, the transport under each server kind.

Completions go through the kind's wire (`servers/`), always streamed, so the proxy sees the first token and stops
the server by closing the connection. Every response comes through `open()`: a 4xx/5xx becomes an
`UpstreamStatusError`, and on any exception (cancellation too) the response is `close()`d, so the server aborts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from mellum_proxy.errors import UpstreamProtocolError
from mellum_proxy.models import Batches, BudgetedPrompt, NormalizedRequest
from mellum_proxy.upstream.errors import status_error, translate_errors
from mellum_proxy.upstream.holding import Holding
from mellum_proxy.upstream.servers import GENERIC, ServerKind, kind_named
from mellum_proxy.upstream.servers.ollama import KEEP_ALIVE
from mellum_proxy.upstream.servers.openai import model_ids
from mellum_proxy.urls import redact_url

if TYPE_CHECKING:  # the section is only read: the client loads no settings (nor the budget the settings name)
    from mellum_proxy.sections import UpstreamSection

_JSON = {"Content-Type": "application/json"}
# Completions ahead of everything else where the upstream schedules by priority (vLLM `--scheduling-policy
# priority`: lower values first; a request without one is 0) and where it is an llm-d gateway (its SLO ordering).
COMPLETION_PRIORITY = -10
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"


class UpstreamClient:
    """HTTP client for one upstream base URL over a shared `aiohttp.ClientSession`, configured by its section."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, section: UpstreamSection | None = None) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact_url(self.base_url)  # for messages, `/status` and `/health`: no credentials
        s = section  # None: a bare client (the commands' probes), every knob at its default
        self.kind: ServerKind = kind_named(s.kind) if s and s.kind != "auto" else GENERIC  # or discovery's
        self.model = s.model if s else None  # the model every completion names (`--upstream-model`, or found)
        # parameters sent when the client sends none: `default_temperature`, and the completions' priority
        temperature = s.default_temperature if s else None
        self.defaults: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
        if s and s.priority:
            self.defaults["priority"] = COMPLETION_PRIORITY
        self.routing_header = s.routing_header if s else None  # a router's sticky-routing header
        self.developer_id, self.route_sessions = (s.developer_id, s.route_sessions) if s else ("", False)
        # The longest a completion's answer may take to start (its status and headers): a server that sends them
        # before its prefill and stays silent this long is down. None: no limit but the request's deadline.
        self.answer_timeout_s = s.answer_timeout_s if s else None
        self.lane_hints = {SLO_TTFT_HEADER: str(s.slo_ttft_ms)} if s and s.slo_ttft_ms is not None else {}  # llm-d
        self.keep_alive = s.keep_alive if s else None  # Ollama's, where the kind takes it
        self.holding = Holding(self)
        self.reconnected = False  # a pooled connection turned out closed since the health watch last looked

    def routing(self, request: NormalizedRequest | None = None) -> dict[str, str]:
        """The routing-key header for a request (the developer's, or its session's), or none."""
        if self.routing_header is None:
            return {}
        return {self.routing_header: request.session if self.route_sessions and request else self.developer_id}

    async def held(self) -> int | None:  # requests the server holds now, running and queued (`Holding`)
        return await self.holding.held()

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        return await self.holding.let_go(accept, timeout_s)

    def url(self, path: str) -> str:
        return self.base_url + path

    @asynccontextmanager
    async def open(self, method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None,
                   limit: aiohttp.ClientTimeout | None = None,
                   answer_s: float | None = None) -> AsyncIterator[aiohttp.ClientResponse]:  # fmt: skip
        """An upstream response whose status is below 400, closed (socket dropped) on any error; transport errors
        while the caller reads the body are translated too. `answer_s` bounds the wait for status and headers.

        Raises:
            UpstreamError: the upstream is unreachable, timed out or answered 4xx/5xx.
        """
        options: dict[str, Any] = {"data": data, "headers": headers or _JSON}
        if limit is not None:
            options["timeout"] = limit
        with translate_errors(self.shown_url + path):
            async with asyncio.timeout(answer_s):  # the answer's start; the body may take its prefill's time
                resp = await self._send(method, self.url(path), options)
            try:
                if resp.status >= 400:
                    raise status_error(resp.status, await resp.read(), resp.content_type)
                yield resp
            except BaseException:
                resp.close()  # drop the socket: the server stops prefill/decoding
                raise
            finally:
                resp.release()

    async def _send(self, method: str, url: str, options: dict[str, Any]) -> aiohttp.ClientResponse:
        """Once more on a fresh connection when a pooled one turns out closed (llama.cpp closes one after a
        streamed answer: a request sent on it before the close is seen fails unread, so it is safe)."""
        try:
            return await self.session.request(method, url, **options)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise  # a fresh connection failed: nothing was stale
            self.reconnected = True  # the server may have restarted: the health watch asks it again what it is
            return await self.session.request(method, url, **options)

    async def stream_completion(
        self, request: NormalizedRequest, prompt: BudgetedPrompt, answer_s: float | None = None, loading: bool = False
    ) -> Batches:
        """Complete `request` fitted to `prompt` through the kind's wire; its chunks a network read at a time.
        `answer_s`: a shorter wait for the answer to start than `answer_timeout_s` (there is a fallback);
        `loading`: the server loads its model first (a wake): no answer timeout.

        Raises:
            UpstreamError: the upstream is unreachable, answered an error, or sent garbage.
        """
        wire = self.kind.wire
        if not wire.answers_at_once or loading:  # Ollama answers only with its first token: no answer timeout
            answer_s = None
        elif answer_s is None or (self.answer_timeout_s is not None and self.answer_timeout_s < answer_s):
            answer_s = self.answer_timeout_s
        defaults = self.defaults
        if self.kind.keep_alive and self.keep_alive is not None:
            defaults = {**defaults, KEEP_ALIVE: self.keep_alive}
        body = orjson.dumps(wire.body(request, prompt, self.model, defaults))
        extra = self.routing_header or self.lane_hints  # else no headers to merge: `open` sends its JSON ones
        headers = {**_JSON, **self.routing(request), **self.lane_hints} if extra else None
        async with self.open("POST", wire.path, body, headers, answer_s=answer_s) as resp:
            async for batch in wire.read(resp):
                yield batch

    async def tokenize(self, body: dict[str, Any], timeout_s: float = 5.0) -> Any:  # a kind's `TokenizeShape` body
        return await self._json("POST", "/tokenize", body, timeout_s)

    async def post_json(self, path: str, body: Any, timeout_s: float = 2.0) -> Any:
        return await self._json("POST", path, body, timeout_s)

    async def get_json(self, path: str, timeout_s: float = 2.0) -> Any:
        return await self._json("GET", path, None, timeout_s)

    async def _json(self, method: str, path: str, body: Any, timeout_s: float) -> Any:
        data = None if body is None else orjson.dumps(body)
        async with self.open(method, path, data, limit=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            answer = await resp.read()
        try:
            return orjson.loads(answer)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError(f"upstream {self.shown_url + path} sent non-JSON") from exc

    async def model_ids(self) -> list[str]:  # the ids `/v1/models` lists
        return model_ids(await self.get_json("/v1/models"))
