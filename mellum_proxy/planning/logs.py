"""`mellum-proxy inspect-log FILE`: what a server says it allocated at start-up, beside the estimate.

Read lines of vLLM, llama.cpp / llama-server and Ollama; each finding keeps the line it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MIB, GIB = 2**20, 2**30
_UNITS = {"kib": 2**10, "mib": MIB, "gib": GIB, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit.lower()])


@dataclass
class LogReport:
    backend: str | None = None
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.evidence.append(line.strip()[:200])


_LLAMA = [
    # current builds: "load_tensors: CUDA0 model buffer size"; older: "llm_load_tensors: ROCm0 buffer size"
    (re.compile(r"load_tensors:\s+(\S+) (?:model )?buffer size =\s+([\d.]+) (MiB|GiB)"), "model_buffer"),
    # every build prints "KV buffer size" once per cache; newer ones add a "size = ... cells" line for it
    (re.compile(r"KV buffer size =\s+([\d.]+) (MiB|GiB)"), "kv"),
    (re.compile(r"llama_kv_cache(?:_unified)?: size =\s+[\d.]+ \w+ \(\s*(\d+) cells,\s+(\d+) layers"), "kv_cells"),
    # `(?<!\S)`: a device name starts after a space or at the line start; without it a long line without spaces
    # makes the search quadratic (each start position runs `\S+` to the end of the line)
    (re.compile(r"(?<!\S)(\S+) compute buffer size =\s+([\d.]+) (MiB|GiB)"), "compute"),
    (re.compile(r"offloaded (\d+)/(\d+) layers to GPU"), "offload"),
    (re.compile(r"print_info: file type\s+=\s+(.+)$"), "file_type"),
    (re.compile(r"llama_context: n_ctx\s+=\s+(\d+)"), "n_ctx"),
    (re.compile(r"llama_context: n_ctx_seq\s+=\s+(\d+)"), "n_ctx_seq"),
    (re.compile(r"llama_context: n_seq_max\s+=\s+(\d+)"), "n_seq_max"),
    (re.compile(r"K \((\w+)\):"), "kv_type"),
]
_VLLM = [
    (re.compile(r"(?:Model loading|Loading model weights) took ([\d.]+) (GiB|GB|MiB)"), "weights"),
    (re.compile(r"Available KV cache memory: ([\d.]+) (GiB|GB|MiB)"), "kv"),
    (re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"), "kv_tokens"),
    # the CPU build: the checkpoint as loaded, and the KV cache pool VLLM_CPU_KVCACHE_SPACE set
    (re.compile(r"Checkpoint size: ([\d.]+) (GiB|GB|MiB)"), "checkpoint"),
    (re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) (GiB) for KV cache"), "kv"),
    (re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"), "concurrency"),
]
_OLLAMA = re.compile(r'memory\.(required\.full|required\.kv|weights\.total|graph\.full)="([\d.]+) (GiB|MiB|KiB|B)"')


def parse_log(text: str) -> LogReport:
    report = LogReport()
    for line in text.splitlines():
        _llama_line(report, line)
        _vllm_line(report, line)
        _ollama_line(report, line)
    return report


def _llama_line(report: LogReport, line: str) -> None:
    for pattern, kind in _LLAMA:
        match = pattern.search(line)
        if not match:
            continue
        report.backend = report.backend or "llama.cpp"
        if kind == "model_buffer" and "REPACK" not in match[1]:  # a repack buffer is a CPU-side copy
            report.weights_bytes += _bytes(match[2], match[3])
            report.note(line)
        elif kind == "kv":
            report.kv_bytes += _bytes(match[1], match[2])
            report.note(line)
        elif kind == "kv_cells":
            report.facts.setdefault("kv_caches", []).append({"cells": int(match[1]), "layers": int(match[2])})
        elif kind == "compute":
            report.compute_bytes += _bytes(match[2], match[3])
        elif kind == "offload":
            report.facts["offloaded_layers"] = f"{match[1]}/{match[2]}"
            report.note(line)
        elif kind == "file_type":
            report.facts["file_type"] = match[1].strip()
        elif kind in ("n_ctx", "n_ctx_seq", "n_seq_max"):
            report.facts[kind] = int(match[1])
        elif kind == "kv_type":
            report.facts["kv_type"] = match[1]


def _vllm_line(report: LogReport, line: str) -> None:
    for pattern, kind in _VLLM:
        match = pattern.search(line)
        if not match:
            continue
        report.backend = "vllm"
        report.note(line)
        if kind == "weights":
            report.weights_bytes = _bytes(match[1], match[2])
        elif kind == "checkpoint" and not report.weights_bytes:  # "Model loading took" says more, where it is
            report.weights_bytes = _bytes(match[1], match[2])
        elif kind == "kv":
            report.kv_bytes = _bytes(match[1], match[2])
        elif kind == "kv_tokens":
            report.facts["kv_cache_tokens"] = int(match[1].replace(",", ""))
        elif kind == "concurrency":
            report.facts["max_concurrency"] = {
                "tokens_per_request": int(match[1].replace(",", "")),
                "times": float(match[2]),
            }


def _ollama_line(report: LogReport, line: str) -> None:
    found = _OLLAMA.findall(line)
    if not found:
        return
    report.backend = "ollama"
    report.note(line)
    for key, number, unit in found:
        size = _bytes(number, unit)
        if key == "weights.total":
            report.weights_bytes = size
        elif key == "required.kv":
            report.kv_bytes = size
        elif key == "required.full":
            report.facts["required_full_bytes"] = size
        elif key == "graph.full":
            report.compute_bytes = size


def compare(measured: int, estimated: int) -> dict[str, Any]:
    error = (estimated - measured) / measured if measured else None
    return {"measured_bytes": measured, "estimated_bytes": estimated, "error": error}
