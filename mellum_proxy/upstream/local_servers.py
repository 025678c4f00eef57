"""Where the usual local model servers listen, and which of them answers: the upstream when none is named.

The ports are each server's own default: vLLM 8000 (`vllm serve`), llama.cpp's `llama-server` 8080 and 9931
(its default since its PR #26508, 2026-08), Ollama 11434, LM Studio 1234. The first that answers as a model
server, in that order, is used; the proxy says which, or that none did.
"""

from __future__ import annotations

import asyncio

import aiohttp

from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.health import answer_problem

LOCAL_SERVERS: tuple[tuple[str, int], ...] = (
    ("vLLM", 8000), ("llama.cpp", 8080), ("llama.cpp", 9931), ("Ollama", 11434), ("LM Studio", 1234),
)  # fmt: skip
LOOK_S = 0.5


async def find_local_server(
    servers: tuple[tuple[str, int], ...] = LOCAL_SERVERS, host: str = "127.0.0.1"
) -> tuple[str | None, str]:
    """The base URL of the first of `servers` that answers on `host` (None: none does), and a line saying so."""
    urls = [f"http://{host}:{port}" for _, port in servers]
    async with aiohttp.ClientSession() as session:
        problems = await asyncio.gather(*(answer_problem(UpstreamClient(session, url), LOOK_S) for url in urls))
    for (name, _), url, problem in zip(servers, urls, problems, strict=True):
        if problem is None:
            return url, f"no --upstream given: a server answers at {url} ({name}'s port); serving from it"
    looked = ", ".join(f":{port} ({name})" for name, port in servers)
    return None, (f"no --upstream given, and no model server answers on {host} at {looked}; waiting for "
                  f"{urls[0]}: start your server, or pass --upstream URL")  # fmt: skip
