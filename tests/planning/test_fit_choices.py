"""`fit`'s decisions without a server: which candidates the paper leaves, the rule on measured figures, and what
it writes (fakes of a measurement, the real sweep and model shapes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pydantic
import pytest

from mellum_proxy.cli import main
from mellum_proxy.config import Settings
from mellum_proxy.planning import speed
from mellum_proxy.planning.candidates import Candidate, choose_candidates
from mellum_proxy.planning.choice import choose, quality_floor
from mellum_proxy.planning.editor_side import merged_toml
from mellum_proxy.planning.fit_report import config_toml
from mellum_proxy.planning.inspect import BUNDLED, inspect_path
from mellum_proxy.planning.launch import command_for, why_it_failed
from mellum_proxy.planning.measure import Measurement
from mellum_proxy.planning.sweep import SweepSpec
from mellum_proxy.settings_file import load_settings
from mellum_proxy.tuning.workloads.trace import Edit, Open

MELLUM_4B = BUNDLED / "mellum-4b-base"


def spec(gpu_gib: float, contexts: tuple[int, ...] = (1024, 2048), batches: tuple[int, ...] = (1, 2)) -> SweepSpec:
    return SweepSpec(gpu_gib=gpu_gib, quants=(), contexts=contexts, batches=batches, backend="llama.cpp",
                     business_context=contexts[0])  # fmt: skip


def test_the_paper_leaves_its_pick_and_each_one_variable_away() -> None:
    info = inspect_path(MELLUM_4B)
    chosen, why = choose_candidates([info], ("f16", "q8_0"), spec(24), most=5)
    first = chosen[0]
    assert (first.context, first.batch, first.kv_type, first.why) == (1024, 2, "f16", "the paper's pick")
    changed = [
        {name for name in ("context", "batch", "kv_type") if getattr(c, name) != getattr(first, name)}
        for c in chosen[1:]
    ]
    assert changed == [{"context"}, {"kv_type"}, {"batch"}]  # one variable at a time, never the grid
    assert "the paper's pick" in why


def test_nothing_ok_at_the_business_context_is_said() -> None:
    chosen, why = choose_candidates([inspect_path(MELLUM_4B)], ("f16",), spec(4))
    assert chosen == [] and "business context 1024" in why


def measured(context: int, batch: int, kv: str = "f16", status: str = "ok", rate: float = 0.5,
             failure: str | None = None) -> Measurement:  # fmt: skip
    cell = choose_candidates([inspect_path(MELLUM_4B)], ("f16",), spec(24))[0][0].paper
    result = Measurement(Candidate(MELLUM_4B, "bf16", context, batch, kv, cell, "test"), status=status)
    result.quality = {"tasks": 20, "exact": int(rate * 20), "rate": rate}
    if failure:
        result.fail(failure, "failed to allocate buffer")
        result.status = "failed"
    return result


def test_the_rule_runs_on_what_was_measured() -> None:
    runs = [measured(1024, 2), measured(2048, 2), measured(1024, 4, status="tight"), measured(1024, 1)]
    choice, why = choose(runs, 1024, quality_floor(runs, None))
    assert why.startswith("context 1024 first")
    assert choice is not None and (choice.context, choice.batch) == (1024, 2)  # tight is over the headroom
    assert (choice.stress_context, choice.stress_batch) == (2048, 4)  # tight still ran: the stress profile
    assert "CTX_DEFAULT=1024\nBATCH_DEFAULT=2\nCTX_STRESS=2048\nBATCH_STRESS=4\n" in choice.env()


def test_a_failed_or_worse_candidate_is_not_chosen() -> None:
    runs = [measured(1024, 2, failure="long_prompt_oom"), measured(1024, 1, kv="q8_0", rate=0.1),
            measured(1024, 1)]  # fmt: skip
    floor = quality_floor(runs, None)
    assert floor == pytest.approx(0.4)
    choice, _ = choose(runs, 1024, floor)
    assert choice is not None and (choice.batch, choice.kv_type) == (1, "f16")
    none, why = choose([runs[0]], 1024, floor)
    assert none is None and "failed (long_prompt_oom)" in why


def test_the_config_it_writes_is_one_serve_reads(tmp_path: Path) -> None:
    run = measured(1024, 2)
    run.ttft_ms["long"], run.decode_tps = 8000.0, 20.0
    choice, _ = choose([run], 1024, None)
    assert choice is not None
    text = merged_toml(config_toml(choice, embedded=True, packaged=True), {"debounce_ms": 90, "max_concurrency": 7})
    path = tmp_path / "config.toml"
    path.write_text(text)
    settings = load_settings({}, path)
    assert (settings.max_context_tokens, settings.max_concurrency, settings.debounce_ms) == (1024, 2, 90)
    assert (settings.embedded_ctx_tokens, settings.embedded_slots, settings.embedded_kv_type) == (2048, 2, "f16")
    assert settings.timeout_ms == 15600  # 1.5 x (8 s + 48 tokens at 20 tokens/s)


def test_a_server_command_gets_the_candidates_knobs() -> None:
    candidate = replace(measured(1024, 2).candidate, kv_type="q8_0")
    argv = command_for(candidate, "llama-server -m {model} -c {ctx_total} -np {batch} -ctk {kv} --port {port}", 9, 1)
    assert argv[3:] == ["-c", "2048", "-np", "2", "-ctk", "q8_0", "--port", "9"]
    with pytest.raises(ValueError, match="not a placeholder"):
        command_for(candidate, "vllm serve {model} --gpu {gpu}", 9, 1)
    speed = command_for(candidate, "llama-server -m {model} --spec-type {spec} --cache-reuse {cache_reuse}", 9, 1,
                        "ngram-mod", 256)  # fmt: skip
    assert speed[3:] == ["--spec-type", "ngram-mod", "--cache-reuse", "256"]
    draft = command_for(candidate, "llama-server -m {model} {spec_flags}", 9, 1, "draft:/models/small.gguf")
    assert draft[3:] == ["--spec-type", "draft-simple", "--model-draft", "/models/small.gguf"]


def test_speed_candidates_change_one_knob_and_claim_one_only_beyond_the_spread(tmp_path: Path) -> None:
    assert speed.plan(("none", "ngram-simple", "ngram-mod"), (0, 256)) == [
        ("none", 0, 1), ("none", 0, 2), ("ngram-simple", 0, 1), ("ngram-mod", 0, 1), ("none", 256, 1)]  # fmt: skip

    def run(spec: str, reuse: int, p95: float, turn: int = 1) -> speed.SpeedRun:
        return speed.SpeedRun(spec, reuse, turn, first_text_p50_ms=p95 / 2, first_text_p95_ms=p95)

    base = [run("none", 0, 900), run("none", 0, 1000, 2)]  # a spread of 100 ms
    assert speed.choose([*base, run("ngram-mod", 0, 700), run("ngram-simple", 0, 880)])[:2] == ("ngram-mod", 0)
    within = speed.choose([*base, run("ngram-mod", 0, 860), run("none", 256, 600)])
    assert within[:2] == ("none", 256) and "within the spread" in within[2]
    slower = speed.choose([*base, run("ngram-simple", 0, 1200)])
    assert slower[:2] == ("none", 0) and "ngram-simple at 1200 ms, is slower than 950 ms" in slower[2]
    opened, typed = Open(0, "a.py", "def f():\n    pass\n"), Edit(10, "a.py", 9, 0, "    x = 1\n")
    assert speed.final_text([opened, typed]) == "def f():\n    x = 1\n"  # what the probes complete
    refused = speed.SpeedRun("ngram-mod", 0, failure="load_failed: unknown spec type")
    assert speed.choose([*base, refused])[:2] == ("none", 0)
    choice, _ = choose([measured(1024, 2)], 1024, None)
    assert choice is not None
    fast = replace(choice, spec="ngram-mod", cache_reuse=256)
    assert "SPEC_TYPE=ngram-mod\nCACHE_REUSE=256\n" in fast.env()
    path = tmp_path / "config.toml"
    path.write_text(config_toml(fast, embedded=True, packaged=True))
    settings = load_settings({}, path)
    assert (settings.embedded_spec, settings.embedded_cache_reuse) == ("ngram-mod", 256)


def test_the_line_that_says_why_a_load_failed_is_quoted() -> None:
    log = "I loading\nE ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 1\nE exiting\n"
    assert why_it_failed(log, 1) == ("load_oom", "E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate "
                                                 "buffer of size 1")  # fmt: skip
    assert why_it_failed("Traceback\nValueError: bad flag\n", 1) == ("load_failed", "ValueError: bad flag")
    reason = "0.00.70 E srv load_model: failed to create MTP context"
    mtp = f"{reason}\n0.00.71 E srv init: exiting due to model loading error\n"
    assert why_it_failed(mtp, 1) == ("load_failed", reason)  # the reason, not llama.cpp's trailer after it


@pytest.mark.parametrize(
    "argv",
    [
        ["fit", "--server-cmd", "llama-server -m {model}", "--gpu-gib", "8", "--context", "1024", "--out", "x"],
        ["fit", "--embedded", "--model", str(MELLUM_4B), "--gpu-gib", "8", "--context", "1024", "--out", "x"],
        ["fit", "--embedded", "--gpu-gib", "8", "--context", "4096", "--contexts", "1024", "--out", "x"],
        ["fit", "--embedded", "--gpu-gib", "8", "--context", "1024", "--kv-types", "f17", "--out", "x"],
        ["fit", "--server-cmd", "x", "--model", str(MELLUM_4B), "--gpu-gib", "4", "--context", "1024", "--out", "x"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_speculation_is_a_known_type_or_a_draft_model_file(tmp_path: Path) -> None:
    from mellum_proxy.upstream.embedded import checked_spec, spec_flags

    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    assert checked_spec("ngram-mod") == "ngram-mod" and checked_spec("draft-mtp") == "draft-mtp"
    assert checked_spec(f"draft:{draft}") == f"draft:{draft}"
    assert spec_flags(f"draft:{draft}") == f"--spec-type draft-simple --model-draft {draft}"
    for bad in ("ngram", f"draft:{tmp_path / 'missing.gguf'}"):
        with pytest.raises(ValueError):
            checked_spec(bad)
    with pytest.raises(pydantic.ValidationError, match="draft model"):
        Settings(embedded_spec=f"draft:{tmp_path / 'missing.gguf'}")
