"""What `fit` writes: `defaults.env`, `config.toml` (the proxy), `fit.json`, `fit.md` and `fit.png`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.config import Settings
from mellum_proxy.planning.choice import Choice
from mellum_proxy.planning.measure import Measurement
from mellum_proxy.upstream.embedded import spec_flags
from mellum_proxy.upstream.servers import KINDS

GIB = 2**30
ASKED_TOKENS = 48  # what the deadline leaves room to decode: `serve --embedded`'s max_tokens, a short suggestion


def components(m: Measurement) -> dict[str, dict[str, float | None]]:
    """Paper beside measured per component, in GiB: weights and KV cache from the server's own allocation lines,
    the rest of the peak as overhead, and the peak itself."""
    paper = m.candidate.paper
    logged_w, logged_kv = m.logged.get("weights_bytes") or 0, m.logged.get("kv_bytes") or 0
    peak = m.measured_peak_gib
    rows = {"weights": (paper.weights_bytes / GIB, logged_w / GIB if logged_w else None),
            "kv_cache": (paper.kv_bytes / GIB, logged_kv / GIB if logged_kv else None),
            "overhead": (paper.overhead_bytes / GIB,
                         peak - (logged_w + logged_kv) / GIB if peak is not None and logged_w else None),
            "total": (paper.total_bytes / GIB, peak)}  # fmt: skip
    return {name: {"paper_gib": p, "measured_gib": got, "error": (p - got) / got if got else None}
            for name, (p, got) in rows.items()}  # fmt: skip


def deadline_ms(m: Measurement) -> int | None:
    """Room for a near-limit prompt's first token and a short suggestion, half again: `timeout_ms`."""
    if m.ttft_ms["long"] is None or not m.decode_tps:
        return None
    need = 1.5 * (m.ttft_ms["long"] + ASKED_TOKENS / m.decode_tps * 1000)
    default: int = Settings.model_fields["timeout_ms"].default
    return max(default, int(math.ceil(need / 100) * 100))


def config_toml(choice: Choice, embedded: bool, packaged: bool) -> str:
    m = choice.chosen
    lines = ["# written by `mellum-proxy fit` from what it measured (fit.md says how)", "",
             f"max_context_tokens = {choice.context}", f"max_concurrency = {choice.batch}"]  # fmt: skip
    deadline = deadline_ms(m)
    if deadline is not None:
        lines.append(f"timeout_ms = {deadline}  # 1.5 x (near-limit first token + {ASKED_TOKENS} tokens)")
    if embedded:
        lines += [f"embedded_ctx_tokens = {choice.context * choice.batch}", f"embedded_slots = {choice.batch}",
                  f'embedded_kv_type = "{choice.kv_type}"']  # fmt: skip
        if choice.spec != "none":
            lines.append(f'embedded_spec = "{choice.spec}"  # measured on the typing (fit.md, speed)')
        if choice.cache_reuse:
            lines.append(f"embedded_cache_reuse = {choice.cache_reuse}")
        if not packaged:
            lines.append(f"model = {orjson.dumps(str(choice.model.resolve())).decode()}")
    return "\n".join(lines) + "\n"


def server_flags(choice: Choice) -> list[str]:
    """Each server kind's flags for the choice (`ServerKind.start_flags`), and the stress profile."""
    flags = [f"{kind.title}: {kind.start_flags(choice.context, choice.batch, choice.kv_type)}"
             for kind in KINDS if kind.start_flags is not None]  # fmt: skip
    if choice.spec != "none" or choice.cache_reuse:
        flags.append(f"llama.cpp's speed knobs: {spec_flags(choice.spec)} --cache-reuse {choice.cache_reuse}")
    return [*flags, f"stress profile: context {choice.stress_context}, {choice.stress_batch} at once"]


