"""Typed-through reuse over HTTP: the outcome header, the request log and /metrics say `reused`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from mellum_proxy.http import RECORDS
from mellum_proxy.telemetry.stats import read_log
from tests.conftest import ProxyFactory
from tests.sse import dialect_text


def records(proxy: Any) -> list[Any]:
    return list(proxy.app[RECORDS])


async def test_typing_through_is_answered_without_the_upstream(make_proxy: ProxyFactory, fake_upstream: Any,
                                                               tmp_path: Any) -> None:  # fmt: skip
    fake, url = await fake_upstream(tokens=4)  # writes "t0 t1 t2 t3 "
    log = tmp_path / "requests.jsonl"
    proxy = await make_proxy(upstream=url, tokenizer="chars", log=log)
    body = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 8}
    first = await proxy.post("/infill", json=body)
    assert first.headers["X-Mellum-Outcome"] == "ok"
    assert (await first.json())["content"] == "t0 t1 t2 t3 "
    second = await proxy.post("/infill", json=body | {"input_prefix": "x = t0 t"})
    assert second.headers["X-Mellum-Outcome"] == "reused"
    answer = await second.json()
    assert answer["content"] == "1 t2 t3 "  # exactly the rest
    # what it counts: the rest spans 3 of the server's tokens (one in part); no prompt was evaluated
    assert (answer["tokens_predicted"], answer["tokens_evaluated"], answer["timings"]["predicted_n"]) == (3, 0, 3)
    third = await proxy.post("/v1/completions", json={"prompt": "x = t0 t1 ", "suffix": "\n", "max_tokens": 8})
    assert third.headers["X-Mellum-Outcome"] == "reused"
    assert (await third.json())["usage"] == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}
    assert len(fake.payloads) == 1
    metrics = await (await proxy.get("/metrics")).text()
    assert 'mellum_proxy_requests_total{outcome="reused"} 2.0' in metrics
    await proxy.close()  # shutdown flushes the log
    lines = read_log(log)[0]
    assert [line["outcome"] for line in lines] == ["ok", "reused", "reused"]
    assert lines[1]["reached_upstream"] is False


BODIES: dict[str, tuple[str, Callable[[str, bool], dict[str, Any]]]] = {
    "openai": ("/v1/completions", lambda prefix, stream: {"prompt": prefix, "suffix": "\n", "max_tokens": 8,
                                                            "stream": stream}),
    "llamacpp": ("/infill", lambda prefix, stream: {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 8,
                                                    "stream": stream}),
    "ollama": ("/api/generate", lambda prefix, stream: {"model": "m", "prompt": prefix, "suffix": "\n", "raw": True,
                                                        "stream": stream, "options": {"num_predict": 8}}),
}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(BODIES))
async def test_reuse_in_every_dialect(make_proxy: ProxyFactory, fake_upstream: Any, dialect: str,
                                      stream: bool) -> None:  # fmt: skip
    fake, url = await fake_upstream(tokens=4)
    proxy = await make_proxy(upstream=url, tokenizer="chars")
    path, body = BODIES[dialect]
    first = await proxy.post(path, json=body("x = ", stream))
    assert await dialect_text(first, dialect, stream) == "t0 t1 t2 t3 "
    second = await proxy.post(path, json=body("x = t0 t", stream))
    assert await dialect_text(second, dialect, stream) == "1 t2 t3 "
    assert len(fake.payloads) == 1
    assert [r.outcome for r in records(proxy)] == ["ok", "reused"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reused_answer_keeps_to_the_requests_own_stop_and_max_tokens(
    make_proxy: ProxyFactory, fake_upstream: Any, stream: bool
) -> None:
    """A plugin that switches to one line (stop at a newline), or asks for fewer tokens, gets what the server
    would have given it: never the rest of a longer, multi-line completion."""
    fake, url = await fake_upstream(pieces=[" sum(", "u.age", ")", "\n", "    return", " total", "\n"])
    proxy = await make_proxy(upstream=url, tokenizer="chars", timeout_ms=0)
    body = {"prompt": "total =", "suffix": "\n", "max_tokens": 32}
    assert (await (await proxy.post("/v1/completions", json=body)).json())["choices"][0]["text"].startswith(" sum(")
    typed = {**body, "prompt": "total = s", "stream": stream}

    async def answer(extra: dict[str, Any]) -> tuple[str, str]:
        resp = await proxy.post("/v1/completions", json={**typed, **extra})
        assert resp.headers.get("X-Mellum-Outcome", "reused") == "reused"
        if not stream:
            choice = (await resp.json())["choices"][0]
            return choice["text"], choice["finish_reason"]
        events = [orjson.loads(line[6:]) for line in (await resp.read()).split(b"\n\n") if line.startswith(b"data: {")]
        return "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]["finish_reason"]

    assert await answer({"stop": ["\n"]}) == ("um(u.age)", "stop")
    assert await answer({"max_tokens": 2}) == ("um(u.age", "length")  # the rest of " sum(", then "u.age"
    assert await answer({}) == ("um(u.age)\n    return total\n", "stop")
    assert len(fake.payloads) == 1 and all(r.outcome == "reused" for r in records(proxy)[1:])
