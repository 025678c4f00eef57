"""`mellum-proxy defaults`: write `defaults.env` and the matching proxy and server settings.

The pick is the sweep's `best` at the context the work needs; the stress values are what the first real
run must try (a default is only trusted after a run with inputs near its limit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mellum_proxy.planning.shapes import ModelShape
from mellum_proxy.planning.sweep import Cell, SweepSpec, best, sweep
from mellum_proxy.upstream.servers import KINDS

CANDIDATE_QUANTS = ("q4", "q5", "q6", "q8", "bf16")
CANDIDATE_BATCHES = (1, 2, 3, 4, 6, 8)


@dataclass(frozen=True, slots=True)
class Defaults:
    quant: str
    context: int
    batch: int
    stress_context: int
    stress_batch: int
    target_util: float
    pick: Cell
    kv_type: str = "f16"  # the KV cache type the sweep assumed

    def env(self) -> str:
        return (
            f"MODEL_QUANT={self.quant}\nCTX_DEFAULT={self.context}\nBATCH_DEFAULT={self.batch}\n"
            f"CTX_STRESS={self.stress_context}\nBATCH_STRESS={self.stress_batch}\n"
        )

    def flags(self) -> str:
        """The proxy's settings, then each server kind's start flags (`ServerKind.start_flags`, as `fit` prints
        them), and the stress run."""
        lines = ["proxy (config.toml):", f"  max_context_tokens = {self.context}", f"  max_concurrency = {self.batch}"]
        for kind in KINDS:
            if kind.start_flags is not None:
                lines += [f"{kind.title}:", f"  {kind.start_flags(self.context, self.batch, self.kv_type)}"]
        lines += [f"the share of the card vLLM may take: --gpu-memory-utilization {self.target_util}",
                  f"stress run: context {self.stress_context}, {self.stress_batch} at once "
                  "(python -m benchmarks ladder) before trusting these"]  # fmt: skip
        return "\n".join(lines)


def choose(
    shape: ModelShape,
    gpu_gib: float,
    context: int,
    stress_context: int | None,
    batch: int | None,
    spec_overrides: dict[str, Any],
    measured: tuple[str, int] | None,
    quants: tuple[str, ...] = CANDIDATE_QUANTS,
) -> tuple[Defaults | None, str]:
    batches = (batch,) if batch else CANDIDATE_BATCHES
    spec = SweepSpec(
        gpu_gib=gpu_gib,
        quants=quants,
        contexts=(context,),
        batches=batches,
        business_context=context,
        **spec_overrides,
    )
    pick, why = best(sweep(shape, spec, measured), spec)
    if pick is None:
        return None, why
    stress_ctx = stress_context or min(2 * context, shape.max_context or 2 * context)
    stress_spec = replace(spec, quants=(pick.quant,), contexts=(stress_ctx,), batches=CANDIDATE_BATCHES)
    survivable = [c.batch for c in sweep(shape, stress_spec, measured) if c.label != "OOM_RISK"]
    stress_batch = max([b for b in survivable if b >= pick.batch], default=pick.batch)
    chosen = Defaults(pick.quant, context, pick.batch, stress_ctx, stress_batch, spec.target_util, pick, spec.kv_dtype)
    return chosen, why
