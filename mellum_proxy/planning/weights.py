"""Weight files of a model directory or GGUF, their bytes, and the precision they are stored in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")

# Typical bits per weight of whole files, for estimating a quantization that is not on disk
# (llama.cpp k-quant mixes keep some tensors at higher precision; AWQ/GPTQ add group scales).
BITS_PER_WEIGHT = {
    "q2": 3.0,
    "q3": 3.9,
    "q4": 4.9,
    "q5": 5.7,
    "q6": 6.6,
    "q8": 8.5,
    "fp8": 8.0,
    "int8": 8.5,
    "int4": 4.5,
    "awq": 4.25,
    "gptq": 4.25,
    "f16": 16.0,
    "fp16": 16.0,
    "bf16": 16.0,
    "fp32": 32.0,
    "f32": 32.0,
}
QUANT_ALIASES = {"q4": "Q4_K_M", "q5": "Q5_K_M", "q6": "Q6_K", "q8": "Q8_0", "q2": "Q2_K", "q3": "Q3_K_M"}
_GGUF_NAME = re.compile(r"(?i)(?<![a-z0-9])(IQ\d_[A-Z0-9]+|Q\d_K_[SML]|Q\d_K|Q\d_\d|BF16|F16|F32)(?![a-z0-9])")


@dataclass(frozen=True, slots=True)
class WeightFiles:
    files: tuple[Path, ...]
    total_bytes: int
    precision: str
    sharded: bool


def precision_tag(names: list[str], config: dict[str, Any] | None) -> str:
    """fp32/fp16/bf16/fp8/int8/int4, AWQ or GPTQ (with group size), or a GGUF quant name (Q4_K_M, ...)."""
    quant = (config or {}).get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method in ("awq", "gptq"):
        group = quant.get("group_size")
        bits = quant.get("bits") or quant.get("w_bit")
        return f"{method.upper()} int{bits or 4}" + (f" g{group}" if group else "")
    if method == "fp8" or "fp8" in str(quant.get("quant_type", "")).lower():
        return "fp8"
    if method in ("bitsandbytes",):
        return "int4" if quant.get("load_in_4bit") else "int8"
    for name in names:
        match = _GGUF_NAME.search(name)
        if match and name.lower().endswith(".gguf"):
            return match[1].upper()
    lowered = " ".join(names).lower()
    for tag in ("awq", "gptq", "fp8", "int8", "int4"):
        if tag in lowered:
            return tag.upper() if tag in ("awq", "gptq") else tag
    dtype = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "")
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype or "unknown")


def weight_files(directory: Path, config: dict[str, Any] | None) -> WeightFiles:
    """The weights of a model directory: a sharded `*.index.json` manifest, else every weight file."""
    manifests = sorted(directory.glob("*.index.json"))
    if manifests:
        index = orjson.loads(manifests[0].read_bytes())
        names = sorted(set(index.get("weight_map", {}).values()))
        files = tuple(directory / name for name in names)
        missing = [f.name for f in files if not f.exists()]
        declared = (index.get("metadata") or {}).get("total_size")
        if missing and declared:  # a config-only checkout: trust the manifest's total
            return WeightFiles(files, int(declared), precision_tag(names, config), sharded=True)
        total = sum(f.stat().st_size for f in files if f.exists())
        return WeightFiles(files, total, precision_tag(names, config), sharded=True)
    files = tuple(sorted(p for p in directory.iterdir() if p.suffix in WEIGHT_SUFFIXES))
    total = sum(f.stat().st_size for f in files)
    return WeightFiles(files, total, precision_tag([f.name for f in files], config), sharded=False)


def bits_for(quant: str) -> float:
    """Bits per weight of a quantization name (`q4`, `Q4_K_M`, `bf16`, `AWQ int4 g128`, ...)."""
    key = quant.lower().replace("_", "")
    for name, bits in sorted(BITS_PER_WEIGHT.items(), key=lambda item: -len(item[0])):
        if key.startswith(name.replace("_", "")):
            return bits
    if key.startswith("iq"):
        return 3.5
    raise ValueError(f"unknown quantization '{quant}' (known: {', '.join(BITS_PER_WEIGHT)})")
