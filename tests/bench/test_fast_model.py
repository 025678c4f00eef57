"""The fast model: a real llama.cpp server on random weights with gemma-3's vocabulary, written by
`benchmarks fast-model`; the embedded server loads it, tokenizes as gemma-3 does, and completes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from benchmarks.cli import main
from benchmarks.doubles.fast_model import FastShape, write_fast_model
from mellum_proxy.proc import pin_apart, thread_ids
from mellum_proxy.upstream.embedded import EmbeddedServer

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def test_the_fast_model_tokenizes_as_gemma_and_completes_pinned_apart(tmp_path: Path, embedded_server: Any) -> None:
    model = tmp_path / "fast.gguf"
    write_fast_model(model, FastShape(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64))
    server = EmbeddedServer(model, ctx_tokens=1024, slots=2)
    url = server.start()
    allowed = os.sched_getaffinity(0)
    pinned = len(allowed) > 1  # `--pin-server`: llama.cpp's threads on a CPU of their own, still answering
    if pinned:
        theirs, _ = pin_apart(server.thread_ids, server.threads)
        assert all(os.sched_getaffinity(tid) == theirs for tid in server.thread_ids & thread_ids())

    async def ask(base: str, path: str, body: dict[str, Any]) -> Any:
        async with aiohttp.ClientSession() as session, session.post(base + path, json=body) as resp:
            assert resp.status == 200
            return await resp.json()

    async def check() -> None:
        text = {"content": "def add(a, b):\n    return a + b  # ✓"}
        assert await ask(url, "/tokenize", text) == await ask(embedded_server.url, "/tokenize", text)
        answer = await ask(url, "/v1/completions", {"prompt": "x = ", "max_tokens": 8, "temperature": 0})
        assert answer["usage"]["completion_tokens"] >= 1  # noise, but llama.cpp's own decoding and scheduling

    try:
        asyncio.run(check())
    finally:
        server.stop()
        for tid in thread_ids() if pinned else ():
            os.sched_setaffinity(tid, allowed)


@pytest.mark.parametrize("argv", [["--hidden", "30", "--heads", "4"], ["--heads", "4", "--kv-heads", "3"]])
def test_a_shape_llama_cannot_split_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["fast-model", "--out", "x.gguf", *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err.count("\n") == 1
