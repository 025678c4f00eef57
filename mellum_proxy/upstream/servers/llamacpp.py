"""llama.cpp's `llama-server` (read against `tools/server/server.cpp`): `/props` with `total_slots` and
`default_generation_settings.n_ctx` (the context of one slot, its `-c` split over `-np`), `/slots`, `/metrics`
(with `--metrics`), `/tokenize` with each token's piece. It finishes a prefill it has started and keeps a queued
task until it would start; a client that leaves stops its decoding.

With `--sleep-idle-seconds N` it unloads its model after N s without a task and says `"is_sleeping": true` on
`/props`; any task loads it again (a completion, `/tokenize`, `/slots`: measured on the embedded server, 1.5-1.9 s
for gemma-3-270m here), while `/health`, `/props`, `/v1/models` and `/metrics` neither wake it nor keep it
awake. Its prompt cache is gone after a sleep, unless it was saved: with `--slot-save-path DIR`,
`POST /slots/{id}?action=save` writes a slot's prompt and KV cache to `DIR/filename`, and `action=restore` reads it
back (a task too: it loads the model, then takes milliseconds where the prompt's prefill took over a second).
Without the flag it answers 501 `not_supported_error`."""

from __future__ import annotations

import re
from typing import Any

from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.upstream.servers.base import Found, Memory, Overflow, ServerKind, TokenizeShape, Transport
from mellum_proxy.upstream.servers.openai import CompletionsWire, listed_context, positive, served_model
from mellum_proxy.upstream.servers.startup_log import StartupLog, matches, size_bytes

PREFIX = "llamacpp:"
# `/metrics` names (server-http metrics): what it runs and what waits for a slot; what each decode step carried
PROCESSING, DEFERRED = "llamacpp:requests_processing", "llamacpp:requests_deferred"
BUSY_SLOTS_PER_DECODE = "llamacpp:n_busy_slots_per_decode"
PROMPT_TOKENS, PREDICTED_TOKENS = "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"


def is_llamacpp(props: Any) -> bool:
    return isinstance(props, dict) and ("total_slots" in props or "default_generation_settings" in props)


async def count_slots(upstream: Transport) -> int | None:
    """Its parallel slots (`/props` `total_slots`, or the length of `/slots`), if it says."""
    for path in ("/props", "/slots"):
        try:
            body = await upstream.get_json(path)
        except Exception:  # any failure just means "cannot tell"; the caller falls back to 1
            continue
        if isinstance(body, dict) and isinstance(body.get("total_slots"), int):
            return int(body["total_slots"])
        if isinstance(body, list) and body:
            return len(body)
    return None


async def slot_context(upstream: Transport) -> int | None:
    """The most tokens one request may hold: `/props` `default_generation_settings.n_ctx`, else `/v1/models`."""
    try:
        props = await upstream.get_json("/props")
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        n_ctx = positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if n_ctx:
            return n_ctx
    except UpstreamError:
        pass
    return await listed_context(upstream)


async def discover(upstream: Transport) -> Found:
    return Found("llama.cpp", await served_model(upstream), await slot_context(upstream), await count_slots(upstream))


def metrics(samples: dict[str, float]) -> dict[str, float]:
    """Its `/metrics` samples by name without the `llamacpp:` prefix (`requests_processing`, ...)."""
    return {name.removeprefix(PREFIX): value for name, value in samples.items() if name.startswith(PREFIX)}


def _tokens(answer: Any) -> list[dict[str, Any]]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise UpstreamProtocolError("upstream /tokenize answered without a token list")
    return [t if isinstance(t, dict) else {"id": t} for t in tokens]


def _body(text: str, special: bool, pieces: bool, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"content": text, "add_special": special}
    if pieces:
        body["with_pieces"] = True
    return body


def _pieces(answer: Any, text: str) -> list[Any] | None:
    """Each token's text: a string, or its bytes as a list where it is not whole UTF-8."""
    pieces = [token.get("piece") for token in _tokens(answer)]
    return pieces if all(isinstance(piece, str | list) for piece in pieces) else None


def _ids(answer: Any) -> list[int]:
    return [t["id"] for t in _tokens(answer) if isinstance(t.get("id"), int)]


TOKENIZE = TokenizeShape("llama.cpp", _body, _pieces, _ids)


