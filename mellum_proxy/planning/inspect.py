"""`mellum-proxy inspect PATH`: what is loaded, in which precision and shape, and what its KV cache costs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.planning.gguf_header import HeaderError, TensorInfo, read_header
from mellum_proxy.planning.kvcache import KV_BYTES, kv_bytes, kv_bytes_per_token
from mellum_proxy.planning.shapes import ModelShape, shape_from_config, shape_from_gguf
from mellum_proxy.planning.weights import precision_tag, weight_files

BUNDLED = Path(__file__).parent / "configs"  # Mellum reference configs, for --arch and the tests


class InspectError(ValueError):
    """PATH is not a model this tool can read (the message says why)."""


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    shape: ModelShape
    weights_bytes: int
    precision: str
    files: tuple[str, ...] = ()
    tensor_bytes_by_type: dict[str, int] = field(default_factory=dict)


def inspect_path(path: Path) -> ModelInfo:
    """Read a Hugging Face model directory (config.json + weights) or a .gguf file."""
    if path.is_dir():
        return _inspect_directory(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _inspect_gguf(path)
    raise InspectError(f"{path} is neither a model directory with config.json nor a .gguf file")


def _inspect_directory(directory: Path) -> ModelInfo:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InspectError(f"{directory} has no config.json")
    try:
        config = orjson.loads(config_path.read_bytes())
        shape = shape_from_config(config)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InspectError(f"{config_path} is not a model config: {exc!r}") from exc
    weights = weight_files(directory, config)
    return ModelInfo(directory, shape, weights.total_bytes, weights.precision, tuple(f.name for f in weights.files))


def _inspect_gguf(path: Path) -> ModelInfo:
    from gguf import LlamaFileType

    try:
        metadata, tensors = read_header(path)  # the header only: GGUFReader reads every token (seconds)
    except HeaderError:
        metadata, tensors = _read_with_gguf(path)
    by_type: Counter[str] = Counter()
    for tensor in tensors:
        by_type[tensor.type_name] += tensor.n_bytes
    try:
        tied = not any(tensor.name == "output.weight" for tensor in tensors)  # no separate LM head
        shape = shape_from_gguf(metadata, tied_embeddings=tied)
    except (KeyError, TypeError, ValueError) as exc:
        raise InspectError(f"{path} lacks the model metadata the planner needs: {exc!r}") from exc
    file_type = metadata.get("general.file_type")
    try:
        tag = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        tag = ""
    precision = tag or precision_tag([path.name], None)
    return ModelInfo(path, shape, sum(by_type.values()), precision, (path.name,), dict(by_type))


def _read_with_gguf(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """What `read_header` reads, through the `gguf` package's reader (any byte order or version it knows)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError/struct.error/... for broken files
        raise InspectError(f"{path} is not a readable GGUF file: {exc}") from exc
    metadata: dict[str, Any] = {}
    for name, value in reader.fields.items():
        if name.startswith("tokenizer.ggml.") and name != "tokenizer.ggml.tokens":
            continue
        try:
            metadata[name] = value.contents()
        except Exception:  # a field of an unknown type says nothing we need
            continue
    tensors = [TensorInfo(t.name, t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors]
    return metadata, tensors


def bundled_shape(name: str) -> ModelShape:
    """A reference architecture shipped with the tool (`mellum-4b`, `mellum2.1`)."""
    folders = {"mellum-4b": "mellum-4b-base", "mellum2.1": "mellum2.1-12b-a2.5b"}
    if name not in folders:
        raise InspectError(f"unknown --arch '{name}' (known: {', '.join(folders)})")
    return shape_from_config(orjson.loads((BUNDLED / folders[name] / "config.json").read_bytes()))


def report(info: ModelInfo, contexts: tuple[int, ...] = (2048, 8192, 32768)) -> dict[str, Any]:
    """The tuning guide's table as data: weights, KV per token and per full context, the shape."""
    shape = info.shape
    kv = {}
    for dtype in KV_BYTES:
        kv[dtype] = {
            "per_token_all_layers_bytes": kv_bytes_per_token(shape, dtype),
            "per_sequence_bytes": {str(ctx): kv_bytes(shape, ctx, 1, dtype) for ctx in (*contexts, shape.max_context)},
        }
    return {
        "path": str(info.path),
        "arch": shape.arch,
        "precision": info.precision,
        "weights_bytes": info.weights_bytes,
        "weight_files": list(info.files),
        "tensor_bytes_by_type": info.tensor_bytes_by_type,
        "params_total": shape.params_total,
        "params_active": shape.params_active,
        "shape": {
            "layers": shape.layers,
            "hidden": shape.hidden,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "vocab": shape.vocab,
            "max_context": shape.max_context,
            "full_attention_layers": shape.full_layers,
            "sliding_layers": shape.sliding_layers,
            "sliding_window": shape.window,
            "experts": shape.experts,
            "experts_per_token": shape.experts_per_token,
            "moe_intermediate": shape.moe_intermediate,
            "dtype": shape.dtype,
        },
        "kv_cache": kv,
        "notes": list(shape.notes),
    }


def gib(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def render(data: dict[str, Any]) -> str:
    s = data["shape"]
    lines = [
        f"{data['path']}  ({data['arch']}, {data['precision']})",
        "",
        f"weights           {gib(data['weights_bytes'])}  ({len(data['weight_files'])} file(s))"
        if data["weight_files"]
        else "weights           no weight files here (a config only): see `sweep` for estimates",
        f"parameters        {data['params_total'] / 1e9:.2f} B total"
        + (
            f", {data['params_active'] / 1e9:.2f} B active per token (MoE: all experts stay resident; "
            "memory follows total, speed follows active)"
            if s["experts"]
            else ""
        ),
        f"layers            {s['layers']} ({s['full_attention_layers']} full attention"
        + (f", {s['sliding_layers']} sliding-window of {s['sliding_window']})" if s["sliding_layers"] else ")"),
        f"attention         {s['heads']} heads, {s['kv_heads']} KV heads (GQA {s['heads'] // s['kv_heads']}:1), "
        f"head_dim {s['head_dim']}",
        f"vocab, context    {s['vocab']}, {s['max_context']} tokens",
    ]
    if s["experts"]:
        lines.append(
            f"experts           {s['experts']}, {s['experts_per_token']} active, intermediate {s['moe_intermediate']}"
        )
    contexts = list(data["kv_cache"]["f16"]["per_sequence_bytes"])
    lines += [
        "",
        "KV cache (one sequence)  " + "".join(f"{'ctx ' + c:>14}" for c in contexts) + "   per token (all layers)",
    ]
    for dtype, row in data["kv_cache"].items():
        cells = "".join(f"{gib(row['per_sequence_bytes'][c]):>14}" for c in contexts)
        lines.append(f"  {dtype:<22} {cells}   {row['per_token_all_layers_bytes'] / 1024:.1f} KiB")
    if data["tensor_bytes_by_type"]:
        lines += [
            "",
            "tensor bytes by type: "
            + ", ".join(f"{k} {gib(v)}" for k, v in sorted(data["tensor_bytes_by_type"].items())),
        ]
    lines += [f"note: {note}" for note in data["notes"]]
    return "\n".join(lines)
