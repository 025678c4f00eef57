"""KV cache size, layer by layer: `2 x kv_heads x head_dim x bytes x tokens`.

A full-attention layer holds the whole context of each sequence; a sliding-window layer at most the
window. llama.cpp sizes a sliding-window cache at `window + n_ubatch` cells per sequence (it must hold a
whole micro-batch beyond the window), vLLM at the window; both are capped at the context.
"""

from __future__ import annotations

from mellum_proxy.planning.shapes import ModelShape

# Bytes per cached value: f16/bf16 2; q8_0 34 bytes per 32 values; q4_0 18 per 32; fp8 1 (ggml / vLLM).
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "fp8": 1.0}


def window_tokens(shape: ModelShape, context: int, window_extra: int = 0) -> int:
    """Tokens one sliding-window layer keeps for one sequence (`window_extra`: what its server keeps beyond the
    window, `Memory.window_extra_tokens`)."""
    assert shape.window is not None
    return min(context, shape.window + window_extra)


def kv_bytes(shape: ModelShape, context: int, sequences: int = 1, dtype: str = "f16", window_extra: int = 0) -> int:
    """KV cache bytes for `sequences` sequences of `context` tokens each."""
    per_token_layer = 2 * shape.kv_heads * shape.head_dim * KV_BYTES[dtype]
    total = 0.0
    for kind in shape.kinds():
        tokens = context if kind == "full" or shape.window is None else window_tokens(shape, context, window_extra)
        total += per_token_layer * tokens
    return round(total * sequences)


def kv_bytes_per_token(shape: ModelShape, dtype: str = "f16") -> int:
    """Per token of context with every layer full (the number vendors quote; an upper bound with SWA)."""
    return round(2 * shape.kv_heads * shape.head_dim * KV_BYTES[dtype] * shape.layers)
