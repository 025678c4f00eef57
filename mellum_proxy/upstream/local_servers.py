"""Where the usual local model servers listen, and which of them answers: the upstream when none is named.

The ports are each server's own default: vLLM 8000 (`vllm serve`), llama.cpp's `llama-server` 8080 and 9931 (the
port its server README names; its builds of 2026-08 and 2026-09 still used 8080), Ollama 11434, LM Studio 1234. The
first that answers as a model server, in that order, is used: its `/health` (or `/v1/models`) answers, and
`/v1/models` lists a model (any web server on port 8000 answers `/health`; taken, it made every completion a 404).
The proxy says which it took, with the kind its probes found, and which it passed over and why, or that none did.
"""

from __future__ import annotations

import asyncio

import aiohttp

from mellum_proxy.errors import UpstreamError
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.health import answer_problem
from mellum_proxy.upstream.servers import GENERIC, detect

LOCAL_SERVERS: tuple[tuple[str, int], ...] = (
    ("vLLM", 8000), ("llama.cpp", 8080), ("llama.cpp", 9931), ("Ollama", 11434), ("LM Studio", 1234),
)  # fmt: skip
LOOK_S = 0.5


async def find_local_server(
    servers: tuple[tuple[str, int], ...] = LOCAL_SERVERS, host: str = "127.0.0.1"
) -> tuple[str | None, str]:
    """The base URL of the first of `servers` that answers on `host` as a model server (None: none does), and the
    line that says so (and what it passed over)."""
    urls = [f"http://{host}:{port}" for _, port in servers]
    async with aiohttp.ClientSession() as session:
        looks = await asyncio.gather(*(_look(UpstreamClient(session, url)) for url in urls))
    passed: list[str] = []
    for (name, _), url, (problem, what) in zip(servers, urls, looks, strict=True):
        if problem is None:
            over = f"; passed over {', '.join(passed)}" if passed else ""
            return (
                url,
                f"no --upstream given: a model server answers at {url} ({name}'s port: {what}); serving from it{over}",
            )
        if not problem.startswith(("connection refused", "cannot connect", "no answer")):
            passed.append(f"{url} ({problem})")
    looked = ", ".join(f":{port} ({name})" for name, port in servers)
    over = f" ({'; '.join(passed)})" if passed else ""
    return None, (f"no --upstream given, and no model server answers on {host} at {looked}{over}; waiting for "
                  f"{urls[0]}: start your server, or pass --upstream URL")  # fmt: skip


async def _look(client: UpstreamClient) -> tuple[str | None, str]:
    """Why `client`'s server is no model server (None: it is), and what its probes found it to be."""
    problem = await answer_problem(client, LOOK_S)
    if problem is not None:
        return problem, ""
    kind = await detect(client)
    try:
        models = await client.model_ids()
    except UpstreamError:
        models = []
    found = kind.title if kind is not GENERIC else "an OpenAI-compatible server"
    if not models:
        return "answers, but lists no model on /v1/models: not a model server?", found
    return None, f"{found} serving {models[0]}"
