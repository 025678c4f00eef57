"""`mellum-proxy editor-config NAME`: a plugin's config file, filled in with the proxy's settings.

The templates are package data; `editor-configs/` in the repository holds them rendered with the
defaults (a test keeps the two equal). Plugin-side settings follow the tuning guide: one request in
flight, the request timeout and context the proxy enforces, and a trigger delay that adds nothing the
proxy would not: 1 ms under `dispatch=adaptive` (the proxy decides each hold, and a plugin-side delay
would be added to every pause), `debounce_ms` under `dispatch=fixed`.
"""

from __future__ import annotations

from importlib.resources import files
from string import Template

from mellum_proxy.config import Settings

CONFIGS = {
    "continue": "continue.yaml",
    "llama-vscode": "llama-vscode.json",
    "llama-vim": "llama-vim.vim",
    "minuet": "minuet.lua",
    "twinny": "twinny.json",
    "tabby": "tabby.toml",
    "jetbrains": "jetbrains-ai-assistant.md",
    "zed": "zed.json",
    "copilot-llm-gateway": "copilot-llm-gateway.json",
    "cursortab": "cursortab.lua",
    "sweep": "sweep-vscode.json",
}


# A plugin's own request timeout must leave room for the proxy's answer at its deadline: a client that gives up
# at the same moment never reads it (minuet's `curl --max-time`, with `stream = false`, loses every such answer).
ANSWER_ROOM_MS = 500


def values(settings: Settings) -> dict[str, str]:
    host = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::", "") else settings.listen_host
    base = f"http://{host}:{settings.listen_port}"
    return {
        "base_url": base,
        "host": host,
        "port": str(settings.listen_port),
        "debounce_ms": str(max(settings.debounce_ms, 1) if settings.dispatch_rule == "fixed" else 1),
        "timeout_ms": str(settings.timeout_ms or 1500),
        "client_timeout_ms": str((settings.timeout_ms or 1500) + ANSWER_ROOM_MS),
        "client_timeout_s": f"{((settings.timeout_ms or 1500) + ANSWER_ROOM_MS) / 1000:g}",
        "max_context_tokens": str(settings.max_context_tokens),
        "max_tokens": str(settings.max_tokens),
        "prompt_tokens": str(settings.max_context_tokens - settings.max_tokens),  # room left for the completion
        "api_key": settings.auth_token or "",
        "api_key_or_none": settings.auth_token or "none",
        "api_key_env": "MELLUM_PROXY_AUTH_TOKEN" if settings.auth_token else "TERM",
        "api_key_env_if_token": "MELLUM_PROXY_AUTH_TOKEN" if settings.auth_token else "",
        "api_key_note": " (export it with the proxy's auth_token)"
        if settings.auth_token
        else " (always set; the proxy checks keys only with an auth_token)",
    }


def render(name: str, settings: Settings) -> str:
    """The config of plugin `name` (a key of CONFIGS) for these settings."""
    template = files("mellum_proxy.editor").joinpath("templates", CONFIGS[name]).read_text()
    return Template(template).substitute(values(settings))
