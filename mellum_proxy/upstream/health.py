"""Whether a model server can serve, in words a user acts on."""

from __future__ import annotations

import aiohttp

from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.urls import redact_url


async def answer_problem(upstream: UpstreamClient, timeout_s: float = 1.0) -> str | None:
    """Why the upstream cannot serve; None when it can: llama.cpp/vLLM `/health`, else `/v1/models` (Ollama,
    LM Studio).

    A `/health` that is not ok is asked again through `/v1/models`: vllm-router answers `/health` 503 while any
    one of its workers is down, and still serves from the others (seen with 0.1.17); a llama.cpp server still
    loading its model answers 503 on both. An HTML page is no model server's answer (a captive portal's, a
    gateway's login page, a web server's), whatever its status.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    problem: str | None = None  # the first one found says most
    for path in ("/health", "/v1/models"):
        try:
            async with upstream.session.get(upstream.url(path), timeout=timeout) as resp:
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


async def reachable(upstream: UpstreamClient, timeout_s: float = 1.0) -> bool:
    """Whether the upstream can serve (`answer_problem` finds none)."""
    return await answer_problem(upstream, timeout_s) is None


async def server_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why the model server at `url` cannot serve, in words (None: it can): for a command that needs it now."""
    async with aiohttp.ClientSession() as session:
        return await answer_problem(UpstreamClient(session, url), timeout_s)


def unreachable_line(url: str, problem: str) -> str:
    """The one line a command ends with when the server at `url` does not serve."""
    return f"the server at {redact_url(url)} does not serve ({problem}): start it, or check --upstream"
