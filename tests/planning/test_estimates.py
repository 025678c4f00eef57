"""Shapes, parameters and KV cache of the Mellum reference configs; directories, shards and GGUF files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mellum_proxy.planning.inspect import BUNDLED, InspectError, bundled_shape, inspect_path, report
from mellum_proxy.planning.kvcache import kv_bytes, kv_bytes_per_token
from mellum_proxy.planning.weights import precision_tag
from mellum_proxy.upstream.servers import memory_of

KIB, GIB = 1024, 2**30


def test_mellum_4b_kv_is_360_kib_per_token_in_f16() -> None:
    shape = bundled_shape("mellum-4b")
    assert (shape.kv_heads, shape.head_dim, shape.layers) == (24, 128, 30)
    assert kv_bytes_per_token(shape, "f16") == 360 * KIB
    assert kv_bytes(shape, 8192, 1, "f16") == 360 * KIB * 8192  # no sliding window: every layer full
    assert kv_bytes(shape, 8192, 1, "q8_0") == round(360 * KIB * 8192 * 34 / 64)
    assert round(shape.params_total / 1e9, 2) == 4.02


def test_mellum_2_1_kv_is_sliding_window_aware() -> None:
    shape = bundled_shape("mellum2.1")
    assert (shape.full_layers, shape.sliding_layers, shape.window) == (7, 21, 1024)
    assert (shape.heads, shape.kv_heads) == (32, 4)  # GQA 8:1
    per_layer_token = 2 * 4 * 128 * 2
    for context in (32768, 131072):
        naive = kv_bytes_per_token(shape, "f16") * context
        aware = kv_bytes(shape, context, 1, "f16", memory_of("vllm").window_extra_tokens)
        assert aware == per_layer_token * (7 * context + 21 * 1024)
        assert aware < 0.3 * naive
    assert kv_bytes(shape, 512, 1) == kv_bytes_per_token(shape) * 512  # shorter than the window: all layers
    # llama.cpp keeps window + n_ubatch cells in its sliding-window cache
    extra = memory_of("llama.cpp").window_extra_tokens
    assert kv_bytes(shape, 32768, 1, "f16", extra) == per_layer_token * (7 * 32768 + 21 * 1536)


def test_mellum_2_1_moe_parameters() -> None:
    shape = bundled_shape("mellum2.1")
    assert round(shape.params_total / 1e9, 2) == 12.15
    assert 2.3e9 < shape.params_active < 2.6e9  # published: 2.5 B active


def test_config_only_directory(tmp_path: Path) -> None:
    info = inspect_path(BUNDLED / "mellum2.1-12b-a2.5b")
    assert info.weights_bytes == 0 and info.precision == "bf16"
    data = report(info)
    assert data["shape"]["sliding_layers"] == 21 and data["kv_cache"]["f16"]["per_token_all_layers_bytes"] == 57344


def test_sharded_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((BUNDLED / "mellum-4b-base" / "config.json").read_text())
    shards = {"model-00001-of-00002.safetensors": 1000, "model-00002-of-00002.safetensors": 500}
    for name, size in shards.items():
        (tmp_path / name).write_bytes(b"\0" * size)
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    info = inspect_path(tmp_path)
    assert info.weights_bytes == 1500 and info.precision == "bf16" and len(info.files) == 2


def test_sharded_manifest_without_shards_uses_its_total(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((BUNDLED / "mellum2.1-12b-a2.5b" / "config.json").read_text())
    manifest = {"metadata": {"total_size": 24300538808}, "weight_map": {"x": "model-00001-of-00005.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(manifest))
    assert inspect_path(tmp_path).weights_bytes == 24300538808


@pytest.mark.parametrize(
    ("names", "config", "tag"),
    [
        (["mellum-4b-base.Q4_K_M.gguf"], None, "Q4_K_M"),
        (["Mellum-4b-sft-python-Q8_0.gguf"], None, "Q8_0"),
        (["model.safetensors"], {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}},
         "AWQ int4 g128"),
        (["model.safetensors"], {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}},
         "GPTQ int4 g32"),
        (["model.safetensors"], {"quantization_config": {"quant_method": "fp8"}}, "fp8"),
        (["model.safetensors"], {"torch_dtype": "float16"}, "fp16"),
        (["model-int8.safetensors"], {}, "int8"),
    ],
)  # fmt: skip
def test_precision_tags(names: list[str], config: dict[str, object] | None, tag: str) -> None:
    assert precision_tag(names, config) == tag


def write_gguf(path: Path, vocab: int = 32) -> None:
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_scores([0.5] * vocab)  # a long array of numbers, skipped by its length
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float16))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32), raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    info = inspect_path(path)
    assert info.precision == "F16"
    assert info.tensor_bytes_by_type == {"F16": 32 * 64 * 2, "F32": 64 * 64 * 4}
    assert info.weights_bytes == 32 * 64 * 2 + 64 * 64 * 4
    shape = info.shape
    assert (shape.arch, shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.vocab) == (
        "llama",
        2,
        4,
        2,
        16,
        32,
    )
    assert kv_bytes(shape, 1000) == 2 * 2 * 16 * 2 * 1000 * 2
    assert shape.tied_embeddings  # no output.weight tensor


def test_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match="neither"):
        inspect_path(tmp_path / "nothing.bin")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(InspectError, match="GGUF"):
        inspect_path(tmp_path / "bad.gguf")


def test_the_header_reader_agrees_with_the_gguf_package(tmp_path: Path) -> None:
    """`inspect` reads a GGUF's header itself (0.5 s for the embedded model, against 8.9 s through `GGUFReader`,
    which reads every token string): the same metadata and tensor sizes, a long array only counted."""
    from gguf import GGUFReader

    from mellum_proxy.planning.gguf_header import LongArray, read_header

    path = tmp_path / "tiny.gguf"
    write_gguf(path, vocab=5000)
    metadata, tensors = read_header(path)
    reader = GGUFReader(str(path))
    assert [(t.name, t.type_name, t.n_bytes) for t in tensors] == [
        (t.name, t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors
    ]
    for name, field in reader.fields.items():
        if not name.startswith("GGUF."):
            expected = field.contents()
            assert metadata[name] == (LongArray(len(expected)) if isinstance(expected, list) and len(expected) > 4096
                                      else expected)  # fmt: skip
    assert inspect_path(path).shape.vocab == 5000
