"""Ollama (read against `server/routes.go`): recognised by `/api/version`; completions through its native
`POST /api/generate`; `OLLAMA_NUM_PARALLEL` requests at once (1 unless set); no `/tokenize`.

Ollama's OpenAI `/v1/completions` wraps every prompt in the model's own template (it has no `raw`),
which would put the proxy's rendered FIM prompt inside a chat or FIM template a second time; the
native endpoint with `raw: true` sends the prompt as it is (ollama `api/types.go` `GenerateRequest`:
`model`, `prompt`, `suffix`, `raw`, `stream`, `options`). The answer is NDJSON, one object per line:
`{"model", "created_at", "response", "done": false}`, then `done: true` with `done_reason`,
`prompt_eval_count`, `eval_count` and durations in nanoseconds (`GenerateResponse`, `Metrics`), or
`{"error": "..."}`. Ollama stops generating when the client closes the connection.

What the proxy learns from it (server/routes.go): `/api/ps` lists the loaded models, each with its
`context_length` in newer builds; `/api/show` gives a model's `parameters` (`num_ctx N` when the
Modelfile sets it); otherwise the server's default, `OLLAMA_CONTEXT_LENGTH`, 4096 (envconfig/config.go).

Ollama unloads a model after `keep_alive` without a request (5 minutes by default, `OLLAMA_KEEP_ALIVE`); users of
local completion report first completions of 7 to 270 s after that. Every `/api/generate` the proxy sends carries
`keep_alive` (the client's own, else the `keep_alive` setting); a model missing from `/api/ps` is asleep, and a
`/api/generate` with the model and no prompt loads it (Ollama's documented preload: `api.md`, "Load a model").
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import aiohttp

from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.models import BudgetedPrompt, Chunk, NormalizedRequest
from mellum_proxy.upstream.servers.base import Found, Memory, ServerKind, Transport
from mellum_proxy.upstream.servers.openai import drain
from mellum_proxy.upstream.servers.startup_log import StartupLog, size_bytes
from mellum_proxy.upstream.sse import MAX_EVENT_BYTES, load_event

GENERATE_PATH = "/api/generate"
DEFAULT_CONTEXT = 4096  # OLLAMA_CONTEXT_LENGTH's default (envconfig/config.go)
KEEP_ALIVE = "keep_alive"  # the key under which the client's defaults carry the `keep_alive` setting
# OpenAI / llama.cpp parameter names Ollama reads from `options` under the same name (api/types.go `Options`).
OPTIONS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "repeat_penalty", "repeat_last_n",
           "presence_penalty", "frequency_penalty")  # fmt: skip
_NUM_CTX = re.compile(r"^num_ctx\s+(\d+)\s*$", re.MULTILINE)


def generate_payload(
    request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `/api/generate` body for a request fitted to the budget, always streamed.

    The prompt is sent raw. Only with template `none` (the proxy renders no FIM prompt) does the
    suffix go along, without `raw`, so that Ollama's own template places it.
    """
    params = {**defaults, **request.params} if defaults else request.params
    options: dict[str, Any] = {name: params[name] for name in OPTIONS if params.get(name) is not None}
    options["num_predict"] = prompt.max_tokens
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    if stops or prompt.stops:
        options["stop"] = list(dict.fromkeys([*stops, *prompt.stops]))
    payload: dict[str, Any] = {"model": model or "", "prompt": prompt.prompt, "stream": True, "options": options}
    keep_alive = request.keep_alive if request.keep_alive is not None else params.get(KEEP_ALIVE)
    if keep_alive is not None:
        payload["keep_alive"] = keep_alive
    if prompt.suffix is not None:
        payload["suffix"] = prompt.suffix
    else:
        payload["raw"] = True
    return payload


