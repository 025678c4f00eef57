"""LM Studio (read against lmstudio-ai/docs `1_developer/2_rest/list.md`): `/v1/models` entries `owned_by:
"organization_owner"` list every downloaded model; `/api/v1/models` says which are loaded, each with its
`loaded_instances[].config.context_length`. With JIT loading and an idle TTL it unloads a model nobody asked for a
while and loads it on the next request: a model with no `loaded_instances` is asleep."""

from __future__ import annotations

from typing import Any

from mellum_proxy.errors import UpstreamError
from mellum_proxy.upstream.servers.base import Found, ServerKind, Transport
from mellum_proxy.upstream.servers.openai import CompletionsWire, listed_context, positive, served_model


def is_lmstudio(models: Any) -> bool:
    data = models.get("data") if isinstance(models, dict) else None
    owners = {m.get("owned_by") for m in data if isinstance(m, dict)} if isinstance(data, list) else set()
    return "organization_owner" in owners


async def _loaded(upstream: Transport) -> list[tuple[str, dict[str, Any]]] | None:
    """Each loaded LLM instance's id and config (`/api/v1/models`); None: it did not say."""
    try:
        listing = await upstream.get_json("/api/v1/models", timeout_s=1.0)
    except UpstreamError:
        return None
    models = listing.get("models") if isinstance(listing, dict) else None
    if not isinstance(models, list):
        return None
    return [
        (str(instance.get("id") or entry.get("key")), instance.get("config") or {})
        for entry in models
        if isinstance(entry, dict) and entry.get("type", "llm") == "llm"
        for instance in entry.get("loaded_instances") or []
        if isinstance(instance, dict)
    ]


async def asleep(upstream: Transport) -> bool | None:
    """Its model has no loaded instance (None: no model named, or no answer)."""
    loaded = await _loaded(upstream)
    if loaded is None or upstream.model is None:
        return None
    return all(name != upstream.model for name, _ in loaded)


async def discover(upstream: Transport) -> Found:
    """The model: the one LLM loaded (`/api/v1/models`), with its loaded context; else the one `/v1/models` lists."""
    loaded = await _loaded(upstream) or []
    model = upstream.model
    if model is None:
        model = loaded[0][0] if len(loaded) == 1 else await served_model(upstream)
    config = next((config for name, config in loaded if name == model), {})
    context = positive(config.get("context_length")) if isinstance(config, dict) else None
    return Found("lmstudio", model, context or await listed_context(upstream), None)


LMSTUDIO = ServerKind(
    name="lmstudio",
    title="LM Studio",
    discover=discover,
    wire=CompletionsWire(),
    probe=("/v1/models", is_lmstudio),
    asleep=asleep,
)
