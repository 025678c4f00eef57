"""Each dialect's parser on its own: the captured plugin bodies become the normalized request the core
reads, and every wrong type is a clear `InvalidRequestError` naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mellum_proxy.dialects import llamacpp, ollama, openai, sweep
from mellum_proxy.dialects.base import FieldReader, header, session_key
from mellum_proxy.edit_region import edit_region_format
from mellum_proxy.errors import InvalidRequestError

CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
HEADERS = {"User-Agent": "test-plugin/1.0"}


def captured(name: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads((CLIENTS / name).read_bytes())
    return body


def test_openai_reads_minuets_body() -> None:
    body = captured("minuet/fim-stream.json")
    request = openai.parse_completion(body, HEADERS, "r1")
    assert (request.prefix, request.suffix) == (body["prompt"], body["suffix"])
    assert request.stream and request.max_tokens == 128 and request.params["top_p"] == 0.9
    assert request.params["model"] == "mellum"  # not read by the proxy: passed on as the plugin sent it
    assert request.session == "default/test-plugin/1.0" and request.route == "openai"


def test_openai_takes_a_one_string_prompt_list_and_refuses_the_rest() -> None:
    assert openai.parse_completion({"prompt": ["x = "]}, {}, "r").prefix == "x = "
    with pytest.raises(InvalidRequestError, match="'prompt' must be a string"):
        openai.parse_completion({"prompt": ["a", "b"]}, {}, "r")
    with pytest.raises(InvalidRequestError, match="'n' must be 1"):
        openai.parse_completion({"prompt": "x", "n": 2}, {}, "r")
    with pytest.raises(InvalidRequestError, match="'max_tokens' must be >= 0"):
        openai.parse_completion({"prompt": "x", "max_tokens": -1}, {}, "r")


def test_openai_names_the_session_by_header_then_user() -> None:
    body = {"prompt": "x", "user": "alice"}
    assert openai.parse_completion(body, {}, "r").session == "alice"
    assert openai.parse_completion(body, {"X-Session-Id": "tab-7"}, "r").session == "tab-7"


def test_infill_reads_llama_vscodes_body_and_drops_what_the_proxy_owns() -> None:
    body = captured("llama-vscode/fim-mid-line.json")
    request = llamacpp.parse_infill(body, {"X-File-Path": "app.py"}, "r")
    assert request.prefix == body["input_prefix"] + body.get("prompt", "")  # the line so far joins the prefix
    assert request.suffix == body["input_suffix"] and request.file_path == "app.py"
    assert [name for name, _ in request.context_files] == [e["filename"] for e in body["input_extra"] if e["text"]]
    assert "id_slot" not in request.params and "n_cmpl" not in request.params  # the proxy owns slots


def test_infill_keeps_llama_vims_response_fields_and_never_names_the_file_from_its_ring() -> None:
    body = captured("llama-vim/fim-with-extra.json")
    request = llamacpp.parse_infill(body, {}, "r")
    assert request.response_fields == tuple(body["response_fields"])
    assert request.file_path is None  # input_extra names other buffers, never the edited one


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_extra": {"text": "x"}}, "'input_extra' must be a list"),
        ({"input_extra": [{"text": 3, "filename": "a"}]}, "string 'text' and 'filename'"),
        ({"n_predict": -2}, "'n_predict' must be >= -1"),
        ({"input_prefix": 1}, "'input_prefix' must be a string"),
    ],
)
def test_infill_refuses_wrong_types(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        llamacpp.parse_infill(body, {}, "r")


def test_completion_reads_tabbys_body() -> None:
    body = captured("tabby/completion.json")
    request = llamacpp.parse_completion(body, HEADERS, "r")
    assert request.prefix == body["prompt"] and request.suffix is None
    assert request.max_tokens == 64 and request.params["seed"] == 0 and request.params["temperature"] == 0.1
    assert request.params["penalty_last_n"] == 0  # llama.cpp's own options pass through
    assert llamacpp.parse_completion({"prompt": "x", "n_predict": -1}, {}, "r").max_tokens is None  # unbounded
    with pytest.raises(InvalidRequestError, match="token arrays"):
        llamacpp.parse_completion({"prompt": [1, 2]}, {}, "r")


def test_generate_reads_continues_ollama_body() -> None:
    body = captured("continue/ollama-fim.json")
    request = ollama.parse_generate(body, HEADERS, "r")
    assert (request.prefix, request.suffix) == (body["prompt"], body["suffix"])
    assert request.max_tokens == 128 and request.context_tokens == 2048
    assert request.params["stop"] == body["options"]["stop"] and request.params["temperature"] == 0.01
    assert "model" not in request.params and "keep_alive" not in request.params  # not the client's to choose


def test_generate_streams_unless_told_not_to() -> None:
    assert ollama.parse_generate({"prompt": "x"}, {}, "r").stream
    assert not ollama.parse_generate(captured("mellum-sdk/generate.json"), {}, "r").stream
    assert ollama.parse_generate({"prompt": "x", "options": {"num_predict": -1}}, {}, "r").max_tokens is None
    with pytest.raises(InvalidRequestError, match="'options' must be an object"):
        ollama.parse_generate({"prompt": "x", "options": [1]}, {}, "r")
    with pytest.raises(InvalidRequestError, match=r"'options\.num_ctx' must be >= 1"):
        ollama.parse_generate({"prompt": "x", "options": {"num_ctx": 0}}, {}, "r")


@pytest.mark.parametrize("body", [[], "x", 3, None])
@pytest.mark.parametrize(
    "parse", [openai.parse_completion, llamacpp.parse_infill, ollama.parse_generate, sweep.parse_next_edit]
)
def test_every_parser_wants_an_object(parse: Any, body: Any) -> None:
    with pytest.raises(InvalidRequestError, match="must be a JSON object"):
        parse(body, {}, "r")


def test_sweep_reads_the_extensions_file_and_byte_cursor() -> None:
    body = captured("sweep-vscode/next-edit.json")
    request = sweep.parse_next_edit(body, {}, "r")
    assert request.prefix.endswith("    total = ") and request.suffix is not None
    assert request.suffix.startswith("\n\n    return total / len(users)") and not request.stream
    assert request.file_path == "/home/dev/demo/demo.py"
    emoji = {"file_contents": "s = '\U0001f600'\nx = ", "cursor_position": len("s = '\U0001f600'\nx = ".encode()),
             "use_bytes": True}  # fmt: skip
    assert sweep.parse_next_edit(emoji, {}, "r").prefix == emoji["file_contents"]  # bytes, not characters
    with pytest.raises(InvalidRequestError, match="past the end"):
        sweep.parse_next_edit({**emoji, "cursor_position": 99}, {}, "r")
    with pytest.raises(InvalidRequestError, match="'file_contents' and 'cursor_position' are required"):
        sweep.parse_next_edit({"file_contents": "x"}, {}, "r")


def test_cursortabs_sweep_prompt_is_an_edit_region() -> None:
    """cursortab.nvim's `sweep` provider (server/provider/sweep/sweep.go `buildPrompt`, bc06a8f) writes the same
    file blocks as Zed's: passed through untouched."""
    prompt = ("<|file_sep|>demo.py.diff\n<<<<<<< ORIGINAL\n\n=======\n    total = \n>>>>>>> UPDATED\n\n"
              "<|file_sep|>original/demo.py\ndef f():\n\n<|file_sep|>current/demo.py\ndef f():\n    total = \n"
              "<|file_sep|>updated/demo.py\n")  # fmt: skip
    assert edit_region_format(prompt) == "sweep"


def test_field_reader_passes_on_what_it_did_not_read_but_not_too_deep() -> None:
    fields = FieldReader({"temperature": 0.2, "mirostat": 2, "grammar": {"a": [1]}})
    assert fields.sampling() == {"temperature": 0.2}
    assert fields.rest() == {"mirostat": 2, "grammar": {"a": [1]}}
    deep: Any = 0
    for _ in range(70):
        deep = [deep]
    with pytest.raises(InvalidRequestError, match="nested more than 64"):
        FieldReader({"x": deep}).rest()
    with pytest.raises(InvalidRequestError, match="'stream_options' must be an object"):
        FieldReader({"stream_options": True}).rest()
    with pytest.raises(InvalidRequestError, match="'temperature' must be a number"):
        FieldReader({"temperature": True}).sampling()


def test_headers_that_are_not_utf8_become_replacement_characters() -> None:
    raw = "caf\udcc3\udca9"  # what aiohttp keeps for the UTF-8 bytes of "café"
    assert header({"X-File-Path": raw}, "X-File-Path") == "café"
    assert session_key({}) == "default" and session_key({"User-Agent": "x" * 100}) == "default/" + "x" * 64
