"""What kind of server the upstream is, and what the proxy can learn from it.

Each kind exposes different things (read against each project's server code):
- llama.cpp (`tools/server/server.cpp`): `/props` with `total_slots` and
  `default_generation_settings.n_ctx` (the context of one slot), `/slots`, `/metrics`, `/tokenize`.
- vLLM (`vllm/entrypoints/openai/api_server.py`): `/version`, `/v1/models` entries `owned_by: "vllm"`
  with `max_model_len`; no `/props`: it batches up to `--max-num-seqs` and aborts a request whose
  client goes away.
- Ollama (`server/routes.go`): `/api/version`, `/api/tags`, `/api/ps`, `/api/show`
  (`mellum_proxy.upstream.ollama`); completions go to its native `/api/generate`; `OLLAMA_NUM_PARALLEL`
  requests at once (1 unless set).
- LM Studio (lmstudio-ai/docs `1_developer/2_rest/list.md`): `/v1/models` entries `owned_by:
  "organization_owner"`; `/api/v1/models` lists every downloaded model, the loaded ones with
  `loaded_instances[].config.context_length`.
- anything else OpenAI-compatible: `openai`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mellum_proxy.errors import UpstreamError
from mellum_proxy.upstream import ollama
from mellum_proxy.upstream.client import UpstreamClient

KINDS = ("llama.cpp", "vllm", "ollama", "lmstudio", "openai")
# Requests upstream at once when the server cannot say: vLLM batches (a few sessions can run together);
# the others run one at a time unless configured otherwise.
DEFAULT_SLOTS = {"vllm": 4}


@dataclass(frozen=True, slots=True)
class Found:
    """What the proxy learned about its upstream (None: it did not say)."""

    kind: str
    model: str | None
    context: int | None
    slots: int | None

    def describe(self) -> str:
        context = f"{self.context} tokens per request" if self.context else "context per request unknown"
        slots = f"{self.slots} slots" if self.slots else "slots unknown"
        return f"kind {self.kind}, model {self.model or 'not named'}, {context}, {slots}"


async def _get(upstream: UpstreamClient, path: str) -> Any:
    try:
        return await upstream.get_json(path, timeout_s=1.0)
    except UpstreamError:
        return None


async def detect_kind(upstream: UpstreamClient) -> str:
    """The server's kind from what it answers; `openai` when nothing tells it apart."""
    props = await _get(upstream, "/props")
    if isinstance(props, dict) and ("total_slots" in props or "default_generation_settings" in props):
        return "llama.cpp"
    version = await _get(upstream, "/api/version")
    if isinstance(version, dict) and "version" in version:
        return "ollama"
    models = await _get(upstream, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    owners = {m.get("owned_by") for m in data if isinstance(m, dict)} if isinstance(data, list) else set()
    if "vllm" in owners:
        return "vllm"
    if "organization_owner" in owners:
        return "lmstudio"
    return "openai"


async def discover(upstream: UpstreamClient, kind: str = "auto") -> Found:
    """Kind, served model, context per request and slots, each as far as the server says."""
    if kind == "auto":
        kind = await detect_kind(upstream)
    upstream.native_ollama = kind == "ollama"
    if kind == "ollama":
        return await _discover_ollama(upstream)
    if kind == "lmstudio":
        return await _discover_lmstudio(upstream)
    slots = await upstream.slot_count() if kind == "llama.cpp" else DEFAULT_SLOTS.get(kind)
    return Found(kind, await upstream.served_model(), await upstream.context_per_request(), slots)


async def _discover_ollama(upstream: UpstreamClient) -> Found:
    """The model: the one loaded (`/api/ps`), else the one installed (`/api/tags`); its context from
    `/api/ps` or `/api/show`, else Ollama's default (it truncates a longer prompt silently)."""
    loaded = ollama.loaded_model(await _get(upstream, "/api/ps"))
    model = upstream.model
    if model is None:
        named = (loaded or {}).get("name") or (loaded or {}).get("model")
        model = named if isinstance(named, str) and named else ollama.listed_model(await _get(upstream, "/api/tags"))
    if loaded is not None and model not in (loaded.get("name"), loaded.get("model")):
        loaded = None
    show = None
    if model is not None and ollama.context_of(loaded, None) is None:
        try:
            show = await upstream.post_json("/api/show", {"model": model}, timeout_s=1.0)
        except UpstreamError:
            show = None
    context = ollama.context_of(loaded, show) or ollama.DEFAULT_CONTEXT
    return Found("ollama", model, context, None)


async def _discover_lmstudio(upstream: UpstreamClient) -> Found:
    """The model: the one LLM loaded (`/api/v1/models`; `/v1/models` lists every downloaded one), with
    its loaded context; else the one `/v1/models` lists."""
    listing = await _get(upstream, "/api/v1/models")
    models = listing.get("models") if isinstance(listing, dict) else None
    loaded = [
        (str(instance.get("id") or entry.get("key")), instance.get("config") or {})
        for entry in (models if isinstance(models, list) else [])
        if isinstance(entry, dict) and entry.get("type", "llm") == "llm"
        for instance in entry.get("loaded_instances") or []
        if isinstance(instance, dict)
    ]
    model = upstream.model
    if model is None:
        model = loaded[0][0] if len(loaded) == 1 else await upstream.served_model()
    config = next((config for name, config in loaded if name == model), {})
    context = config.get("context_length") if isinstance(config, dict) else None
    if not isinstance(context, int) or isinstance(context, bool) or context <= 0:
        context = await upstream.context_per_request()
    return Found("lmstudio", model, context, None)
