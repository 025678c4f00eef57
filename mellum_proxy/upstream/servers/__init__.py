"""The kinds of model server the proxy knows, one module each, as the editor dialects are in `dialects/`.

Adding a kind is a module with a `ServerKind` and one line in `KINDS` (or `register(kind)`): the `upstream_kind`
setting takes its name, detection asks its probe, discovery, the completion wire, the held count, `/tokenize`, the
context-overflow phrasings, `fit`'s server flags and, with `memory`, the planning tools (`sweep --backend`, `fit`,
`inspect-log`: its overhead, start-up log lines and KV layout) follow. Detection goes in `KINDS`' order, and a
server nothing tells apart is `openai`, the last.
"""

from __future__ import annotations

from typing import Any, Protocol

from mellum_proxy.errors import ProxyError, UpstreamError, UpstreamStatusError
from mellum_proxy.upstream.servers.base import Found, Memory, ServerKind, TokenizeShape, Transport
from mellum_proxy.upstream.servers.llamacpp import LLAMACPP
from mellum_proxy.upstream.servers.lmstudio import LMSTUDIO
from mellum_proxy.upstream.servers.ollama import OLLAMA
from mellum_proxy.upstream.servers.openai import OPENAI
from mellum_proxy.upstream.servers.vllm import VLLM

KINDS: list[ServerKind] = [LLAMACPP, OLLAMA, VLLM, LMSTUDIO, OPENAI]
GENERIC = OPENAI  # what a server is until discovery says more (it asks every kind's sources)

__all__ = [
    "GENERIC",
    "KINDS",
    "Found",
    "Memory",
    "ServerKind",
    "Transport",
    "detect",
    "discover",
    "kind_named",
    "register",
]


class Client(Transport, Protocol):
    """A transport that completes through a kind (`UpstreamClient`)."""

    kind: ServerKind


def register(kind: ServerKind) -> None:
    """Add a kind, detected before the fallback; a kind of the same name is replaced."""
    KINDS[:] = [known for known in KINDS if known.name != kind.name]
    KINDS.insert(len(KINDS) - 1, kind)


def kind_names() -> tuple[str, ...]:
    return tuple(kind.name for kind in KINDS)


def memory_of(name: str) -> Memory:
    """The planning tools' facts of the kind named `name` (`sweep --backend`, `fit`, `inspect-log`).

    Raises: ValueError for a name no kind that loads models itself has."""
    memory = kind_named(name).memory
    if memory is None:
        raise ValueError(f"server kind '{name}' loads no model itself ({', '.join(loader_names())})")
    return memory


def loader_names() -> tuple[str, ...]:
    """The kinds that load a model themselves: what the planning tools plan for."""
    return tuple(kind.name for kind in KINDS if kind.memory is not None)


def kind_named(name: str) -> ServerKind:
    """Raises: ValueError for a name no kind has."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"unknown server kind '{name}' (auto, {', '.join(kind_names())})")


async def detect(upstream: Transport) -> ServerKind:
    """The server's kind from what it answers (each probe path asked once); `openai` when nothing tells."""
    answers: dict[str, Any] = {}
    for kind in KINDS:
        if kind.probe is None:
            continue
        path, says = kind.probe
        if path not in answers:
            try:
                answers[path] = await upstream.get_json(path, timeout_s=1.0)
            except UpstreamError:
                answers[path] = None
        if says(answers[path]):
            return kind
    return OPENAI


async def discover(upstream: Client, kind: str = "auto") -> Found:
    """Kind, served model, context per request and slots, each as far as the server says; the client completes
    through the kind from now on."""
    chosen = await detect(upstream) if kind == "auto" else kind_named(kind)
    upstream.kind = chosen
    return await chosen.discover(upstream)


async def slot_count(upstream: Client) -> int | None:
    """The server's slots where its kind says them (any kind that can, while the kind is not known)."""
    kinds = KINDS if upstream.kind is GENERIC else [upstream.kind]
    for kind in kinds:
        if kind.count_slots is not None and (slots := await kind.count_slots(upstream)) is not None:
            return slots
    return None


def says_slots(name: str) -> bool:
    """Whether a kind says its slots (the others keep the setting, or 1)."""
    return kind_named(name).count_slots is not None


def holding_kinds(kind: ServerKind) -> list[ServerKind]:
    """The kinds whose `/metrics` gauges and `/slots` say what this server holds."""
    return [known for known in KINDS if known.held_gauges or known.holds_in_slots] if kind is GENERIC else [kind]


def tokenize_shapes() -> list[TokenizeShape]:
    return [kind.tokenize for kind in KINDS if kind.tokenize is not None]


def context_overflow(error: ProxyError) -> int | None:
    """For an upstream 400 that says the prompt did not fit its context (in any kind's words): the prompt tokens
    the server counted (0 when it did not say how many); None for any other error."""
    if not isinstance(error, UpstreamStatusError) or error.upstream_status != 400:
        return None
    text = f"{error.type} {error.message}"
    said = [kind.overflow for kind in KINDS if kind.overflow is not None]
    if not any(phrase in text.lower() for overflow in said for phrase in overflow.phrases):
        return None
    for overflow in said:
        for pattern in overflow.counted:
            if found := pattern.search(text):
                return int(found.group(1))
    return 0
