"""`ModelShape`: what the memory planner needs to know about a model, from `config.json` or GGUF metadata.

Parameters are counted from the shape (embeddings, attention, dense or MoE MLP). An MoE keeps every
expert resident, so weights follow the *total* parameters; only speed follows the *active* ones.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any

# llama.cpp hardcodes which layers of these architectures use sliding-window attention (GGUF metadata
# carries only the window): every Nth layer is full attention.
GGUF_SWA_PERIOD = {"gemma3": 6, "gemma2": 2, "cohere2": 4, "llama4": 4, "mellum": 4}


@dataclass(frozen=True)
class ModelShape:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_context: int
    intermediate: int = 0
    layer_kinds: tuple[str, ...] = ()  # "full" or "sliding" per layer; empty means all full
    window: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    tied_embeddings: bool = False
    dtype: str | None = None
    notes: tuple[str, ...] = field(default=())

    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds or ("full",) * self.layers

    @property
    def full_layers(self) -> int:
        return sum(kind == "full" for kind in self.kinds())

    @property
    def sliding_layers(self) -> int:
        return self.layers - self.full_layers

    def _attention_params(self) -> int:
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        return self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden + 2 * self.hidden

    def _embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def _mlp_params(self, active: bool) -> int:
        if self.experts:
            per_expert = 3 * self.hidden * self.moe_intermediate
            count = self.experts_per_token if active else self.experts
            return count * per_expert + self.hidden * self.experts  # experts + router
        return 3 * self.hidden * self.intermediate

    @property
    def params_total(self) -> int:
        return self._embedding_params() + self.layers * (self._attention_params() + self._mlp_params(active=False))

    @property
    def params_active(self) -> int:
        return self._embedding_params() + self.layers * (self._attention_params() + self._mlp_params(active=True))


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A Hugging Face `config.json` (Llama, Qwen, Mistral, Gemma, Mellum and other GQA/MoE layouts)."""
    text = config.get("text_config", config)  # multimodal wrappers keep the LM under text_config
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    layers = int(text["num_hidden_layers"])
    window = text.get("sliding_window")
    kinds: tuple[str, ...] = ()
    notes = []
    if isinstance(text.get("layer_types"), list):
        kinds = tuple("sliding" if "sliding" in str(kind) else "full" for kind in text["layer_types"])
    elif window and text.get("use_sliding_window", True):
        kinds = ("sliding",) * layers
        notes.append("sliding_window without layer_types: every layer taken as windowed")
    if not any(kind == "sliding" for kind in kinds):
        window = None
    return ModelShape(
        arch=str(text.get("model_type") or (config.get("architectures") or ["unknown"])[0]),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab=int(text["vocab_size"]),
        max_context=int(text.get("max_position_embeddings") or 0),
        intermediate=int(text.get("intermediate_size") or 0),
        layer_kinds=kinds,
        window=int(window) if window else None,
        experts=int(text.get("num_experts") or text.get("num_local_experts") or 0),
        experts_per_token=int(text.get("num_experts_per_tok") or 0),
        moe_intermediate=int(text.get("moe_intermediate_size") or 0),
        tied_embeddings=bool(text.get("tie_word_embeddings", False)),
        dtype=text.get("torch_dtype") or text.get("dtype"),
        notes=tuple(notes),
    )


def shape_from_gguf(metadata: dict[str, Any], tied_embeddings: bool = False) -> ModelShape:
    """GGUF metadata (`general.architecture` and `{arch}.*` keys) as read by the `gguf` package."""
    arch = str(metadata["general.architecture"])

    def get(key: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    layers = int(get("block_count"))
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    kv_heads = get("attention.head_count_kv", heads)
    window = get("attention.sliding_window")
    notes = []
    kinds: tuple[str, ...] = ()
    if window:
        pattern = get("attention.sliding_window_pattern")
        if isinstance(pattern, list) and len(pattern) == layers:
            kinds = tuple("sliding" if flag else "full" for flag in pattern)
        elif arch in GGUF_SWA_PERIOD:
            period = GGUF_SWA_PERIOD[arch]
            kinds = tuple("full" if (i + 1) % period == 0 else "sliding" for i in range(layers))
            notes.append(f"{arch}: every {period}th layer is full attention (llama.cpp's own rule)")
        else:
            notes.append("sliding window given but not which layers: every layer taken as full (an upper bound)")
    vocab = metadata.get("tokenizer.ggml.tokens")
    return ModelShape(
        arch=arch,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=int(kv_heads[0] if isinstance(kv_heads, list) else kv_heads),
        head_dim=int(get("attention.key_length") or hidden // heads),
        vocab=len(vocab) if isinstance(vocab, Sized) and not isinstance(vocab, str) else int(get("vocab_size") or 0),
        max_context=int(get("context_length") or 0),
        intermediate=int(get("feed_forward_length") or 0),
        layer_kinds=kinds,
        window=int(window) if window and kinds else None,
        experts=int(get("expert_count") or 0),
        experts_per_token=int(get("expert_used_count") or 0),
        moe_intermediate=int(get("expert_feed_forward_length") or 0),
        tied_embeddings=tied_embeddings,
        notes=tuple(notes),
    )


# The architecture assumed when only a parameter count is given (`sweep --total-b`).
ASSUMED_ARCH = ModelShape(
    arch="llama-gqa (assumed)",
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=128256,
    max_context=131072,
    intermediate=14336,
    notes=("architecture assumed: Llama-3-8B-like, 32 layers, 8 KV heads of 128",),
)
