"""`fit` on the real embedded llama.cpp (each candidate a server process of its own): measured, chosen, written,
a candidate that cannot load reported as failed, and Ctrl-C leaving no server behind."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning import speed
from mellum_proxy.planning.candidates import Candidate
from mellum_proxy.planning.measure import FitOptions, measure
from mellum_proxy.planning.sweep import Cell
from mellum_proxy.settings_file import load_settings
from mellum_proxy.tuning.workloads.trace import Edit, Open
from mellum_proxy.upstream.embedded import packaged_model

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def test_fit_measures_the_candidates_and_writes_what_serve_reads(tmp_path: Path) -> None:
    main(["fit", "--embedded", "--gpu-gib", "2", "--context", "256", "--contexts", "256,512", "--batches", "1",
          "--kv-types", "f16,q8_0", "--quality-tasks", "3", "--idle-s", "0", "--out", str(tmp_path)])  # fmt: skip
    report = orjson.loads((tmp_path / "fit.json").read_bytes())
    runs = {(c["context"], c["kv_type"]): c for c in report["candidates"]}
    assert set(runs) == {(256, "f16"), (512, "f16"), (256, "q8_0")}  # context and cache type, one at a time
    for run in runs.values():
        assert run["status"] == "ok" and run["failures"] == [] and run["memory_source"] == "host_rss"
        assert run["measured_peak_gib"] > run["components"]["weights"]["measured_gib"] > 0
        for part in ("weights", "kv_cache"):  # the planner's accuracy where the server logs its allocations
            assert abs(run["components"][part]["error"]) <= 0.10, (run["name"], part, run["components"][part])
        assert run["prompt_tokens"]["long"] > 0.8 * run["context"]  # near the limit
        assert run["quality"]["tasks"] == 3 and run["mismatches"] == []
    # the q8_0 cache is smaller on the server, as on paper
    assert runs[(256, "q8_0")]["logged"]["kv_bytes"] < runs[(256, "f16")]["logged"]["kv_bytes"]
    assert report["chosen"]["context"] == 256 and report["chosen"]["kv_type"] == "f16"
    env = (tmp_path / "defaults.env").read_text()
    assert "CTX_DEFAULT=256\nBATCH_DEFAULT=1\nCTX_STRESS=512\n" in env
    settings = load_settings({"embedded": True}, tmp_path / "config.toml")
    assert (settings.max_context_tokens, settings.embedded_ctx_tokens, settings.embedded_slots) == (256, 256, 1)
    assert "paper" in (tmp_path / "fit.md").read_text() and (tmp_path / "fit.png").stat().st_size > 0
    log = (tmp_path / "logs" / "candidate-1.log").read_text()
    assert "load_model" in log and str(Path.home()) not in log  # the packaged model's path, home as ~


def test_a_candidate_that_cannot_load_is_a_measured_failure() -> None:
    impossible = 2**25  # 100 GB of KV cache
    cell = Cell("Q4_K_M", impossible, 1, 0, 0, 0, 0, 0.0, "OK")
    candidate = Candidate(packaged_model(), "Q4_K_M", impossible, 1, "f16", cell, "test")
    said: list[str] = []
    result = asyncio.run(measure(candidate, 2.0, 0.25, 0.85, FitOptions(quality=None, idle_s=0), said.append))
    assert result.status == "failed"
    assert result.failures[0]["kind"] == "load_oom" and "failed to allocate" in result.failures[0]["detail"]
    assert any("failed to start" in line for line in said)


def test_ctrl_c_stops_the_server_fit_started_and_keeps_what_was_measured(tmp_path: Path) -> None:
    fit = _fit_in_a_process(tmp_path, idle_s=600)
    assert fit.stdout is not None
    for line in fit.stdout:  # the first candidate's server is up and idling
        if "loaded in" in line:
            break
    children = [int(p) for p in Path(f"/proc/{fit.pid}/task/{fit.pid}/children").read_text().split()]
    assert children, "fit started no server process"
    fit.send_signal(signal.SIGINT)
    rest = fit.communicate(timeout=60)[0]
    assert fit.returncode == 130, rest
    assert "interrupted" in rest
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"server {pid} outlived fit"
    report = orjson.loads((tmp_path / "fit.json").read_bytes())
    assert report["interrupted"] is True and report["chosen"] is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stop_fit_as_ctrl_c_does_and_mark_the_run_partial(tmp_path: Path, signum: int) -> None:
    """A `timeout`, a closed terminal or `kill`, after one candidate finished: no server left, the finished one
    written, and every file says the run is partial (no "next" line to serve with it)."""
    fit = _fit_in_a_process(tmp_path, idle_s=0)
    assert fit.stdout is not None
    second = False
    for line in fit.stdout:  # the second candidate's server is up: the first is measured
        second = second or line.startswith("[2/")
        if second and "loaded in" in line:
            break
    children = [int(p) for p in Path(f"/proc/{fit.pid}/task/{fit.pid}/children").read_text().split()]
    fit.send_signal(signum)
    rest = fit.communicate(timeout=60)[0]
    assert fit.returncode == 130, rest
    assert "Traceback" not in rest and "next:" not in rest and "partial run" in rest
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"server {pid} outlived fit"
    report = orjson.loads((tmp_path / "fit.json").read_bytes())
    assert report["interrupted"] is True and report["partial"] == "interrupted after 1 of 2 candidates"
    assert report["chosen"] is not None and len(report["candidates"]) == 1
    assert (tmp_path / "defaults.env").read_text().startswith("# PARTIAL: fit was interrupted after 1 of 2")
    assert "**Partial run: interrupted after 1 of 2 candidates.**" in (tmp_path / "fit.md").read_text()


def test_a_speculation_candidates_draft_acceptance_is_the_servers_own() -> None:
    """The speed phase against the real server: n-gram self-speculation, typing replayed through the proxy; what was
    drafted and accepted comes from llama.cpp's timings. The typed file repeats itself, so the server's own probes
    (whole completions of the final text, greedy) draft whatever the machine's load: the replay's answers draft only
    when the typing lets one finish, which a busy machine changes (`ngram-mod` on the shipped trace drafted nothing
    in one CI run beside two busy loops)."""
    cell = Cell("Q4_K_M", 512, 1, 0, 0, 0, 0, 0.0, "OK")
    candidate = Candidate(packaged_model(), "Q4_K_M", 512, 1, "f16", cell, "test")
    code = "values.append(compute(row, column, weight=1.0))\n" * 24  # drafts by the n-gram at once
    typed = [Edit(200 + 150 * i, "a.py", len(code) + i, 0, char) for i, char in enumerate("values.")]
    said: list[str] = []
    runs = asyncio.run(speed.measure(candidate, FitOptions(quality=None, idle_s=0), [("ngram-simple", 0, 1)],
                                     [Open(0, "a.py", code), *typed], 48, 3000, said.append))  # fmt: skip
    assert runs[0].ok, said
    assert runs[0].drafted > 0
    assert runs[0].draft_acceptance is not None and 0 <= runs[0].draft_acceptance <= 1
    assert runs[0].decode_tps and runs[0].first_text_p95_ms is not None
    # The server's own count: at least the prefill of the answer that gave the first text (how many more depends on
    # how many prefills the typing cut before their first token, which a busy machine changes).
    assert runs[0].prompt_computed is not None and runs[0].prompt_computed > 0


def _fit_in_a_process(out: Path, idle_s: int) -> subprocess.Popen[str]:
    """`fit --embedded` over two contexts as a user runs it, its output read line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "mellum_proxy", "fit", "--embedded", "--gpu-gib", "2", "--context", "256",
         "--contexts", "256,512", "--batches", "1", "--quality-tasks", "0", "--idle-s", str(idle_s), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_speculation_the_model_cannot_do_is_a_failure_in_one_line_with_its_reason() -> None:
    """`fit --spec draft-mtp` on a GGUF without a multi-token-prediction head: the server does not start, and the run
    says llama.cpp's reason, not the trailer it prints after it."""
    cell = Cell("Q4_K_M", 512, 1, 0, 0, 0, 0, 0.0, "OK")
    candidate = Candidate(packaged_model(), "Q4_K_M", 512, 1, "f16", cell, "test")
    _, events = speed.read_events([], 5)
    runs = asyncio.run(speed.measure(candidate, FitOptions(quality=None, idle_s=0), [("draft-mtp", 0, 1)], events,
                                     8, 3000, lambda line: None))  # fmt: skip
    assert not runs[0].ok and runs[0].failure is not None and "MTP" in runs[0].failure, runs[0].failure