async def asleep(upstream: Transport) -> bool | None:
    """`/props` `is_sleeping`; in router mode (one `llama-server` loading the model a request names, unloading the
    least used or idle ones: `tools/server/server-models.cpp`), the model's `status.value` on `/v1/models`
    (`unloaded` or `sleeping`: asleep). None: builds without either do not say."""
    try:
        props = await upstream.get_json("/props", timeout_s=1.0)
    except UpstreamError:
        props = None
    sleeping = props.get("is_sleeping") if isinstance(props, dict) else None
    if isinstance(sleeping, bool):
        return sleeping
    try:
        listed = await upstream.get_json("/v1/models", timeout_s=1.0)
    except UpstreamError:
        return None
    entries = listed.get("data") if isinstance(listed, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        status = entry.get("status") if isinstance(entry, dict) else None
        if entry.get("id") == upstream.model and isinstance(status, dict) and isinstance(status.get("value"), str):
            return status["value"] in ("unloaded", "sleeping")
    return None


SLOT_FILE = "mellum-proxy-slot-{}.bin"  # in the server's own `--slot-save-path`
RESTORE_TIMEOUT_S = 300.0  # a restore waits for the model's load: as long as a wake's prefill may


async def save_slots(upstream: Transport) -> int:
    """Each slot's prompt cache to the server's disk; how many were saved.

    Raises:
        UpstreamError: it cannot (no `--slot-save-path`: 501), or did not answer.
    """
    slots = await count_slots(upstream) or 1
    for slot in range(slots):
        await upstream.post_json(f"/slots/{slot}?action=save", {"filename": SLOT_FILE.format(slot)})
    return slots


async def restore_slots(upstream: Transport) -> int:
    """The slots' prompt caches saved before a sleep, read back (which loads the model); how many were restored
    (a slot that was never saved, or a file another model wrote, is left empty)."""
    restored = 0
    for slot in range(await count_slots(upstream) or 1):
        try:
            body = {"filename": SLOT_FILE.format(slot)}
            await upstream.post_json(f"/slots/{slot}?action=restore", body, timeout_s=RESTORE_TIMEOUT_S)
        except UpstreamError:
            continue
        restored += 1
    return restored


def start_flags(context: int, batch: int, kv_type: str) -> str:
    return f"llama-server -c {context * batch} -np {batch} -ctk {kv_type} -ctv {kv_type} -ngl 99 --metrics"


_LOG_LINES = [
    # current builds: "load_tensors: CUDA0 model buffer size"; older: "llm_load_tensors: ROCm0 buffer size"
    (re.compile(r"load_tensors:\s+(\S+) (?:model )?buffer size =\s+([\d.]+) (MiB|GiB)"), "model_buffer"),
    # every build prints "KV buffer size" once per cache; newer ones add a "size = ... cells" line for it
    (re.compile(r"KV buffer size =\s+([\d.]+) (MiB|GiB)"), "kv"),
    (re.compile(r"llama_kv_cache(?:_unified)?: size =\s+[\d.]+ \w+ \(\s*(\d+) cells,\s+(\d+) layers"), "kv_cells"),
    # `(?<!\S)`: a device name starts after a space or at the line start; without it a long line without spaces
    # makes the search quadratic (each start position runs `\S+` to the end of the line)
    (re.compile(r"(?<!\S)(\S+) compute buffer size =\s+([\d.]+) (MiB|GiB)"), "compute"),
    (re.compile(r"offloaded (\d+)/(\d+) layers to GPU"), "offload"),
    (re.compile(r"print_info: file type\s+=\s+(.+)$"), "file_type"),
    (re.compile(r"llama_context: n_ctx\s+=\s+(\d+)"), "n_ctx"),
    (re.compile(r"llama_context: n_ctx_seq\s+=\s+(\d+)"), "n_ctx_seq"),
    (re.compile(r"llama_context: n_seq_max\s+=\s+(\d+)"), "n_seq_max"),
    (re.compile(r"K \((\w+)\):"), "kv_type"),
]


def read_log_line(report: StartupLog, line: str) -> None:
    """llama-server's start-up lines: its buffers per device, the KV cache and the context it was sized for."""
    for kind, match in matches(_LOG_LINES, line):
        report.backend = report.backend or LLAMACPP.name
        if kind == "model_buffer" and "REPACK" not in match[1]:  # a repack buffer is a CPU-side copy
            report.weights_bytes += size_bytes(match[2], match[3])
            report.note(line)
        elif kind == "kv":
            report.kv_bytes += size_bytes(match[1], match[2])
            report.note(line)
        elif kind == "kv_cells":
            report.facts.setdefault("kv_caches", []).append({"cells": int(match[1]), "layers": int(match[2])})
        elif kind == "compute":
            report.compute_bytes += size_bytes(match[2], match[3])
        elif kind == "offload":
            report.facts["offloaded_layers"] = f"{match[1]}/{match[2]}"
            report.note(line)
        elif kind == "file_type":
            report.facts["file_type"] = match[1].strip()
        elif kind in ("n_ctx", "n_ctx_seq", "n_seq_max"):
            report.facts[kind] = int(match[1])
        elif kind == "kv_type":
            report.facts["kv_type"] = match[1]


def kv_extent(facts: dict[str, Any], text: str) -> tuple[int, int] | None:
    return (facts["n_ctx_seq"], facts.get("n_seq_max", 1)) if "n_ctx_seq" in facts else None


UBATCH = 512  # llama.cpp's default n_ubatch: a sliding-window layer keeps this much beyond its window

LLAMACPP = ServerKind(
    name="llama.cpp",
    title="llama.cpp",
    discover=discover,
    wire=CompletionsWire(),
    probe=("/props", is_llamacpp),
    held_gauges=(PROCESSING, DEFERRED),
    holds_in_slots=True,
    count_slots=count_slots,
    tokenize=TOKENIZE,
    # `exceed_context_size_error`: "request (4476 tokens) exceeds the available context size (4096 tokens)"
    overflow=Overflow(
        ("exceed_context_size", "exceeds the available context"), (re.compile(r"request \((\d+) tokens\)"),)
    ),
    start_flags=start_flags,
    asleep=asleep,
    cache_per_slot=True,
    save_slots=save_slots,
    restore_slots=restore_slots,
    # its CUDA context is ~0.3 GiB and its compute buffer ~0.2-0.5 GiB (it grows with n_ubatch x vocab)
    memory=Memory(0.6, read_log_line, kv_extent, window_extra_tokens=UBATCH, command_words=("llama-server",)),
)
