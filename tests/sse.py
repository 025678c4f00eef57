"""Reading OpenAI-style event streams in tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson


async def events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any] | str]:
    """Yield each `data:` payload as it arrives: a dict, or the string `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        yield "[DONE]" if data == b"[DONE]" else orjson.loads(data)


async def collect_text(resp: aiohttp.ClientResponse) -> tuple[str, list[dict[str, Any] | str]]:
    """Read a whole stream; return the concatenated text and every event."""
    seen: list[dict[str, Any] | str] = []
    text = ""
    async for event in events(resp):
        seen.append(event)
        if isinstance(event, dict) and event.get("choices"):
            choice = event["choices"][0]
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text, seen


async def dialect_text(resp: aiohttp.ClientResponse, dialect: str, stream: bool) -> str:
    """The completion's text from an answer in `dialect` (`openai`, `llamacpp`, `ollama`), checking its end."""
    raw = await resp.read()
    if dialect == "ollama":
        lines = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        assert lines[-1]["done"] is True
        return "".join(line["response"] for line in lines)
    if not stream:
        body = orjson.loads(raw)
        return str(body["choices"][0]["text"] if dialect == "openai" else body["content"])
    events = [line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:")]
    payloads = [orjson.loads(e) for e in events if e != b"[DONE]"]
    if dialect == "openai":
        assert events[-1] == b"[DONE]"
        assert sum(1 for p in payloads if p["choices"][0]["finish_reason"]) == 1  # one final event
        return "".join(p["choices"][0]["text"] for p in payloads)
    assert payloads[-1]["stop"] is True
    return "".join(p["content"] for p in payloads)


async def page_state(proxy: Any, key: str, timeout_s: float = 10.0) -> Any:
    """The first value of `key` that is not null in the live page's state events (`/ui/events` of `proxy`, a
    test client)."""
    stream = await proxy.get("/ui/events")
    try:
        async with asyncio.timeout(timeout_s):
            async for line in stream.content:
                if line.startswith(b"data: {") and f'"{key}"'.encode() in line:
                    value = orjson.loads(line[6:]).get(key)
                    if value is not None:
                        return value
    finally:
        stream.close()
    raise AssertionError(f"the page's stream ended without '{key}'")
