"""Ollama's native `/api/generate`: the request the proxy sends and the NDJSON it reads back
(ollama `api/types.go` `GenerateRequest`, `GenerateResponse`, `Metrics`)."""

from __future__ import annotations

import pytest

from mellum_proxy.budget import CharsEstimator
from mellum_proxy.errors import UpstreamProtocolError, UpstreamStatusError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest
from mellum_proxy.upstream.servers.ollama import (
    chunk_from_line,
    context_of,
    generate_payload,
    listed_model,
    loaded_model,
    read_ndjson,
)


def prompt(suffix: str | None = None) -> BudgetedPrompt:
    return BudgetedPrompt("<fim_prefix>a<fim_suffix>b<fim_middle>", suffix, 64, ("<fim_prefix>",), 9, 9, False, "chars")


def test_the_prompt_goes_raw_with_the_options_ollama_reads() -> None:
    request = NormalizedRequest("r", "openai", "s", "a", params={"temperature": 0.1, "stop": "\n\n", "logprobs": 2})
    payload = generate_payload(request, prompt(), "mellum:4b", {"temperature": 0.5, "top_k": 20})
    assert payload == {
        "model": "mellum:4b", "prompt": "<fim_prefix>a<fim_suffix>b<fim_middle>", "stream": True, "raw": True,
        "options": {"temperature": 0.1, "top_k": 20, "num_predict": 64, "stop": ["\n\n", "<fim_prefix>"]},
    }  # fmt: skip
    templated = generate_payload(request, prompt(suffix="b"), "mellum:4b")
    assert templated["suffix"] == "b" and "raw" not in templated  # template `none`: Ollama's template places it


def test_the_last_line_carries_usage_and_timings_in_milliseconds() -> None:
    chunk = chunk_from_line(b'{"model":"m","response":"","done":true,"done_reason":"length","prompt_eval_count":7,'
                            b'"prompt_eval_duration":2500000,"eval_count":3,"eval_duration":9000000}')  # fmt: skip
    assert chunk.finish_reason == "length"
    assert chunk.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert chunk.timings == {"prompt_n": 7, "prompt_ms": 2.5, "predicted_n": 3, "predicted_ms": 9.0}
    assert chunk_from_line(b'{"response":"x","done":true}').finish_reason == "stop"  # an older server: no reason
    assert chunk_from_line(b'{"response":"x","done":false}').text == "x"


@pytest.mark.parametrize(
    "line, message",
    [
        (b'{"response": 3, "done": false}', "'response' that is not a string"),
        (b'{"response": "", "done": true, "eval_count": "3"}', "'completion_tokens' that is not a number"),
        (b"[1]", "not an object"),
        (b"{oops", "unreadable"),
    ],
)
def test_a_malformed_line_is_a_protocol_error_naming_it(line: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError, match=message):
        chunk_from_line(line)


async def test_lines_split_across_reads_are_joined_and_an_error_line_is_the_servers() -> None:
    async def body(*parts: bytes):  # type: ignore[no-untyped-def]
        for part in parts:
            yield part

    split = body(b'{"response":"a","do', b'ne":false}\n{"response":"b","done":true}\n')
    batches = [batch async for batch in read_ndjson(split)]
    assert [[c.text for c in batch] for batch in batches] == [["a", "b"]]
    seen = []
    with pytest.raises(UpstreamStatusError, match="out of memory"):
        async for batch in read_ndjson(body(b'{"response":"a","done":false}\n{"error":"out of memory"}\n')):
            seen.extend(batch)
    assert [c.text for c in seen] == ["a"]


def test_the_context_comes_from_ps_then_show_parameters() -> None:
    ps = {"models": [{"name": "mellum:4b", "context_length": 8192}]}
    assert loaded_model(ps) == ps["models"][0] and context_of(loaded_model(ps), None) == 8192
    assert loaded_model({"models": []}) is None and loaded_model({"models": [{}, {}]}) is None
    assert context_of(None, {"parameters": 'stop "<fim_prefix>"\nnum_ctx                        2048\n'}) == 2048
    assert context_of(None, {"parameters": "temperature 0.2"}) is None
    assert listed_model({"models": [{"name": "mellum:4b"}]}) == "mellum:4b"
    assert listed_model({"models": [{"name": "a"}, {"name": "b"}]}) is None


def test_a_count_of_only_the_uncached_prompt_does_not_calibrate_the_estimate() -> None:
    """Ollama's `prompt_eval_count` counts what it evaluated, not what it reused from its cache."""
    counter = CharsEstimator()
    counter.observe("x" * 4000, 20)  # 200 characters a token: a partial count
    assert counter.chars_per_token == counter.initial
    counter.observe("x" * 4000, 1000)
    assert counter.chars_per_token == 4.0
