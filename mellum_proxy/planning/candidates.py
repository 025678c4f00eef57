"""The few candidates the paper sweep leaves to measure: never the whole grid.

The first is the sweep's own pick at the business context (the guide's order: the context the work needs, the most
precise quantization OK there, the largest batch that stays OK). Each other candidate is that pick with one
variable changed (one variable at a time): the largest context above it that is still OK or TIGHT, the next
model file, the next KV cache type, the next smaller batch (the fallback if the pick's batch fails on the machine).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from mellum_proxy.planning.inspect import ModelInfo
from mellum_proxy.planning.kvcache import KV_BYTES
from mellum_proxy.planning.sweep import Cell, SweepSpec, best, sweep
from mellum_proxy.planning.weights import bits_for

PASSING_LABELS = ("OK", "TIGHT")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One server configuration to measure, with the paper's estimate for it."""

    model: Path
    quant: str  # the model file's precision (Q4_K_M, BF16, ...)
    context: int  # tokens one request may hold (per sequence)
    batch: int  # sequences at once (llama.cpp slots, vLLM --max-num-seqs)
    kv_type: str
    paper: Cell
    why: str

    @property
    def name(self) -> str:
        return f"{self.quant} ctx {self.context} x{self.batch} kv {self.kv_type}"


def quant_bits(precision: str) -> float:
    """Bits per weight of a precision tag, for ordering (unknown tags sort last)."""
    try:
        return bits_for(precision)
    except ValueError:
        return 0.0


def paper_cells(
    models: list[ModelInfo], kv_types: tuple[str, ...], spec: SweepSpec
) -> list[tuple[ModelInfo, str, Cell]]:
    """Every cell of the sweep, per model file and KV cache type, each file weighed from its own bytes."""
    cells = []
    for info in models:
        for kv in kv_types:
            one = replace(spec, quants=(info.precision,), kv_dtype=kv)
            measured = (info.precision, info.weights_bytes) if info.weights_bytes else None
            cells += [(info, kv, cell) for cell in sweep(info.shape, one, measured)]
    return cells


def choose_candidates(
    models: list[ModelInfo], kv_types: tuple[str, ...], spec: SweepSpec, most: int = 3
) -> tuple[list[Candidate], str]:
    """Up to `most` candidates (the pick first), and why; none when nothing is OK at the business context."""
    business = spec.business_context or min(spec.contexts)
    cells = paper_cells(models, kv_types, spec)
    usable = [(info, kv, c) for info, kv, c in cells if c.label in PASSING_LABELS and c.context >= business]
    picks = []
    for info in models:
        for kv in kv_types:
            mine = [c for i, k, c in cells if i is info and k == kv]
            pick, _ = best(mine, replace(spec, quants=(info.precision,), kv_dtype=kv, business_context=business))
            if pick is not None:
                picks.append((info, kv, pick))
    if not picks:
        _, why = best([c for _, _, c in cells], replace(spec, business_context=business))
        return [], why
    # most precise weights, then the most precise cache, then the largest batch
    info, kv, pick = max(picks, key=lambda p: (quant_bits(p[0].precision), KV_BYTES[p[1]], p[2].batch))
    chosen = [Candidate(info.path, info.precision, pick.context, pick.batch, kv, pick, "the paper's pick")]

    def add(found: list[tuple[ModelInfo, str, Cell]], why: str) -> None:
        if found:
            i, k, c = found[0]
            chosen.append(Candidate(i.path, i.precision, c.context, c.batch, k, c, why))

    same = [(i, k, c) for i, k, c in usable if i is info and k == kv]
    add(sorted((x for x in same if x[2].batch == pick.batch and x[2].context > pick.context),
               key=lambda x: -x[2].context), "the largest context still OK or TIGHT (near the limit)")  # fmt: skip
    add(sorted((x for x in usable if x[0] is not info and x[1] == kv and x[2].context == pick.context
                and x[2].batch == pick.batch), key=lambda x: -quant_bits(x[0].precision)),
        "the next model file")  # fmt: skip
    add(sorted((x for x in usable if x[0] is info and x[1] != kv and x[2].context == pick.context
                and x[2].batch == pick.batch), key=lambda x: -KV_BYTES[x[1]]),
        "another KV cache type")  # fmt: skip
    add(sorted((x for x in same if x[2].context == pick.context and x[2].batch < pick.batch),
               key=lambda x: -x[2].batch), "a smaller batch (the fallback)")  # fmt: skip
    shown = len(chosen[:most])
    return chosen[:most], f"{shown} of {len(cells)} cells: the paper's pick, each other one variable away from it"