def as_json(meta: dict[str, Any], measured: list[Measurement], choice: Choice | None, why: str,
            floor: float | None) -> dict[str, Any]:  # fmt: skip
    chosen = None
    if choice is not None:
        chosen = {"name": choice.chosen.candidate.name, "model": choice.model.name, "quant": choice.quant,
                  "kv_type": choice.kv_type, "context": choice.context, "batch": choice.batch,
                  "stress_context": choice.stress_context, "stress_batch": choice.stress_batch,
                  "spec": choice.spec, "cache_reuse": choice.cache_reuse}  # fmt: skip
    return {**meta, "quality_floor": floor, "why": why, "chosen": chosen,
            "candidates": [{**m.summary(), "components": components(m)} for m in measured]}  # fmt: skip


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: dict[str, Any], choice: Choice | None) -> str:
    source = {m["memory_source"] for m in report["candidates"]}
    partial = (
        [
            f"**Partial run: {report['partial']}.** The choice below is from what was measured before the "
            "stop; rerun the command to measure the rest.",
            "",
        ]
        if report.get("partial")
        else []
    )
    lines = [f"# fit: {report['server']}", "", f"`{report['command']}`", "", *partial,
             f"Budget {report['gpu_gib']:g} GiB, headroom {report['margin']:.0%}, business context "
             f"{report['context']}; memory measured by "
             + ("NVML (the GPU's used memory, sampled every 0.1 s, less what was used before the server started)"
                if source == {"nvml"} else "the server's host memory: its processes' peak resident set (VmHWM), "
                "summed over them (shared pages counted in each), not GPU memory (no NVIDIA driver here)")
             + f". {report['paper_note']}"
             + " Each candidate's server log: `logs/candidate-N.log`, in this table's order."
             + ("" if source == {"nvml"} else " The paper's overhead is a GPU backend's (CUDA context, compute "
                "buffers); in host memory the rest of the peak is the server's process (interpreter, libraries, "
                "compute buffers): compare weights and KV cache there, not the overhead."), "",
             "| candidate | why | paper GiB | measured peak GiB | first token short / near-limit ms (prompt tokens) "
             "| decode tok/s | quality | failures | status |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in report["candidates"]:
        q = m["quality"]
        score = f"{q['exact']}/{q['tasks']}" if q else "-"
        failures = "; ".join(f"{f['kind']}: `{f['detail']}`" for f in m["failures"]) or "none"
        lines.append(f"| {m['name']} | {m['why']} | {m['paper_gib']:.2f} | {_num(m['measured_peak_gib'])} | "
                     f"{_num(m['ttft_ms']['short'], 0)} ({m['prompt_tokens']['short'] or '-'}) / "
                     f"{_num(m['ttft_ms']['long'], 0)} ({m['prompt_tokens']['long'] or '-'}) | "
                     f"{_num(m['decode_tps'], 1)} | {score} | {failures} | "
                     f"{m['status']} |")  # fmt: skip
    lines += ["", "Paper against measured, per component (GiB; measured weights and KV cache from the server's own "
              "allocation lines, overhead the rest of the measured peak):", "",
              "| candidate | weights paper / measured | KV cache | overhead | total |",
              "|---|---|---|---|---|"]  # fmt: skip
    for m in report["candidates"]:
        cells = [f"{_num(row['paper_gib'], 3)} / {_num(row['measured_gib'], 3)}"
                 + (f" ({row['error']:+.0%})" if row["error"] is not None else "")
                 for row in m["components"].values()]  # fmt: skip
        lines.append(f"| {m['name']} | " + " | ".join(cells) + " |")
    mismatches = [f"- {m['name']}: {text}" for m in report["candidates"] for text in m["mismatches"]]
    if mismatches:
        lines += ["", "What the server said it loaded differs from what was asked:", *mismatches]
    lines += speed_table(report.get("speed"))
    lines += ["", f"Chosen: **{report['chosen']['name'] if report['chosen'] else 'none'}**. {report['why']}."]
    if choice is not None:
        lines += ["", "```", choice.env().rstrip(), "```", "", "Server flags:", ""]
        lines += [f"- {line}" for line in server_flags(choice)]
    return "\n".join(lines) + "\n"


def speed_table(speed: dict[str, Any] | None) -> list[str]:
    """The speed candidates (`fit --spec`, `--cache-reuse`), replayed on the typing, and the rule's reading."""
    if not speed:
        return []
    lines = ["", f"Speed, at the chosen candidate, over {speed['edits']} edits of `{speed['trace']}` replayed through "
             "the proxy in real time (first text: from a pause to its first shown text):", "",
             "| spec | cache reuse | turn | first text p50 / p95 ms | pauses covered | decode tok/s | draft acceptance "
             "| prompt tokens computed / cached | status |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in speed["candidates"]:
        text, prompt = run["first_text_ms"], run["prompt_tokens"]
        coverage = "-" if run["pause_coverage"] is None else f"{run['pause_coverage']:.0%}"
        lines.append(f"| {run['spec']} | {run['cache_reuse']} | {run['turn']} | {_num(text['p50'], 0)} / "
                     f"{_num(text['p95'], 0)} | {coverage} | {_num(run['decode_tps'], 1)} | "
                     f"{_num(run['draft_acceptance'], 2)} of {run.get('drafted', 0)} drafted | "
                     f"{prompt['computed'] or '-'} / {prompt['cached'] or '-'} | "
                     f"{run['failure'] or run['status']} |")  # fmt: skip
    return [*lines, "", f"Speed: {speed['why']}."]


def plot(report: dict[str, Any], path: Path) -> bool:
    """Memory per candidate (paper beside measured, per component) and first-token time per prompt; False when
    matplotlib is missing (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = report["candidates"]
    names = [m["name"] for m in rows]
    speed = (report.get("speed") or {}).get("candidates") or []
    fig, axes = plt.subplots(1, 3 if speed else 2, figsize=(18 if speed else 12, 4.5))
    mem, ttft = axes[0], axes[1]
    x = range(len(rows))
    for offset, side in ((-0.2, "paper_gib"), (0.2, "measured_gib")):
        bottom = [0.0] * len(rows)
        for part, color in (("weights", "#4c72b0"), ("kv_cache", "#dd8452"), ("overhead", "#8c8c8c")):
            values = [m["components"][part][side] or 0.0 for m in rows]
            mem.bar([i + offset for i in x], values, 0.38, bottom=bottom, color=color,
                    alpha=1.0 if side == "paper_gib" else 0.6, label=f"{part} ({side.split('_')[0]})")  # fmt: skip
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    mem.set_xticks(list(x), names, rotation=15, fontsize=7)
    mem.set_ylabel("GiB")
    mem.set_title("memory: paper (left) vs measured (right)")
    mem.legend(fontsize=6)
    for offset, phase in ((-0.2, "short"), (0.2, "long")):
        ttft.bar([i + offset for i in x], [m["ttft_ms"][phase] or 0.0 for m in rows], 0.38, label=phase)
    ttft.set_xticks(list(x), names, rotation=15, fontsize=7)
    ttft.set_ylabel("ms")
    ttft.set_title("first token, at the candidate's batch")
    ttft.legend(fontsize=7)
    if speed:
        _speed_panel(axes[2], speed)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _speed_panel(axis: Any, speed: list[dict[str, Any]]) -> None:
    """First text p50 and p95 per speed candidate, on the person's typing (`fit --spec`, `--cache-reuse`)."""
    labels = [f"{run['spec']}\nreuse {run['cache_reuse']}" + (f" #{run['turn']}" if run["turn"] > 1 else "")
              for run in speed]  # fmt: skip
    x = range(len(speed))
    for offset, key in ((-0.2, "p50"), (0.2, "p95")):
        axis.bar([i + offset for i in x], [run["first_text_ms"][key] or 0.0 for run in speed], 0.38, label=key)
    axis.set_xticks(list(x), labels, fontsize=7)
    axis.set_ylabel("ms")
    axis.set_title("first text after a pause, on the typing (speed candidates)")
    axis.legend(fontsize=7)
