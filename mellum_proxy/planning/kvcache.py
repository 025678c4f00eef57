"""KV cache size, layer by layer: `2 x kv_heads x head_dim x bytes x tokens`.

A full-attention layer holds the whole context of each sequence; a sliding-window layer at most the
window. llama.cpp sizes a sliding-window cache at `window + n_ubatch` cells per sequence (it must hold a
whole micro-batch beyond the window), vLLM at the window; both are capped at the context.
"""

from __future__ import annotations

from mellum_proxy.planning.shapes import ModelShape

# Bytes per cached value: f16/bf16 2; q8_0 34 bytes per 32 values; q4_0 18 per 32; fp8 1 (ggml / vLLM).
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "fp8": 1.0}
LLAMA_CPP_UBATCH = 512  # llama.cpp's default n_ubatch


def window_tokens(shape: ModelShape, context: int, backend: str) -> int:
    """Tokens one sliding-window layer keeps for one sequence."""
    assert shape.window is not None
    extra = LLAMA_CPP_UBATCH if backend in ("llama.cpp", "ollama") else 0
    return min(context, shape.window + extra)


def kv_bytes(shape: ModelShape, context: int, sequences: int = 1, dtype: str = "f16", backend: str = "vllm") -> int:
    """KV cache bytes for `sequences` sequences of `context` tokens each."""
    per_token_layer = 2 * shape.kv_heads * shape.head_dim * KV_BYTES[dtype]
    total = 0.0
    for kind in shape.kinds():
        tokens = context if kind == "full" or shape.window is None else window_tokens(shape, context, backend)
        total += per_token_layer * tokens
    return round(total * sequences)


def kv_bytes_per_token(shape: ModelShape, dtype: str = "f16") -> int:
    """Per token of context with every layer full (the number vendors quote; an upper bound with SWA)."""
    return round(2 * shape.kv_heads * shape.head_dim * KV_BYTES[dtype] * shape.layers)
