"""Reading OpenAI-style event streams in tests."""

from __future__ import annotations

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
