"""`fit --server-cmd` starting a real vLLM per candidate (0.32.0 on the CPU, gemma-3-270m; `make test-vllm`):
each candidate measured, its allocations read from vLLM's own log, every process of it stopped after."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from tests.vllm.conftest import ENV, MODEL, PYTHON, READY_S, WANTED

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not WANTED, reason="opt in: make test-vllm")]

COMMAND = (f"{Path(PYTHON).absolute()} -m vllm.entrypoints.openai.api_server --model {{model}} --host 127.0.0.1 "
           "--port {port} --max-model-len {context} --max-num-seqs {batch} --kv-cache-dtype {vllm_kv} "
           "--dtype bfloat16 --enforce-eager")  # fmt: skip


def test_fit_measures_vllm_candidates_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    main(["fit", "--server-cmd", COMMAND, "--model", str(Path(MODEL).resolve()), "--gpu-gib", "16",
          "--context", "512", "--contexts", "512,1024", "--batches", "2", "--quality-tasks", "2", "--idle-s", "0",
          "--load-timeout-s", str(READY_S), "--out", str(tmp_path)])  # fmt: skip
    report = orjson.loads((tmp_path / "fit.json").read_bytes())
    assert [(c["context"], c["batch"]) for c in report["candidates"]] == [(512, 2), (1024, 2)]
    for run in report["candidates"]:
        assert run["status"] == "ok", run["failures"]
        assert run["memory_source"] == "host_rss" and run["measured_peak_gib"] > 0.5  # the engine's processes too
        assert run["logged"]["backend"] == "vllm" and run["prompt_tokens"]["long"] > 0.8 * run["context"]
    assert report["chosen"]["context"] == 512
    assert "--max-model-len 512 --max-num-seqs 2" in (tmp_path / "fit.md").read_text()
