"""`mellum-proxy sweep`: weights + KV cache + runtime overhead over quantization x context x batch.

Each cell is labelled against the card: `OK` within `1 - margin` of it (the 15-30 % headroom the tuning
guides keep), `TIGHT` up to `target_util`, `OOM_RISK` beyond. The `best` pick follows the guide's order:
the business context first, then the most precise quantization that is OK there, then the largest batch that
stays OK. It never picks the fullest card.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mellum_proxy.planning.kvcache import kv_bytes
from mellum_proxy.planning.shapes import ModelShape
from mellum_proxy.planning.weights import QUANT_ALIASES, bits_for
from mellum_proxy.upstream.servers import memory_of
from mellum_proxy.upstream.servers.vllm import VLLM

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Cell:
    quant: str
    context: int
    batch: int
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    total_bytes: int
    utilization: float
    label: str


@dataclass(frozen=True, slots=True)
class SweepSpec:
    gpu_gib: float
    quants: tuple[str, ...]
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    margin: float = 0.25
    target_util: float = 0.85
    kv_dtype: str = "f16"
    backend: str = VLLM.name  # a server kind that loads models itself (`Memory`)
    overhead_gib: float | None = None
    business_context: int | None = None  # default: the largest of `contexts`
    params_total: float | None = None  # given on the command line (--total-b) instead of counted from a shape
    bpw: tuple[tuple[str, float], ...] = ()  # bits per weight overrides, e.g. (("q4", 5.33),)


def label(utilization: float, margin: float, target_util: float) -> str:
    if utilization <= min(1 - margin, target_util):
        return "OK"
    if utilization <= target_util:
        return "TIGHT"
    return "OOM_RISK"


def weights_for(quant: str, shape: ModelShape, measured: tuple[str, int] | None, spec: SweepSpec) -> int:
    """Weight bytes in `quant`: scaled from the measured files when there are some, else params x bits."""
    overrides = dict(spec.bpw)
    bits = overrides.get(quant) or bits_for(QUANT_ALIASES.get(quant.lower(), quant))
    if spec.params_total is not None:
        return round(spec.params_total * bits / 8)
    if measured is not None and measured[1] > 0 and quant not in overrides:
        precision, size = measured
        try:
            return round(size * bits / bits_for(precision))
        except ValueError:
            pass
    return round(shape.params_total * bits / 8)


def overhead_gib(spec: SweepSpec) -> float:
    """Memory beyond weights and KV cache: `--overhead-gib`, else the backend's rule of thumb from its own start-up
    logs (`Memory.overhead_gib` of its server kind)."""
    return spec.overhead_gib if spec.overhead_gib is not None else memory_of(spec.backend).overhead_gib


def sweep(shape: ModelShape, spec: SweepSpec, measured: tuple[str, int] | None = None) -> list[Cell]:
    overhead = round(overhead_gib(spec) * GIB)
    gpu = spec.gpu_gib * GIB
    cells = []
    for quant in spec.quants:
        weights = weights_for(quant, shape, measured, spec)
        for context in spec.contexts:
            for batch in spec.batches:
                kv = kv_bytes(shape, context, batch, spec.kv_dtype, memory_of(spec.backend).window_extra_tokens)
                total = weights + kv + overhead
                util = total / gpu
                cells.append(
                    Cell(
                        quant,
                        context,
                        batch,
                        weights,
                        kv,
                        overhead,
                        total,
                        util,
                        label(util, spec.margin, spec.target_util),
                    )
                )
    return cells


def best(cells: list[Cell], spec: SweepSpec) -> tuple[Cell | None, str]:
    """The guide's pick and why (or why there is none)."""
    context = spec.business_context or max(spec.contexts)
    at_context = [c for c in cells if c.context == context and c.label == "OK"]
    if not at_context:
        fitting = sorted({c.context for c in cells if c.label == "OK"})
        hint = f"; the largest context with an OK cell is {fitting[-1]}" if fitting else "; no cell is OK"
        there = [c for c in cells if c.context == context] or cells
        if there:  # what would fit: the smallest cell at the business context, and the card it needs
            small = min(there, key=lambda c: c.total_bytes)
            need = small.total_bytes / GIB / (1 - spec.margin)
            hint += (f"; the smallest there ({small.quant}, batch {small.batch}: {small.total_bytes / GIB:.2f} GiB) "
                     f"is OK on a {need:.1f} GiB card, or lower --context")  # fmt: skip
        return None, f"nothing is OK at the business context {context} with {spec.margin:.0%} headroom{hint}"

    def bits(cell: Cell) -> float:
        return bits_for(QUANT_ALIASES.get(cell.quant.lower(), cell.quant))

    finest = max(at_context, key=lambda c: (bits(c), -c.weights_bytes))
    pick = max((c for c in at_context if c.quant == finest.quant), key=lambda c: c.batch)
    coarser = sorted({c.quant for c in at_context if bits(c) < bits(finest)}, key=lambda q: -bits_for(q))
    verbs = "fits too and loses" if len(coarser) == 1 else "fit too and lose"
    also = f"; {', '.join(coarser)} {verbs} more" if coarser else ""
    return pick, (
        f"context {context} first (the business context), then the most precise quantization OK there "
        f"({pick.quant}{also}), then the largest batch that stays OK ({pick.batch})"
    )


def as_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    return [asdict(cell) for cell in cells]


def render(cells: list[Cell], spec: SweepSpec, pick: Cell | None, why: str, notes: list[str]) -> str:
    batches = spec.batches
    head = f"{'quant':<8}{'context':>9}" + "".join(f"{'batch ' + str(b):>22}" for b in batches)
    lines = [
        f"GPU {spec.gpu_gib:g} GiB, backend {spec.backend}, KV {spec.kv_dtype}, headroom {spec.margin:.0%}, "
        f"target utilization {spec.target_util:.0%}",
        "",
        head,
    ]
    for quant in spec.quants:
        for context in spec.contexts:
            row = [c for c in cells if c.quant == quant and c.context == context]
            text = "".join(f"{c.total_bytes / GIB:>9.2f} GiB {c.label:<8}" for c in row)
            lines.append(f"{quant:<8}{context:>9}  {text}")
    lines.append("")
    if pick is not None:
        lines.append(
            f"best: {pick.quant}, context {pick.context}, batch {pick.batch}: {pick.total_bytes / GIB:.2f} GiB "
            f"({pick.utilization:.0%} of the card): weights {pick.weights_bytes / GIB:.2f} + KV "
            f"{pick.kv_bytes / GIB:.2f} + overhead {pick.overhead_bytes / GIB:.2f} GiB"
        )
    lines.append(f"why: {why}")
    lines += [f"note: {note}" for note in notes]
    lines.append("note: a paper estimate is not a measurement: run `python -m benchmarks ladder` near these limits")
    return "\n".join(lines)
