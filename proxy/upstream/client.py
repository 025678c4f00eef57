"""`UpstreamClient`: the proxy's one way to reach the OpenAI-compatible model server.

Completions are always requested as a stream, so the proxy sees the first token and can stop
the server by closing the connection. Responses are opened only with `async with`; on any
exception (cancellation included) the response is `close()`d, not released, so the socket
drops and llama.cpp / vLLM abort the generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from proxy.budget.context import BudgetedPrompt
from proxy.errors import UpstreamProtocolError
from proxy.models import Chunk, NormalizedRequest
from proxy.upstream.errors import status_error, translate_errors

_JSON = {"Content-Type": "application/json"}


def completion_payload(request: NormalizedRequest, prompt: BudgetedPrompt) -> dict[str, Any]:
    """The OpenAI `/v1/completions` body for a request fitted to the budget (always streamed)."""
    payload: dict[str, Any] = dict(request.params)
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


class UpstreamClient:
    """HTTP client for one upstream base URL over a shared `aiohttp.ClientSession`."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")

    def url(self, path: str) -> str:
        return self.base_url + path

    async def stream_completion(self, payload: dict[str, Any]) -> AsyncIterator[Chunk]:
        """POST `/v1/completions` and yield its chunks as they arrive.

        Raises:
            UpstreamError: the upstream is unreachable, answered an error, or sent garbage.
        """
        url = self.url("/v1/completions")
        with translate_errors(url):
            async with self.session.post(url, data=orjson.dumps(payload), headers=_JSON) as resp:
                try:
                    if resp.status >= 400:
                        raise status_error(resp.status, await resp.read())
                    async for chunk in _read_sse(resp):
                        yield chunk
                except BaseException:
                    resp.close()  # drop the socket: the server stops prefill/decoding
                    raise

    async def get_json(self, path: str, timeout_s: float = 2.0) -> Any:
        """GET a JSON document from the upstream (used for /props, /slots)."""
        return await self._json("GET", path, None, timeout_s)

    async def post_json(self, path: str, body: Any, timeout_s: float = 5.0) -> Any:
        """POST a JSON body and read a JSON answer (used for /tokenize)."""
        return await self._json("POST", path, body, timeout_s)

    async def _json(self, method: str, path: str, body: Any, timeout_s: float) -> Any:
        url = self.url(path)
        data = None if body is None else orjson.dumps(body)
        with translate_errors(url):
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self.session.request(method, url, data=data, headers=_JSON, timeout=timeout) as resp:
                answer = await resp.read()
                if resp.status >= 400:
                    raise status_error(resp.status, answer)
                try:
                    return orjson.loads(answer)
                except orjson.JSONDecodeError as exc:
                    raise UpstreamProtocolError(f"upstream {url} sent non-JSON") from exc

    async def reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the upstream answers: llama.cpp/vLLM `/health`, else `/v1/models`."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        for path in ("/health", "/v1/models"):
            try:
                async with self.session.get(self.url(path), timeout=timeout) as resp:
                    if resp.status < 400:
                        return True
                    if resp.status != 404:
                        return False
            except (aiohttp.ClientError, TimeoutError):
                return False
        return False

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


async def _read_sse(resp: aiohttp.ClientResponse) -> AsyncIterator[Chunk]:
    """Parse an OpenAI completion event stream into chunks, stopping at `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # comments, keep-alives, `event:` lines
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError("upstream sent an unreadable stream event") from exc
        if not isinstance(event, dict):
            raise UpstreamProtocolError("upstream sent a stream event that is not an object")
        if "error" in event:
            raise status_error(500, data)
        yield _chunk_from_event(event)


def _chunk_from_event(event: dict[str, Any]) -> Chunk:
    choices = event.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    return Chunk(
        text=str(choice.get("text") or ""),
        finish_reason=choice.get("finish_reason"),
        usage=event.get("usage"),
        timings=event.get("timings"),
        model=event.get("model"),
        created=event.get("created"),
        upstream_id=event.get("id"),
    )
