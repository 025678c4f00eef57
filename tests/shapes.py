"""Each dialect's own error shape: OpenAI `{"error": {"message", "type"}}`, llama.cpp `{"error": {"code",
"message", "type"}}` (its `format_error_response`), Ollama `{"error": "message"}`."""

from __future__ import annotations

from typing import Any


def llamacpp_shape(body: Any, status: int) -> bool:
    error = body["error"]
    return set(error) == {"code", "message", "type"} and error["code"] == status and bool(error["message"])


def ollama_shape(body: Any, status: int) -> bool:
    return set(body) == {"error"} and isinstance(body["error"], str) and bool(body["error"])


def openai_shape(body: Any, status: int) -> bool:
    return set(body["error"]) == {"message", "type"}


SHAPES = {"/infill": llamacpp_shape, "/completion": llamacpp_shape, "/api/generate": ollama_shape,
          "/v1/completions": openai_shape}  # fmt: skip
NAMES = {"/infill": "llamacpp-infill", "/completion": "llamacpp-completion", "/api/generate": "ollama",
         "/v1/completions": "openai"}  # fmt: skip
