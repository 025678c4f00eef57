"""Finding an exact local tokenizer for the served model, so the budget needs no round trip.

Where the model lives: the embedded server's GGUF, else what the upstream says it serves (llama.cpp
`/props` `model_path`, vLLM `/v1/models` `root`) when that path is on this machine. A `.gguf` file
gives its own vocabulary (`gguf_vocab`, rebuilt once and cached as a `tokenizer.json` under the user's
cache directory, because reading a GGUF's vocabulary takes seconds); a model directory gives its
`tokenizer.json`. Before it is used, the local tokenizer must give the same token ids as the server's
`/tokenize` on `PROBES`; otherwise the proxy keeps asking the server.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mellum_proxy.budget.gguf_vocab import UnsupportedVocabulary, tokenizer_from_gguf
from mellum_proxy.budget.tokenizers import GgufTokenizer, HfTokenizer
from mellum_proxy.errors import UpstreamError

log = logging.getLogger("mellum_proxy.budget")

# What the check compares: code, the FIM markers as a client renders them, whitespace runs, non-ASCII.
PROBES = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "<filename>app.py\n<fim_suffix>\n    return x<fim_prefix>import os\n\ndef f(x):\n\t<fim_middle>",
    "   lots   of    spaces\n\n\n\t\t}\r\n",
    "naïve café ✓ 😀 中文 — «quotes»",
    "for (let i = 0; i < 10; i++) { console.log(`${i}`); }",
)


_LOADED: dict[str, GgufTokenizer] = {}  # by model file: loading even the cached file takes most of a second
_BUILDING = threading.Lock()
T = TypeVar("T")


class ModelServer(Protocol):
    async def tokenize(self, body: dict[str, Any]) -> Any: ...

    async def get_json(self, path: str) -> Any: ...


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mellum-proxy" / "tokenizers"


async def served_model_path(server: ModelServer) -> Path | None:
    """The served model's path, if the upstream names one that exists on this machine."""
    candidates: list[Any] = []
    try:
        props = await server.get_json("/props")
        if isinstance(props, dict):
            candidates.append(props.get("model_path"))
    except UpstreamError:
        pass
    try:
        models = await server.get_json("/v1/models")
        for model in (models.get("data") or []) if isinstance(models, dict) else []:
            if isinstance(model, dict):
                candidates += [model.get("root"), model.get("id")]
    except UpstreamError:
        pass
    paths = [Path(c) for c in candidates if isinstance(c, str) and c]
    return next((path for path in await asyncio.to_thread(lambda: [p for p in paths if p.exists()])), None)


