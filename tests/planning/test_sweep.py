"""Sweep labels at every boundary, the tuning guide's pick order, defaults and doctor."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning.defaults import choose
from mellum_proxy.planning.inspect import bundled_shape
from mellum_proxy.planning.shapes import ASSUMED_ARCH
from mellum_proxy.planning.sweep import GIB, SweepSpec, best, label, sweep
from mellum_proxy.telemetry.doctor import diagnose
from mellum_proxy.upstream.embedded import packaged_model


@pytest.mark.parametrize(
    ("util", "expected"),
    [(0.0, "OK"), (0.75, "OK"), (0.7501, "TIGHT"), (0.85, "TIGHT"), (0.8501, "OOM_RISK"), (1.2, "OOM_RISK")],
)
def test_label_boundaries(util: float, expected: str) -> None:
    assert label(util, margin=0.25, target_util=0.85) == expected


def test_margin_wider_than_target_leaves_no_tight_band() -> None:
    assert label(0.8, margin=0.1, target_util=0.8) == "OK"
    assert label(0.81, margin=0.1, target_util=0.8) == "OOM_RISK"


def test_a_cell_exactly_at_the_headroom_is_ok() -> None:
    kv = 2 * 8 * 128 * 2 * 32 * 1024  # the assumed shape, 1024 tokens
    spec = SweepSpec(gpu_gib=1.0, quants=("q8",), contexts=(1024,), batches=(1,), overhead_gib=0,
                     params_total=(0.75 * GIB - kv) * 8 / 8.5)  # fmt: skip
    (cell,) = sweep(ASSUMED_ARCH, spec)
    assert cell.utilization == pytest.approx(0.75, abs=1e-6)
    assert cell.label == "OK"


def test_cells_add_weights_kv_and_overhead() -> None:
    shape = bundled_shape("mellum-4b")
    spec = SweepSpec(gpu_gib=24, quants=("q8",), contexts=(8192,), batches=(2,), overhead_gib=1.0, params_total=4e9)
    (cell,) = sweep(shape, spec)
    assert cell.weights_bytes == round(4e9 * 8.5 / 8)
    assert cell.kv_bytes == 2 * 360 * 1024 * 8192
    assert cell.total_bytes == cell.weights_bytes + cell.kv_bytes + GIB
    assert cell.utilization == pytest.approx(cell.total_bytes / (24 * GIB))


def test_best_follows_context_then_quantization_then_batch() -> None:
    shape = bundled_shape("mellum2.1")
    spec = SweepSpec(gpu_gib=16, quants=("q4", "q5", "q8"), contexts=(8192, 32768), batches=(1, 2, 4, 8),
                     backend="llama.cpp", business_context=8192)  # fmt: skip
    cells = sweep(shape, spec, ("bf16", 24300538808))
    pick, why = best(cells, spec)
    assert pick is not None
    assert pick.context == 8192  # the business context, though larger contexts also fit
    assert pick.quant == "q5"  # the most precise quantization that is OK there (q8 is only TIGHT)
    assert pick.batch == 8  # then the largest batch that stays OK
    assert all(c.label != "OK" for c in cells if c.quant == "q8" and c.context == 8192)
    assert pick.label == "OK" and "business context" in why
    fuller = max(cells, key=lambda c: c.utilization if c.label != "OOM_RISK" else 0)
    assert fuller.utilization > pick.utilization  # not the fullest card


def test_nothing_fits_says_so() -> None:
    spec = SweepSpec(gpu_gib=4, quants=("q8",), contexts=(8192,), batches=(1,), params_total=12e9)
    pick, why = best(sweep(bundled_shape("mellum2.1"), spec), spec)
    assert pick is None and "nothing is OK at the business context 8192" in why


def test_defaults_pick_and_stress(tmp_path: Path) -> None:
    shape = bundled_shape("mellum2.1")
    chosen, _ = choose(shape, 16, 8192, None, None, {"backend": "llama.cpp"}, ("bf16", 24300538808))
    assert chosen is not None
    assert (chosen.quant, chosen.context, chosen.stress_context) == ("q6", 8192, 16384)  # the most precise OK
    assert chosen.stress_batch >= chosen.batch
    env = chosen.env()
    assert "MODEL_QUANT=q6\n" in env and "CTX_DEFAULT=8192\n" in env and f"BATCH_DEFAULT={chosen.batch}\n" in env
    flags = chosen.flags()
    assert f"--max-model-len 8192 --max-num-seqs {chosen.batch}" in flags
    assert f"-c {8192 * chosen.batch} -np {chosen.batch} -ctk f16 -ctv f16 -ngl 99" in flags  # -c: all slots
    assert f"OLLAMA_NUM_PARALLEL={chosen.batch}" in flags and "max_context_tokens = 8192" in flags
    assert "--gpu-memory-utilization" in flags


def record(outcome: str, **fields: object) -> dict[str, object]:
    return {"outcome": outcome, "reached_upstream": True, **fields}


def test_doctor_verdicts() -> None:
    assert diagnose([record("upstream_error")] * 10)["verdict"].startswith("fails at load")
    long_fail = [record("ok", prompt_tokens_before=500, inflight=1, ttft_ms=100) for _ in range(30)]
    long_fail += [record("upstream_error", prompt_tokens_before=8000, inflight=1) for _ in range(10)]
    result = diagnose(long_fail)
    assert result["verdict"] == "fails only on long inputs" and "max_context_tokens" in result["knob"]
    busy = [record("ok", prompt_tokens_before=500, inflight=1, ttft_ms=100) for _ in range(30)]
    busy += [record("timeout", prompt_tokens_before=500, inflight=6) for _ in range(10)]
    assert diagnose(busy)["verdict"] == "fails only with several requests at once"
    slow = [record("ok", prompt_tokens_before=500, inflight=1, ttft_ms=2500, vram_peak_mib=4000) for _ in range(20)]
    result = diagnose(slow, probe=(4000, 16000))
    assert result["verdict"] == "memory free but slow" and any("25%" in line for line in result["evidence"])
    assert diagnose([record("ok", ttft_ms=120) for _ in range(20)])["verdict"] == "healthy"


def test_doctor_names_no_knob_from_one_failure() -> None:
    """One timeout among the requests is not a pattern: it said "fails only on long inputs" from one of five."""
    few = [record("ok", prompt_tokens_before=300 + i, inflight=1, ttft_ms=100) for i in range(8)]
    few += [record("timeout", prompt_tokens_before=2000, inflight=1)]
    result = diagnose(few)
    assert result["knob"] is None and result["verdict"] == "too few failures to tell (1 of 9)"
    assert any("prompts over" in line and "failed; the others" in line for line in result["evidence"])  # plain words


def test_the_pick_is_explained_with_a_cell_at_the_business_context(capsys: pytest.CaptureFixture[str]) -> None:
    """`--context 4096` with `--contexts 32768`: the explanation named a 15.03 GiB cell "there" that was the 32768
    cell; the business context is now a column of its own."""
    main(["sweep", "--total-b", "4", "--arch", "mellum-4b", "--gpu-gib", "12", "--context", "4096",
          "--contexts", "8192,32768", "--quants", "bf16,q4", "--json"])  # fmt: skip
    body = orjson.loads(capsys.readouterr().out)
    assert 4096 in {cell["context"] for cell in body["cells"]}
    assert body["best"] is not None and body["best"]["context"] == 4096


def test_a_gguf_is_planned_as_llama_cpp_at_no_precision_above_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(packaged_model())  # Q4_K_M
    main(["sweep", "--model", model, "--gpu-gib", "8", "--context", "4096", "--json"])
    body = orjson.loads(capsys.readouterr().out)
    assert {cell["quant"] for cell in body["cells"]} == {"q4"}
    assert any("q5, q8 left out: finer than the file's own Q4_K_M" in note for note in body["notes"])
    main(["sweep", "--model", model, "--gpu-gib", "8", "--context", "4096"])
    assert "backend llama.cpp" in capsys.readouterr().out
    main(["defaults", "--model", model, "--gpu-gib", "8", "--context", "4096"])
    assert capsys.readouterr().out.startswith("MODEL_QUANT=q4\n")
