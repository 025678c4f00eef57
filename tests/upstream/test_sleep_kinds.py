"""What each server kind says of its sleep, read from the answers its own source gives (no request that would
wake it), and the wake it is sent."""

from __future__ import annotations

from typing import Any

import pytest

from mellum_proxy.errors import UpstreamStatusError
from mellum_proxy.upstream.servers.llamacpp import LLAMACPP
from mellum_proxy.upstream.servers.lmstudio import LMSTUDIO
from mellum_proxy.upstream.servers.ollama import OLLAMA
from mellum_proxy.upstream.servers.vllm import VLLM


class Answers:
    """A transport answering GETs from a table (a missing path is a 404) and recording POSTs."""

    def __init__(self, answers: dict[str, Any], model: str | None = "m", keep_alive: str | None = "30m") -> None:
        self.answers, self.model, self.keep_alive = answers, model, keep_alive
        self.asked: list[str] = []
        self.posted: list[tuple[str, Any]] = []

    async def get_json(self, path: str, timeout_s: float = 2.0) -> Any:
        self.asked.append(path)
        if path not in self.answers:
            raise UpstreamStatusError(404, "not found")
        return self.answers[path]

    async def post_json(self, path: str, body: Any, timeout_s: float = 2.0) -> Any:
        self.posted.append((path, body))
        return {}


@pytest.mark.parametrize(
    ("kind", "answers", "said"),
    [
        (LLAMACPP, {"/props": {"total_slots": 2, "is_sleeping": True}}, True),
        (LLAMACPP, {"/props": {"total_slots": 2, "is_sleeping": False}}, False),
        (LLAMACPP, {"/props": {"total_slots": 2}}, None),  # a build without sleep
        (LLAMACPP, {"/v1/models": {"data": [{"id": "m", "status": {"value": "unloaded"}}]}}, True),  # router mode
        (LLAMACPP, {"/v1/models": {"data": [{"id": "m", "status": {"value": "loaded", "args": []}}]}}, False),
        (OLLAMA, {"/api/ps": {"models": []}}, True),  # unloaded after its keep_alive
        (OLLAMA, {"/api/ps": {"models": [{"name": "m", "model": "m"}]}}, False),
        (VLLM, {"/is_sleeping": {"is_sleeping": True}}, True),
        (VLLM, {}, None),  # sleep mode off: 404
        (LMSTUDIO, {"/api/v1/models": {"models": [{"key": "m", "type": "llm", "loaded_instances": []}]}}, True),
        (LMSTUDIO, {"/api/v1/models": {"models": [{"key": "m", "loaded_instances": [{"id": "m"}]}]}}, False),
    ],
)
async def test_each_kind_says_whether_its_model_sleeps(kind: Any, answers: dict[str, Any], said: bool | None) -> None:
    transport = Answers(answers)
    assert kind.asleep is not None and await kind.asleep(transport) is said
    assert "/slots" not in transport.asked  # a task for llama.cpp: it would wake it, and keep it awake


async def test_ollama_is_woken_by_its_preload_and_vllm_by_wake_up() -> None:
    ollama = Answers({})
    assert OLLAMA.wake is not None
    await OLLAMA.wake(ollama)
    assert ollama.posted == [("/api/generate", {"model": "m", "stream": False, "keep_alive": "30m"})]
    vllm = Answers({})
    assert VLLM.wake is not None
    await VLLM.wake(vllm)
    assert vllm.posted == [("/wake_up", {})]
    assert LLAMACPP.wake is None  # a prefill-only completion of the prompt: it loads the model and fills the cache
