"""Any OpenAI-compatible server (`/v1/completions`, `/v1/models`), and what every other kind shares of it: the
streamed completion wire and the model list. The fallback kind: nothing told it apart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.models import BudgetedPrompt, Chunk, NormalizedRequest
from mellum_proxy.upstream.servers.base import Found, Overflow, ServerKind, Transport
from mellum_proxy.upstream.sse import chunk_from_bytes, read_sse

DRAIN_S = 0.05


class CompletionsWire:
    """OpenAI's `POST /v1/completions`, always streamed: the proxy sees the first token and can stop the server
    by closing the connection."""

    path = "/v1/completions"
    answers_at_once = True

    def body(
        self, request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None, defaults: dict[str, Any]
    ) -> dict[str, Any]:
        """The body for a request fitted to the budget, for `model` when the proxy knows the upstream's (else the
        client's own `model`, if it sent one)."""
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

    async def read(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[Chunk]]:
        """The answer a network read at a time; one that ignored `stream: true` is one batch."""
        if resp.content_type == "application/json":
            yield [chunk_from_bytes(await resp.read())]
            return
        if resp.content_type != "text/event-stream":
            raise UpstreamProtocolError(f"upstream answered {resp.content_type}, not an event stream")
        async for batch in read_sse(resp.content.iter_any()):
            yield batch
        await drain(resp)


async def drain(resp: aiohttp.ClientResponse) -> None:
    """Read what follows the last event (the end of the chunked body), so the connection goes back to the pool;
    a server that keeps the stream open after it gets its socket dropped instead."""
    if resp.content.at_eof():
        return
    try:
        async with asyncio.timeout(DRAIN_S):
            await resp.read()
    except TimeoutError:
        resp.close()


async def listed_models(upstream: Transport) -> list[dict[str, Any]]:
    """The entries of `/v1/models` (empty when it has none or says nothing)."""
    try:
        models = await upstream.get_json("/v1/models")
    except UpstreamError:
        return []
    data = models.get("data") if isinstance(models, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def model_ids(models: Any) -> list[str]:
    """Model ids of a `/v1/models` answer: OpenAI's `data[].id`, or the `models[].name` list vllm-router 0.1.17
    answers there."""
    if not isinstance(models, dict):
        return []
    if isinstance(models.get("data"), list):
        return [str(m["id"]) for m in models["data"] if isinstance(m, dict) and "id" in m]
    listed: list[Any] = models["models"] if isinstance(models.get("models"), list) else []
    names = [m.get("name") or m.get("model") for m in listed if isinstance(m, dict)]
    return [str(name) for name in names if name]


async def served_model(upstream: Transport) -> str | None:
    """The model to name in requests when the upstream serves exactly one (vLLM 404s an unknown name)."""
    try:
        ids = model_ids(await upstream.get_json("/v1/models"))
    except UpstreamError:
        return None
    return ids[0] if len(ids) == 1 else None


def positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def listed_context(upstream: Transport) -> int | None:
    """The one model's context from `/v1/models` (llama.cpp's `meta.n_ctx`, vLLM's `max_model_len`)."""
    models = await listed_models(upstream)
    first = models[0] if len(models) == 1 else {}
    meta: dict[str, Any] = first["meta"] if isinstance(first.get("meta"), dict) else {}
    return positive(meta.get("n_ctx")) or positive(first.get("max_model_len"))


async def discover(upstream: Transport) -> Found:
    return Found("openai", await served_model(upstream), await listed_context(upstream), None)


OPENAI = ServerKind(
    name="openai",
    title="OpenAI-compatible",
    discover=discover,
    wire=CompletionsWire(),
    overflow=Overflow(("maximum context length", "context_length_exceeded")),  # OpenAI's own, and gateways'
)
