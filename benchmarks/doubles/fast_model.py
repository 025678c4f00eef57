"""A real llama.cpp server at GPU-like speed on a CPU: a llama-architecture GGUF with random weights and
gemma-3's vocabulary (the packaged model's tokenizer), small enough that llama.cpp prefills thousands of tokens a
second here. Its text is noise; its timing and its scheduling (slots, batching, the let-go of a cancelled
request) are llama.cpp's own, which is what the lab is checked against.

`python -m benchmarks fast-model` (`benchmarks.runners.fast_model`) writes one; `fast_model()` builds the
default one once into the cache, for `--upstream fast` and the suite.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class FastShape:
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    context: int = 8192
    seed: int = 0

    @property
    def name(self) -> str:
        return f"fast-h{self.hidden}-l{self.layers}-a{self.heads}-kv{self.kv_heads}-f{self.ffn}-s{self.seed}"


def fast_model(shape: FastShape = FastShape()) -> Path:
    """The fast model of `shape`, built once into the cache (`$XDG_CACHE_HOME/mellum-proxy`)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mellum-proxy"
    path = cache / f"{shape.name}.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, suffix=".part", delete=False) as part:
            temporary = Path(part.name)
        try:
            write_fast_model(temporary, shape)
            temporary.replace(path)  # whole or not at all: another process may be building it too
        finally:
            temporary.unlink(missing_ok=True)
    return path


def write_fast_model(out: Path, shape: FastShape = FastShape()) -> None:
    """Write the GGUF: llama architecture, f16 embeddings (tied to the output), f32 norms, f16 weights.

    Raises:
        RuntimeError: the packaged model (for its vocabulary) is not installed.
    """
    import gguf
    import numpy as np

    from mellum_proxy.upstream.embedded import packaged_model

    vocabulary = gguf.GGUFReader(str(packaged_model()))
    rng = np.random.default_rng(shape.seed)
    head_dim = shape.hidden // shape.heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(shape.name)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in vocabulary.fields.items():
        if key.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    vocab = len(vocabulary.fields["tokenizer.ggml.tokens"].data)

    def weight(rows: int, columns: int) -> Any:
        return (rng.standard_normal((rows, columns)) / np.sqrt(columns)).astype(np.float16)

    writer.add_tensor("token_embd.weight", weight(vocab, shape.hidden))
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    kv = shape.kv_heads * head_dim
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"{block}.attn_k.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"{block}.attn_v.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"{block}.attn_output.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(shape.ffn, shape.hidden))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(shape.ffn, shape.hidden))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(shape.hidden, shape.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
