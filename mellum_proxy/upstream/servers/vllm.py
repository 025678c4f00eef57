"""vLLM (read against `vllm/entrypoints/openai/api_server.py`): `/v1/models` entries `owned_by: "vllm"` with
`max_model_len`; no `/props`: it batches up to `--max-num-seqs` and aborts a request whose client goes away.
`/metrics` counts what it runs and what waits; `/tokenize` takes `prompt` (`TokenizeCompletionRequest`) and gives
the vocabulary's token strings when asked (`return_token_strs`). Started with `--enable-sleep-mode` (and
`VLLM_SERVER_DEV_MODE=1`), it answers `GET /is_sleeping` (`{"is_sleeping": bool}`) and is woken by `POST /wake_up`
(`vllm/entrypoints/openai/api_server.py`); without it those paths are 404, and the proxy does not ask again."""

from __future__ import annotations

import re
from typing import Any

from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.upstream.servers.base import Found, Memory, Overflow, ServerKind, TokenizeShape, Transport
from mellum_proxy.upstream.servers.openai import CompletionsWire, listed_context, served_model
from mellum_proxy.upstream.servers.startup_log import StartupLog, matches, size_bytes

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
PROMPT_TOKENS, GENERATION_TOKENS = "vllm:prompt_tokens_total", "vllm:generation_tokens_total"
DEFAULT_SLOTS = 4  # it batches: a few sessions can run together when it does not say how many


def is_vllm(models: Any) -> bool:
    data = models.get("data") if isinstance(models, dict) else None
    return isinstance(data, list) and any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in data)


async def discover(upstream: Transport) -> Found:
    return Found("vllm", await served_model(upstream), await listed_context(upstream), DEFAULT_SLOTS)


def _body(text: str, special: bool, pieces: bool, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": text, "add_special_tokens": special}
    if pieces:
        body["return_token_strs"] = True
    if model:
        body["model"] = model
    return body


def _ids(answer: Any) -> list[int]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return [t for t in tokens if isinstance(t, int)] if isinstance(tokens, list) else []


def _pieces(answer: Any, text: str) -> list[Any] | None:
    strings = answer.get("token_strs") if isinstance(answer, dict) else None
    return strings if isinstance(strings, list) else None


TOKENIZE = TokenizeShape("vllm", _body, _pieces, _ids, vocabulary=True)


async def asleep(upstream: Transport) -> bool | None:
    try:
        answer = await upstream.get_json("/is_sleeping", timeout_s=1.0)
    except UpstreamError:
        return None
    sleeping = answer.get("is_sleeping") if isinstance(answer, dict) else None
    return sleeping if isinstance(sleeping, bool) else None


async def wake(upstream: Transport) -> None:
    try:
        await upstream.post_json("/wake_up", {}, timeout_s=300.0)
    except UpstreamProtocolError:
        pass  # it answers 200 with no body


def start_flags(context: int, batch: int, kv_type: str) -> str:
    cache = "auto" if kv_type in ("f16", "bf16") else kv_type
    return f"vllm serve MODEL --max-model-len {context} --max-num-seqs {batch} --kv-cache-dtype {cache}"


_LOG_LINES = [
    (re.compile(r"(?:Model loading|Loading model weights) took ([\d.]+) (GiB|GB|MiB)"), "weights"),
    (re.compile(r"Available KV cache memory: ([\d.]+) (GiB|GB|MiB)"), "kv"),
    (re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"), "kv_tokens"),
    # the CPU build: the checkpoint as loaded, and the KV cache pool VLLM_CPU_KVCACHE_SPACE set
    (re.compile(r"Checkpoint size: ([\d.]+) (GiB|GB|MiB)"), "checkpoint"),
    (re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) (GiB) for KV cache"), "kv"),
    (re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"), "concurrency"),
]


def read_log_line(report: StartupLog, line: str) -> None:
    """vLLM's start-up lines: the weights as loaded, the KV cache's memory and tokens, its concurrency."""
    for kind, match in matches(_LOG_LINES, line):
        report.backend = VLLM.name
        report.note(line)
        if kind == "weights":
            report.weights_bytes = size_bytes(match[1], match[2])
        elif kind == "checkpoint" and not report.weights_bytes:  # "Model loading took" says more, where it is
            report.weights_bytes = size_bytes(match[1], match[2])
        elif kind == "kv":
            report.kv_bytes = size_bytes(match[1], match[2])
        elif kind == "kv_tokens":
            report.facts["kv_cache_tokens"] = int(match[1].replace(",", ""))
        elif kind == "concurrency":
            report.facts["max_concurrency"] = {
                "tokens_per_request": int(match[1].replace(",", "")),
                "times": float(match[2]),
            }


def kv_extent(facts: dict[str, Any], text: str) -> tuple[int, int] | None:
    return (facts["kv_cache_tokens"], 1) if "kv_cache_tokens" in facts else None


VLLM = ServerKind(
    name="vllm",
    title="vLLM",
    discover=discover,
    wire=CompletionsWire(),
    probe=("/v1/models", is_vllm),
    held_gauges=(RUNNING, WAITING),
    default_slots=DEFAULT_SLOTS,
    tokenize=TOKENIZE,
    # serving_engine.py `_validate_input`: "... maximum context length is 2048 tokens. However, you requested 2368
    # tokens (2240 in the messages, 128 in the completion)", or "your request has 2778 input tokens"
    overflow=Overflow(
        ("maximum context length",), (re.compile(r"\((\d+) in the messages"), re.compile(r"(\d+) input tokens"))
    ),
    start_flags=start_flags,
    asleep=asleep,
    wake=wake,
    # its profiler reports ~0.5 GiB non-torch memory (CUDA context) plus an activation peak and CUDA graphs of
    # ~1 GiB for models of this size
    memory=Memory(1.5, read_log_line, kv_extent, command_words=("vllm",)),
)
