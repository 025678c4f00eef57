"""`UpstreamClient`: the proxy's one way to reach the OpenAI-compatible model server.

Completions are always requested as a stream, so the proxy sees the first token and can stop
the server by closing the connection. Every response is opened through `open()`: an upstream
4xx/5xx becomes an `UpstreamStatusError`, and on any exception (cancellation included) the
response is `close()`d, not released, so the socket drops and llama.cpp / vLLM abort the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from mellum_proxy.config import redact_url
from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.models import Batches, BudgetedPrompt, NormalizedRequest
from mellum_proxy.sections import UpstreamSection
from mellum_proxy.upstream import ollama
from mellum_proxy.upstream.errors import status_error, translate_errors
from mellum_proxy.upstream.metrics import held_from_metrics
from mellum_proxy.upstream.sse import chunk_from_bytes, read_sse

_JSON = {"Content-Type": "application/json"}
# Completions ahead of everything else where the upstream schedules by priority (vLLM `--scheduling-policy
# priority`: lower values first; a request without one is 0) and where it is an llm-d gateway (its SLO ordering).
COMPLETION_PRIORITY = -10
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
DRAIN_S = 0.05


def _payload(
    request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """The OpenAI `/v1/completions` body for a request fitted to the budget (always streamed), for
    `model` when the proxy knows the upstream's (else the client's own `model`, if it sent one)."""
    payload: dict[str, Any] = {**defaults, **request.params} if defaults else dict(request.params)
    if model is not None:
        payload["model"] = model
    payload["prompt"] = prompt.prompt
    if prompt.suffix is not None:
        payload["suffix"] = prompt.suffix
    payload["max_tokens"] = prompt.max_tokens
    if prompt.stops:
        client_stops = payload.get("stop") or []
        client_stops = [client_stops] if isinstance(client_stops, str) else list(client_stops)
        payload["stop"] = list(dict.fromkeys([*client_stops, *prompt.stops]))
    payload["stream"] = True
    options = dict(payload.get("stream_options") or {})
    options.setdefault("include_usage", True)  # vLLM reports usage in streams only when asked
    payload["stream_options"] = options
    return payload


async def _drain(resp: aiohttp.ClientResponse) -> None:
    """Read what follows `[DONE]` (the end of the chunked body), so the connection goes back to the pool.

    A server that keeps the stream open after `[DONE]` gets its socket dropped instead.
    """
    if resp.content.at_eof():
        return
    try:
        async with asyncio.timeout(DRAIN_S):
            await resp.read()
    except TimeoutError:
        resp.close()


class UpstreamClient:
    """HTTP client for one upstream base URL over a shared `aiohttp.ClientSession`."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, section: UpstreamSection | None = None) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact_url(self.base_url)  # for messages, `/status` and `/health`: no credentials
        self.model: str | None = None  # the model name every completion names (`--upstream-model`, or found)
        self.native_ollama = False  # complete through Ollama's `/api/generate` (raw), not `/v1/completions`
        self.defaults: dict[str, Any] = {}  # parameters sent when the client sends none (`default_temperature`)
        self.routing_header: str | None = None  # a router's sticky-routing header (`routing_key_header`)
        self.developer_id = ""  # its value, unless `route_sessions`
        self.route_sessions = False  # key by the editor session instead of the developer
        # The longest a completion's answer may take to start (its status and headers): llama.cpp and vLLM
        # send them at once and stream the prefill's result later; a server silent this long is down. None:
        # no limit but the request's deadline (Ollama answers only with its first token).
        self.answer_timeout_s: float | None = None
        self.lane_hints: dict[str, str] = {}  # headers that put completions ahead (llm-d's SLO), on each of them
        if section is not None:
            self.model = section.model
            if section.default_temperature is not None:
                self.defaults["temperature"] = section.default_temperature
            self.routing_header = section.routing_header
            self.developer_id, self.route_sessions = section.developer_id, section.route_sessions
            self.answer_timeout_s = section.answer_timeout_s
            if section.priority:
                self.defaults["priority"] = COMPLETION_PRIORITY
            if section.slo_ttft_ms is not None:
                self.lane_hints[SLO_TTFT_HEADER] = str(section.slo_ttft_ms)
        self._held_source: str | None = ""  # "": not probed yet; None: the server cannot say

    def routing(self, request: NormalizedRequest | None = None) -> dict[str, str]:
        """The routing-key header for a request (the developer's, or its session's), or none."""
        if self.routing_header is None:
            return {}
        key = request.session if self.route_sessions and request is not None else self.developer_id
        return {self.routing_header: key}

    async def held(self) -> int | None:
        """Requests the server holds now, running and queued (`/metrics`: llama.cpp's `requests_processing +
        requests_deferred`, vLLM's `num_requests_running + num_requests_waiting`; else llama.cpp's `/slots`
        `is_processing`, which misses its queue); None if it cannot say."""
        for source in [self._held_source] if self._held_source else ["/metrics", "/slots"]:
            try:
                async with self.session.get(self.url(source), timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status >= 400:
                        continue
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                return None
            held = _held_from(source, text)
            if held is not None:
                self._held_source = source
                return held
        if self._held_source == "":
            self._held_source = None
        return None

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        """Wait until `accept(requests the server holds)` is true; False when the server cannot say (or
        `timeout_s` passed first). Polled every `LET_GO_POLL_S`: only cancelled requests wait on this."""
        if self._held_source is None:
            return False
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        while loop.time() < until:
            now = await self.held()
            if now is None:
                return False
            if accept(now):
                return True
            await asyncio.sleep(LET_GO_POLL_S)
        return False

    def url(self, path: str) -> str:
        return self.base_url + path

    @asynccontextmanager
    async def open(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        limit: aiohttp.ClientTimeout | None = None,
        answer_s: float | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """An upstream response whose status is below 400, closed (socket dropped) on any error.

        Transport errors raised while the caller reads the body inside the `async with` are
        translated too. `answer_s` bounds the wait for the answer's status and headers.

        Raises:
            UpstreamError: the upstream is unreachable, timed out or answered 4xx/5xx.
        """
        url = self.url(path)
        options: dict[str, Any] = {"data": data, "headers": headers or _JSON}
        if limit is not None:
            options["timeout"] = limit
        with translate_errors(self.shown_url + path):
            resp = await self._answered(method, url, options, answer_s)
            try:
                if resp.status >= 400:
                    raise status_error(resp.status, await resp.read(), resp.content_type)
                yield resp
            except BaseException:
                resp.close()  # drop the socket: the server stops prefill/decoding
                raise
            finally:
                resp.release()

    async def _answered(self, method: str, url: str, options: dict[str, Any], within_s: float | None) -> Any:
        if within_s is None:
            return await self._send(method, url, options)
        async with asyncio.timeout(within_s):  # the answer's start; the body may take its prefill's time
            return await self._send(method, url, options)

    async def _send(self, method: str, url: str, options: dict[str, Any]) -> aiohttp.ClientResponse:
        """Send the request; once more on a fresh connection when a pooled one turns out closed.

        llama.cpp closes the connection after a streamed answer; a request sent on it before the
        close is noticed fails before the server has read it, so sending it again is safe.
        """
        try:
            return await self.session.request(method, url, **options)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise  # a fresh connection failed: nothing was stale
            return await self.session.request(method, url, **options)

    async def stream_completion(
        self, request: NormalizedRequest, prompt: BudgetedPrompt, answer_s: float | None = None
    ) -> Batches:
        """POST `/v1/completions` for `request` fitted to `prompt`; yield its chunks a network read at a time.

        An upstream that ignores `stream: true` and answers one JSON body gives one batch. An Ollama
        upstream is asked through its native `/api/generate` instead (`mellum_proxy.upstream.ollama`).
        `answer_s`: a shorter wait for the answer to start than `answer_timeout_s` (there is a fallback).

        Raises:
            UpstreamError: the upstream is unreachable, answered an error, or sent garbage.
        """
        headers = (
            {**_JSON, **self.routing(request), **self.lane_hints} if self.routing_header or self.lane_hints else None
        )
        if self.native_ollama:
            body = orjson.dumps(ollama.generate_payload(request, prompt, self.model, self.defaults))
            # no `answer_timeout_s`: Ollama starts its answer only with its first token
            async with self.open("POST", ollama.GENERATE_PATH, body, headers) as resp:
                async for batch in ollama.read_ndjson(resp.content.iter_any()):
                    yield batch
                await _drain(resp)
            return
        body = orjson.dumps(_payload(request, prompt, self.model, self.defaults))
        if answer_s is None or (self.answer_timeout_s is not None and self.answer_timeout_s < answer_s):
            answer_s = self.answer_timeout_s
        async with self.open("POST", "/v1/completions", body, headers, answer_s=answer_s) as resp:
            if resp.content_type == "application/json":
                yield [chunk_from_bytes(await resp.read())]
                return
            if resp.content_type != "text/event-stream":
                raise UpstreamProtocolError(f"upstream answered {resp.content_type}, not an event stream")
            async for batch in read_sse(resp.content.iter_any()):
                yield batch
            await _drain(resp)

    async def tokenize(self, body: dict[str, Any], timeout_s: float = 5.0) -> Any:
        """llama.cpp `POST /tokenize` (the context budget's exact tokenizer)."""
        return await self._json("POST", "/tokenize", body, timeout_s)

    async def post_json(self, path: str, body: Any, timeout_s: float = 2.0) -> Any:
        """POST a JSON body and read the JSON answer (Ollama's `/api/show`)."""
        return await self._json("POST", path, body, timeout_s)

    async def get_json(self, path: str, timeout_s: float = 2.0) -> Any:
        """GET a JSON document from the upstream (used for /props, /slots)."""
        return await self._json("GET", path, None, timeout_s)

    async def _json(self, method: str, path: str, body: Any, timeout_s: float) -> Any:
        data = None if body is None else orjson.dumps(body)
        async with self.open(method, path, data, limit=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            answer = await resp.read()
        try:
            return orjson.loads(answer)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError(f"upstream {self.shown_url + path} sent non-JSON") from exc

    async def reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the upstream can serve (`answer_problem` finds none)."""
        return await self.answer_problem(timeout_s) is None

    async def answer_problem(self, timeout_s: float = 1.0) -> str | None:
        """Why the upstream cannot serve, in words a user acts on; None when it can: llama.cpp/vLLM `/health`,
        else `/v1/models` (Ollama, LM Studio).

        A `/health` that is not ok is asked again through `/v1/models`: vllm-router answers `/health` 503
        while any one of its workers is down, and still serves from the others (seen with 0.1.17); a
        llama.cpp server still loading its model answers 503 on both. An HTML page is no model server's
        answer (a captive portal's, a gateway's login page, a web server's), whatever its status.
        """
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        problem: str | None = None  # the first one found says most
        for path in ("/health", "/v1/models"):
            try:
                async with self.session.get(self.url(path), timeout=timeout) as resp:
                    if resp.content_type == "text/html":
                        problem = problem or f"answered {resp.status} with an HTML page: not a model server?"
                    elif resp.status < 400:
                        return None
                    else:
                        loading = " (loading its model?)" if resp.status == 503 else ""
                        problem = problem or f"answered {resp.status} on {path}{loading}"
            except aiohttp.ClientConnectorError as exc:
                refused = isinstance(exc.os_error, ConnectionRefusedError)
                return "connection refused: nothing listens there" if refused else f"cannot connect ({exc.os_error})"
            except TimeoutError:
                return f"no answer within {timeout_s:g} s"
            except aiohttp.ClientError as exc:
                return f"no HTTP answer ({type(exc).__name__})"
        return problem or "no answer"

    async def slot_count(self) -> int | None:
        """The upstream's parallel slots (llama.cpp `/props` total_slots or `/slots`), if it says."""
        for path in ("/props", "/slots"):
            try:
                body = await self.get_json(path)
            except Exception:  # any failure just means "cannot tell"; the caller falls back to 1
                continue
            if isinstance(body, dict) and isinstance(body.get("total_slots"), int):
                return int(body["total_slots"])
            if isinstance(body, list) and body:
                return len(body)
        return None

    async def context_per_request(self) -> int | None:
        """The most tokens one request may hold on the server, if it says: llama.cpp `/props`
        `default_generation_settings.n_ctx` (its `-c` split over the slots), else `/v1/models`
        (llama.cpp `meta.n_ctx`, vLLM `max_model_len`)."""
        try:
            props = await self.get_json("/props")
            n_ctx = props.get("default_generation_settings", {}).get("n_ctx") if isinstance(props, dict) else None
            if isinstance(n_ctx, int) and n_ctx > 0:
                return n_ctx
        except (UpstreamError, AttributeError):
            pass
        try:
            models = await self.get_json("/v1/models")
        except UpstreamError:
            return None
        data = models.get("data") if isinstance(models, dict) else None
        first: dict[str, Any] = (
            data[0] if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict) else {}
        )
        meta: dict[str, Any] = first["meta"] if isinstance(first.get("meta"), dict) else {}
        for value in (meta.get("n_ctx"), first.get("max_model_len")):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    async def served_model(self) -> str | None:
        """The model to name in requests when the upstream serves exactly one (vLLM 404s an unknown name)."""
        try:
            ids = await self.model_ids()
        except UpstreamError:
            return None
        return ids[0] if len(ids) == 1 else None

    async def model_ids(self) -> list[str]:
        """Model ids from the upstream's `/v1/models`: OpenAI's `data[].id`, or the `models[].name` list
        vllm-router 0.1.17 answers there."""
        models = await self.get_json("/v1/models")
        if not isinstance(models, dict):
            return []
        if isinstance(models.get("data"), list):
            return [str(m["id"]) for m in models["data"] if isinstance(m, dict) and "id" in m]
        listed: list[Any] = models["models"] if isinstance(models.get("models"), list) else []
        return [
            str(m.get("name") or m.get("model"))
            for m in listed
            if isinstance(m, dict) and (m.get("name") or m.get("model"))
        ]


LET_GO_POLL_S = 0.01


async def server_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why the model server at `url` cannot serve, in words (None: it can): for a command that needs it now."""
    async with aiohttp.ClientSession() as session:
        return await UpstreamClient(session, url).answer_problem(timeout_s)


def unreachable_line(url: str, problem: str) -> str:
    """The one line a command ends with when the server at `url` does not serve."""
    return f"the server at {redact_url(url)} does not serve ({problem}): start it, or check --upstream"


def _held_from(source: str, text: str) -> int | None:
    if source == "/slots":
        try:
            slots = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(slots, list):
            return None
        return sum(1 for slot in slots if isinstance(slot, dict) and slot.get("is_processing"))
    return held_from_metrics(text)
