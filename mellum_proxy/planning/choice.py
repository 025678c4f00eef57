"""The guide's rule, applied to what was measured (not to the paper): the business context first, then the most
precise quantization (and KV cache type) that passes the quality floor with the headroom kept, then the largest
batch. The stress values are the largest context and batch that ran with the same files without failing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mellum_proxy.planning.candidates import quant_bits
from mellum_proxy.planning.kvcache import KV_BYTES
from mellum_proxy.planning.measure import Measurement

QUALITY_SLACK = 0.10  # the default floor: the best candidate's exact-match rate less ten points


@dataclass(frozen=True, slots=True)
class Choice:
    model: Path
    quant: str
    kv_type: str
    context: int
    batch: int
    stress_context: int
    stress_batch: int
    chosen: Measurement
    spec: str = "none"  # the speed candidates' choice (`fit --spec`): the server's self-speculation
    cache_reuse: int = 0  # and its KV shifting (`fit --cache-reuse`)

    def env(self) -> str:
        return (f"MODEL_QUANT={self.quant}\nCTX_DEFAULT={self.context}\nBATCH_DEFAULT={self.batch}\n"
                f"CTX_STRESS={self.stress_context}\nBATCH_STRESS={self.stress_batch}\n"
                f"KV_CACHE_TYPE={self.kv_type}\nSPEC_TYPE={self.spec}\nCACHE_REUSE={self.cache_reuse}\n")  # fmt: skip


def quality_floor(measured: list[Measurement], given: float | None) -> float | None:
    """The floor a candidate's exact-match rate must reach: `given`, else the best measured less the slack."""
    if given is not None:
        return given
    rates = [m.quality["rate"] for m in measured if m.quality is not None and not m.failures]
    return max(0.0, max(rates) - QUALITY_SLACK) if rates else None


def passes_quality(m: Measurement, floor: float | None) -> bool:
    return floor is None or m.quality is None or m.quality["rate"] >= floor - 1e-9


def choose(measured: list[Measurement], business: int, floor: float | None) -> tuple[Choice | None, str]:
    """The defaults from the measured candidates, and why (or why none)."""
    kept = [m for m in measured if m.status == "ok" and passes_quality(m, floor) and m.candidate.context >= business]
    if not kept:
        reasons = "; ".join(f"{m.candidate.name}: {_why_not(m, floor)}" for m in measured) or "nothing was measured"
        return None, f"no candidate ran at context {business} or above within the headroom and quality floor: {reasons}"
    context = min(m.candidate.context for m in kept)
    there = [m for m in kept if m.candidate.context == context]
    finest = max(there, key=lambda m: (quant_bits(m.candidate.quant), KV_BYTES[m.candidate.kv_type]))
    same = [m for m in there if (m.candidate.model, m.candidate.kv_type) == (finest.candidate.model,
                                                                               finest.candidate.kv_type)]  # fmt: skip
    pick = max(same, key=lambda m: m.candidate.batch)
    ran = [m for m in measured if not m.failures and m.candidate.model == pick.candidate.model
           and m.candidate.kv_type == pick.candidate.kv_type]  # fmt: skip
    c = pick.candidate
    choice = Choice(c.model, c.quant, c.kv_type, c.context, c.batch, max(m.candidate.context for m in ran),
                    max(m.candidate.batch for m in ran), pick)  # fmt: skip
    floor_said = "no quality floor" if floor is None else f"exact match at least {floor:.0%}"
    why = (f"context {context} first (the business context is {business}), then the most precise weights and cache "
           f"that ran within the headroom with {floor_said} ({c.quant}, KV {c.kv_type}), then the largest batch "
           f"that did ({c.batch}); stress: the largest context ({choice.stress_context}) and batch "
           f"({choice.stress_batch}) that ran with them without failing")  # fmt: skip
    return choice, why


def _why_not(m: Measurement, floor: float | None) -> str:
    if m.failures:
        return f"failed ({m.failures[0]['kind']})"
    if m.status != "ok":
        return f"{m.status}: {m.measured_peak_gib or 0:.2f} of {m.budget_gib or 0:.2f} GiB"
    if not passes_quality(m, floor):
        return f"under the quality floor ({m.quality['rate'] if m.quality else 0:.0%})"
    return "below the business context"