async def read_ndjson(body: AsyncIterable[bytes]) -> AsyncIterator[list[Chunk]]:
    """Ollama's answer lines as batches of `Chunk`s, one batch per network read, until `done`.

    Raises:
        UpstreamProtocolError: a line is not a JSON object of the generate shape.
        UpstreamStatusError: the server reported an error inside the stream.
    """
    tail = b""
    async for data in body:
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        if len(tail) > MAX_EVENT_BYTES:
            raise UpstreamProtocolError(f"upstream sent a line over {MAX_EVENT_BYTES} bytes")
        batch: list[Chunk] = []
        try:
            for line in lines:
                if line.strip():
                    batch.append(chunk_from_line(line))
        except UpstreamError:
            if batch:
                yield batch  # the text before the error reaches the client first
            raise
        if batch:
            yield batch
            if batch[-1].finish_reason is not None:
                return
    if tail.strip():
        yield [chunk_from_line(tail)]


def chunk_from_line(line: bytes) -> Chunk:
    """One `/api/generate` answer object as a `Chunk`: usage from the eval counts, timings in ms."""
    event = load_event(line, "answer line")
    text = event.get("response", "")
    if type(text) is not str:
        raise UpstreamProtocolError("upstream sent a 'response' that is not a string")
    model = event.get("model")
    model = model if type(model) is str else None
    if event.get("done") is not True:
        return Chunk(text, model=model)
    counts = {"prompt_tokens": event.get("prompt_eval_count", 0), "completion_tokens": event.get("eval_count", 0)}
    durations = {"prompt_ms": event.get("prompt_eval_duration", 0), "predicted_ms": event.get("eval_duration", 0)}
    for name, value in (counts | durations).items():
        if type(value) is bool or not isinstance(value, int | float):
            raise UpstreamProtocolError(f"upstream sent a '{name}' that is not a number")
    usage = {**counts, "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}
    timings = {
        "prompt_n": counts["prompt_tokens"],
        "prompt_ms": durations["prompt_ms"] / 1e6,
        "predicted_n": counts["completion_tokens"],
        "predicted_ms": durations["predicted_ms"] / 1e6,
    }
    reason = event.get("done_reason")
    return Chunk(text, reason if type(reason) is str and reason else "stop", usage, timings, model)


def loaded_model(ps: Any) -> dict[str, Any] | None:
    """The one model `/api/ps` lists as loaded, if exactly one is."""
    models = ps.get("models") if isinstance(ps, dict) else None
    if isinstance(models, list) and len(models) == 1 and isinstance(models[0], dict):
        return models[0]
    return None


def listed_model(tags: Any) -> str | None:
    """The one model `/api/tags` lists, if exactly one is."""
    models = tags.get("models") if isinstance(tags, dict) else None
    if isinstance(models, list) and len(models) == 1 and isinstance(models[0], dict):
        name = models[0].get("name") or models[0].get("model")
        return name if isinstance(name, str) and name else None
    return None


def context_of(loaded: dict[str, Any] | None, show: Any) -> int | None:
    """A model's context per request: `/api/ps` `context_length`, else `num_ctx` in `/api/show`'s
    `parameters`; None when neither says (the server's default applies)."""
    value = (loaded or {}).get("context_length")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    parameters = show.get("parameters") if isinstance(show, dict) else None
    if isinstance(parameters, str) and (match := _NUM_CTX.search(parameters)):
        return int(match.group(1))
    return None


class GenerateWire:
    """`/api/generate`, raw; its answer starts only with its first token (so no answer timeout applies)."""

    path = GENERATE_PATH
    answers_at_once = False

    def body(
        self, request: NormalizedRequest, prompt: BudgetedPrompt, model: str | None, defaults: dict[str, Any]
    ) -> dict[str, Any]:
        return generate_payload(request, prompt, model, defaults)

    async def read(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[Chunk]]:
        async for batch in read_ndjson(resp.content.iter_any()):
            yield batch
        await drain(resp)


async def _get(upstream: Transport, path: str) -> Any:
    try:
        return await upstream.get_json(path, timeout_s=1.0)
    except UpstreamError:
        return None


async def discover(upstream: Transport) -> Found:
    """The model: the one loaded (`/api/ps`), else the one installed (`/api/tags`); its context from
    `/api/ps` or `/api/show`, else Ollama's default (it truncates a longer prompt silently)."""
    loaded = loaded_model(await _get(upstream, "/api/ps"))
    model = upstream.model
    if model is None:
        named = (loaded or {}).get("name") or (loaded or {}).get("model")
        model = named if isinstance(named, str) and named else listed_model(await _get(upstream, "/api/tags"))
    if loaded is not None and model not in (loaded.get("name"), loaded.get("model")):
        loaded = None
    show = None
    if model is not None and context_of(loaded, None) is None:
        try:
            show = await upstream.post_json("/api/show", {"model": model}, timeout_s=1.0)
        except UpstreamError:
            show = None
    return Found("ollama", model, context_of(loaded, show) or DEFAULT_CONTEXT, None)


async def asleep(upstream: Transport) -> bool | None:
    """Its model is not among those `/api/ps` lists as loaded (None: no model named, or no answer)."""
    if upstream.model is None:
        return None
    ps = await _get(upstream, "/api/ps")
    models = ps.get("models") if isinstance(ps, dict) else None
    if not isinstance(models, list):
        return None
    loaded = {m.get(key) for m in models if isinstance(m, dict) for key in ("name", "model")}
    return upstream.model not in loaded


async def wake(upstream: Transport) -> None:
    """The preload: `/api/generate` with the model and no prompt loads it (and answers once it is loaded)."""
    body: dict[str, Any] = {"model": upstream.model or "", "stream": False}
    keep_alive = getattr(upstream, "keep_alive", None)
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    await upstream.post_json(GENERATE_PATH, body, timeout_s=WAKE_TIMEOUT_S)


WAKE_TIMEOUT_S = 300.0  # a large model from a slow disk


def start_flags(context: int, batch: int, kv_type: str) -> str:
    return f"num_ctx {context}, OLLAMA_NUM_PARALLEL={batch}, OLLAMA_KV_CACHE_TYPE={kv_type}, OLLAMA_FLASH_ATTENTION=1"


_LOG_LINE = re.compile(r'memory\.(required\.full|required\.kv|weights\.total|graph\.full)="([\d.]+) (GiB|MiB|KiB|B)"')


def read_log_line(report: StartupLog, line: str) -> None:
    """Ollama's `memory.*="..."` line: the weights, the KV cache, the compute graph and the whole it requires."""
    found = _LOG_LINE.findall(line)
    if not found:
        return
    report.backend = OLLAMA.name
    report.note(line)
    for key, number, unit in found:
        size = size_bytes(number, unit)
        if key == "weights.total":
            report.weights_bytes = size
        elif key == "required.kv":
            report.kv_bytes = size
        elif key == "required.full":
            report.facts["required_full_bytes"] = size
        elif key == "graph.full":
            report.compute_bytes = size


def kv_extent(facts: dict[str, Any], text: str) -> tuple[int, int] | None:
    """From the llama.cpp runner's command line it logs: `--ctx-size` over all `--parallel` sequences."""
    context, parallel = re.search(r"--ctx-size (\d+)", text), re.search(r"--parallel (\d+)", text)
    if context is None:
        return None
    sequences = int(parallel[1]) if parallel else 1
    return int(context[1]) // sequences, sequences


OLLAMA = ServerKind(
    name="ollama",
    title="Ollama",
    discover=discover,
    wire=GenerateWire(),
    probe=("/api/version", lambda answer: isinstance(answer, dict) and "version" in answer),
    start_flags=start_flags,
    asleep=asleep,
    wake=wake,
    keep_alive=True,
    memory=Memory(0.8, read_log_line, kv_extent, window_extra_tokens=512, command_words=("ollama",)),  # llama.cpp
)