async def in_daemon_thread(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` in a thread nobody waits for at exit: a proxy stopped during a first GGUF read
    (seconds) exits at once instead of finishing the read."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            result = work(*args)
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            error = exc
            callback = lambda: settle(lambda: future.set_exception(error))  # noqa: E731
        else:
            callback = lambda: settle(lambda: future.set_result(result))  # noqa: E731
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=run, name="local-tokenizer", daemon=True).start()
    return await future


def needs_building(model: Path) -> bool:
    """Whether `model`'s tokenizer must first be rebuilt from its GGUF vocabulary (seconds of Python), rather
    than read from a file (about a second, which is still too long once the proxy answers)."""
    return (
        model.suffix == ".gguf"
        and _file_key(model) not in _LOADED
        and not (cache_dir() / f"{_file_key(model)}.json").is_file()
    )


async def build_aside(model: Path) -> None:
    """Build a GGUF's tokenizer cache in a process of its own at the lowest CPU priority, the first time.

    Reading a GGUF's vocabulary is seconds of Python: in this process it would hold the interpreter's lock
    against the request loop, and on a busy laptop take the core the first completions need.
    """
    if not needs_building(model):
        return
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mellum_proxy.budget.local", str(model), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await process.wait()
    finally:
        if process.returncode is None:  # the proxy stops meanwhile
            process.kill()
            await process.wait()


def load_local(model: Path) -> HfTokenizer:
    with _BUILDING:  # one build at a time; a second caller then finds the first one's result
        tokenizer = _load_local(model)
    _return_freed_memory()
    return tokenizer


def _return_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc): parsing a 30 MB tokenizer file leaves
    ~200 MB of freed memory resident otherwise."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused by later allocations instead


def _load_local(model: Path) -> HfTokenizer:
    """The tokenizer of a GGUF file (cached), a `tokenizer.json`, or a model directory's (blocking).

    Raises:
        UnsupportedVocabulary: nothing usable there.
    """
    if model.is_dir():
        if not (model / "tokenizer.json").is_file():
            raise UnsupportedVocabulary(f"{model} has no tokenizer.json")
        return HfTokenizer(model / "tokenizer.json")
    if model.suffix == ".json":
        return HfTokenizer(model)
    from tokenizers import Tokenizer

    key = _file_key(model)
    if key in _LOADED:
        return _LOADED[key]
    cached = cache_dir() / f"{key}.json"
    if cached.is_file():
        try:
            _LOADED[key] = GgufTokenizer(Tokenizer.from_file(str(cached)))
            return _LOADED[key]
        except Exception:  # a damaged cache file is rebuilt
            cached.unlink(missing_ok=True)
    tokenizer = tokenizer_from_gguf(model)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".tmp")
        tokenizer.save(str(partial))
        partial.replace(cached)
    except OSError as exc:
        log.info("could not cache the tokenizer of %s (%s); it is rebuilt at each start", model.name, exc)
    _LOADED[key] = GgufTokenizer(tokenizer)
    return _LOADED[key]


def _file_key(model: Path) -> str:
    """Which model file this is, wherever it lies: its size and its first and last MiB (the GGUF header
    holds the vocabulary; the end, the last tensors)."""
    size = model.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with model.open("rb") as file:
        digest.update(file.read(1 << 20))
        file.seek(max(0, size - (1 << 20)))
        digest.update(file.read(1 << 20))
    return digest.hexdigest()[:20]


ServerIds = Callable[[str], Awaitable[list[int]]]


async def agreement(local: HfTokenizer, server: ModelServer, server_ids: ServerIds | None = None) -> tuple[int, int]:
    """On how many of `PROBES` the local ids equal the server's `/tokenize` (BOS included); `server_ids`
    asks it in its own body (vLLM's), else llama.cpp's."""
    same = 0
    for text in PROBES:
        if server_ids is not None:
            ids = await server_ids(text)
        else:
            body = await server.tokenize({"content": text, "add_special": True})
            ids = [t["id"] if isinstance(t, dict) else t for t in (body.get("tokens") or [])]
        same += ids == local.ids(text)
    return same, len(PROBES)


async def find_local(
    server: ModelServer, embedded_model: Path | None, server_ids: ServerIds | None = None
) -> HfTokenizer | None:
    """An exact local tokenizer for the served model that agrees with the server, or None (logged why).

    Only one that is ready to read: loading holds the interpreter's lock for about a second (the `tokenizers`
    library does not release it), so it is done before the proxy says it is ready, never after; a GGUF whose
    vocabulary was never cached is left to `build_aside`, for the next start.
    """
    model = embedded_model or await served_model_path(server)
    if model is None:
        log.info("tokenizer: the upstream names no model file on this machine; asking its /tokenize")
        return None
    if needs_building(model):
        log.info("tokenizer: %s's vocabulary is not cached yet; asking the upstream's /tokenize", model.name)
        return None
    try:
        local = await in_daemon_thread(load_local, model)
    except (UnsupportedVocabulary, ValueError, OSError) as exc:
        log.info("tokenizer: no local tokenizer from %s (%s); asking the upstream's /tokenize", model.name, exc)
        return None
    try:
        same, total = await agreement(local, server, server_ids)
    except UpstreamError as exc:
        log.info("tokenizer: cannot check %s against the upstream (%s); asking its /tokenize", model.name, exc)
        return None
    if same < total:
        log.warning("tokenizer: %s disagrees with the upstream on %d of %d probes; asking its /tokenize",
                    model.name, total - same, total)  # fmt: skip
        return None
    return local


if __name__ == "__main__":  # `build_aside`'s child: build and cache one model's tokenizer, yielding the CPU
    os.nice(19)
    load_local(Path(sys.argv[1]))
