"""How each editor plugin reads the proxy's answer, transcribed from its own source at a named commit.

Each reader takes an answer (status and body bytes) and returns the text the plugin would show, or raises
`PluginBrokeError` where the plugin's own code would throw, or read a field of the wrong type. The comments
name the lines each check comes from; `fields` lists every answer field the plugin's code reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


class PluginBrokeError(AssertionError):
    """The plugin's own parsing code would fail (throw, or take a field of the wrong type) on this answer."""


def need(condition: bool, why: str) -> None:
    if not condition:
        raise PluginBrokeError(why)


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_object(raw: bytes, who: str) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PluginBrokeError(f"{who}: not JSON: {raw[:200]!r}") from exc
    need(isinstance(body, dict), f"{who}: not a JSON object")
    return cast(dict[str, Any], body)


def sse_data(raw: bytes) -> list[bytes]:
    """The `data:` payloads of an event stream, in order."""
    return [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]


# --- llama.vscode v0.0.63 (ggml-org/llama.vscode 3938fb3) ---------------------------------------------


def llama_vscode(status: int, raw: bytes) -> str:
    """src/llama-server.ts `getFIMCompletion` (axios: a non-2xx status throws), src/completion.ts
    `getComplFromContent` (`"content" in data`) and the catch block (`err.response?.data?.error?.message`),
    src/statusbar.ts `showInfo` (runs for every non-empty suggestion: `data.generation_settings.n_ctx` has no
    optional chaining; the timings are read with `?.toFixed(2)`, which needs numbers)."""
    if status >= 300:
        body = json_object(raw, "llama.vscode error")
        message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else None
        need(isinstance(message, str), "llama.vscode: an error without error.message")
        return ""
    data = json_object(raw, "llama.vscode")
    need("content" in data, "llama.vscode: getComplFromContent needs `content`")
    content = data["content"] if data["content"] is not None else ""
    need(isinstance(content, str), "llama.vscode: content is not a string")
    if content.strip():
        settings = data.get("generation_settings")
        need(isinstance(settings, dict), "llama.vscode: showInfo reads data.generation_settings.n_ctx (TypeError)")
        need("tokens_cached" in data, "llama.vscode: showInfo shows tokens_cached")
        timings = data.get("timings")
        if timings is not None:
            need(isinstance(timings, dict), "llama.vscode: timings is not an object")
            for name in ("prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"):
                if timings.get(name) is not None:
                    need(number(timings[name]), f"llama.vscode: timings.{name}.toFixed needs a number")
    return content


# --- llama.vim (ggml-org/llama.vim a1c8e6e) ----------------------------------------------------------

_LLAMA_VIM_QUICK = re.compile(rb'"content"\s*:"')
_LLAMA_VIM_TIMINGS = ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                      "predicted_per_second")  # fmt: skip


def llama_vim(status: int, raw: bytes) -> str:
    """autoload/llama.vim `s:fim_on_response`: the raw body must start with `{` and match `"content"\\s*:"`
    (else it is silently ignored: no suggestion), then json_decode; `s:fim_render`: `content` split on
    newlines, `tokens_cached`, and the six flat `timings/...` keys (str2float) only when all are there."""
    if status >= 300:
        return ""  # curl's body is not a completion: the fast check drops it
    need(raw.lstrip().startswith(b"{") and _LLAMA_VIM_QUICK.search(raw) is not None,
         "llama.vim: the fast check drops a body without `\"content\":\"`")  # fmt: skip
    data = json_object(raw, "llama.vim")
    need(isinstance(data.get("content"), str), "llama.vim: content is not a string")
    if "tokens_cached" in data:
        need(number(data["tokens_cached"]), "llama.vim: tokens_cached is not a number")
    keys = [f"timings/{name}" for name in _LLAMA_VIM_TIMINGS]
    if all(key in data for key in keys):
        need(all(number(data[key]) for key in keys), "llama.vim: a timings/ value is not a number")
    return str(data["content"])


# --- minuet-ai.nvim (milanglacier/minuet-ai.nvim 479487c) --------------------------------------------


def minuet(status: int, raw: bytes, stream: bool) -> str:
    """lua/minuet/utils.lua `stream_decode` (each line, `^data:` stripped, vim.json.decode; lines that fail
    are skipped; `get_text_fn` = backends/openai_fim_compatible.lua `json.choices[1].text` under pcall) and
    `no_stream_decode` (one JSON body). curl without --fail: the status is not looked at."""
    if not stream:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return ""  # 'Failed to parse ... as json': notified, no suggestion
        try:
            text = data["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            return ""
        return text if isinstance(text, str) else ""
    pieces = []
    for line in raw.split(b"\n"):
        try:
            data = orjson.loads(line.removeprefix(b"data:"))
            text = data["choices"][0]["text"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            continue
        if isinstance(text, str):
            pieces.append(text)
    return "".join(pieces)


# --- Continue (continuedev/continue) -----------------------------------------------------------------

_CONTINUE_PARAMETER = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')


def continue_show(body: dict[str, Any]) -> int:
    """core/llm/llms/Ollama.ts constructor (0108be5): each line of `/api/show`'s `parameters` goes through
    `line.match(...)` and `parts.length` (a line that does not match is a TypeError); `num_ctx` becomes the
    context length Continue sizes prompts by; FIM only when `template` includes `.Suffix`."""
    parameters = body.get("parameters")
    if not isinstance(parameters, str):
        raise PluginBrokeError("Continue: /api/show without parameters")
    context = 0
    for line in parameters.split("\n"):
        parts = _CONTINUE_PARAMETER.match(line)
        if parts is None:
            raise PluginBrokeError(f"Continue: a parameters line it cannot match: {line!r}")
        if parts[1] == "num_ctx":
            context = int(parts[2])
    need(".Suffix" in str(body.get("template")), "Continue: no .Suffix in the template: no FIM")
    return context


def continue_ollama(status: int, raw: bytes) -> str:
    """core/llm/llms/Ollama.ts `_streamFim` (0108be5) through core/llm/stream.ts `streamResponse` (status
    200 or throw): NDJSON lines, `JSON.parse` each (throws on garbage), `"error" in j` throws, else it
    yields `j.response` (a line without it would yield `undefined` into the completion)."""
    need(status == 200, f"Continue: streamResponse throws on status {status}")
    pieces = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        data = json_object(line, "Continue (Ollama)")
        need("error" not in data, f"Continue: the stream carried an error: {data.get('error')}")
        need(isinstance(data.get("response"), str), "Continue: a line without `response`")
        pieces.append(data["response"])
    return "".join(pieces)


def continue_openai(status: int, raw: bytes) -> str:
    """core/llm/llms/OpenAI.ts `_legacystreamComplete` (0069b94) through core/llm/stream.ts `streamSse`:
    status 200 or throw; every `data:` line before `[DONE]` must parse (else "Malformed JSON") and carry no
    `error`; it yields `value.choices?.[0]?.text` when present."""
    need(status == 200, f"Continue: streamResponse throws on status {status}")
    pieces = []
    for data in sse_data(raw):
        if data.startswith(b"[DONE]"):
            break
        event = json_object(data, "Continue (OpenAI)")
        need(not event.get("error"), f"Continue: error event {event.get('error')}")
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("text"):
            need(isinstance(choices[0]["text"], str), "Continue: choices[0].text is not a string")
            if event.get("finish_reason") != "eos":
                pieces.append(choices[0]["text"])
    return "".join(pieces)


# --- Twinny (twinnydotdev/twinny 193d14c) ------------------------------------------------------------


def twinny(status: int, raw: bytes) -> str:
    """src/extension/llm.ts `llm` (a non-ok status throws; each NDJSON line through `safeParseJsonResponse`,
    unparsable lines dropped) and src/extension/utils.ts `getFimDataFromProvider` (ollama: `data?.response`,
    appended to the completion)."""
    need(200 <= status < 300, f"Twinny: 'Server responded with status code: {status}'")
    pieces = []
    for line in raw.split(b"\n"):
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict):
            need(isinstance(data.get("response", ""), str), "Twinny: response is not a string")
            pieces.append(data.get("response") or "")
    return "".join(pieces)


# --- Tabby (TabbyML/tabby 131d61a) -------------------------------------------------------------------


def tabby(status: int, raw: bytes) -> str:
    """crates/http-api-bindings/src/completion/llama.rs `generate`: an EventSource; each message's data is
    `serde_json::from_str::<CompletionResponseChunk { content: String, stop: bool }>(...).unwrap()`, a panic
    on any other shape; it stops at `stop: true`. A non-2xx status is an EventSource error: the stream ends."""
    if status >= 300:
        return ""
    pieces = []
    for data in sse_data(raw):
        event = json_object(data, "Tabby")
        need(isinstance(event.get("content"), str) and isinstance(event.get("stop"), bool),
             f"Tabby: unwrap() panics on {event!r}")  # fmt: skip
        pieces.append(event["content"])
        if event["stop"]:
            break
    return "".join(pieces)


# --- JetBrains mellum-sdk (JetBrains/mellum-sdk 829da2c) ---------------------------------------------

_SDK_TYPES: dict[str, Callable[[Any], bool]] = {
    "model": lambda v: isinstance(v, str), "error": lambda v: isinstance(v, str),
    "created_at": lambda v: isinstance(v, str), "response": lambda v: isinstance(v, str),
    "done": lambda v: isinstance(v, bool), "done_reason": lambda v: isinstance(v, str),
    "context": lambda v: isinstance(v, list) and all(isinstance(i, int) for i in v),
    "total_duration": lambda v: isinstance(v, int), "load_duration": lambda v: isinstance(v, int),
    "prompt_eval_count": lambda v: isinstance(v, int), "prompt_eval_duration": lambda v: isinstance(v, int),
    "eval_count": lambda v: isinstance(v, int), "eval_duration": lambda v: isinstance(v, int),
}  # fmt: skip


def mellum_sdk(status: int, raw: bytes) -> str:
    """ollama/OllamaCompletionDto.kt `OllamaCompletionResponseDTO` (kotlinx.serialization, unknown keys
    ignored, each known one typed) and OllamaCompletionExecutor.kt (`result.response ?: error(...)`)."""
    data = json_object(raw, "mellum-sdk")
    for name, valid in _SDK_TYPES.items():
        if data.get(name) is not None:
            need(valid(data[name]), f"mellum-sdk: {name} has the wrong type for its DTO: {data[name]!r}")
    if status >= 300:
        return ""
    need(data.get("response") is not None, "mellum-sdk: error('No message in response')")
    return str(data["response"])


# --- Zed edit predictions (zed-industries/zed, crates/edit_prediction) -------------------------------------

ZED_END_TOKENS = ("<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
                  "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>", "<MID>",
                  "[PREFIX]", "[SUFFIX]")  # fmt: skip


def u32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def zed_raw(status: int, raw: bytes) -> str:
    """open_ai_compatible.rs `send_custom_server_request`: a non-2xx status is an error ("custom server error",
    logged, no prediction); the body parsed as `RawCompletionResponse` (serde: `id`, `object`, `model` strings,
    `created` a u64, `choices[]` of `text` and an optional `finish_reason`, and `usage` with three u32 counts,
    none of them optional); the first choice's text, else ""."""
    if status >= 300:
        return ""
    data = json_object(raw, "Zed")
    for name in ("id", "object", "model"):
        need(isinstance(data.get(name), str), f"Zed: {name} is not a string: {data.get(name)!r}")
    need(u32(data.get("created")), f"Zed: created is not a u64: {data.get('created')!r}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise PluginBrokeError("Zed: choices is not a list")
    for choice in choices:
        need(isinstance(choice, dict) and isinstance(choice.get("text"), str), "Zed: a choice without text")
        need(choice.get("finish_reason") is None or isinstance(choice["finish_reason"], str), "Zed: finish_reason")
    usage = data.get("usage")
    if not isinstance(usage, dict):
        raise PluginBrokeError("Zed: usage is missing (RawCompletionUsage is not optional)")
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        need(u32(usage.get(name)), f"Zed: usage.{name} is not a u32: {usage.get(name)!r}")
    return str(choices[0]["text"]) if choices else ""


def zed(status: int, raw: bytes) -> str:
    """A fill-in-the-middle prediction: fim.rs `clean_fim_completion` cuts the text at the first end token."""
    text = zed_raw(status, raw)
    for token in ZED_END_TOKENS:
        at = text.find(token)
        if at >= 0:
            text = text[:at]
    return text


# --- GitHub Copilot LLM Gateway (arbs-io/github-copilot-llm-gateway b2dec77) ------------------------------------


def copilot_gateway(status: int, raw: bytes) -> str:
    """src/api/client.ts `fetchCompletion` (a non-2xx status throws `CompletionHttpError`, caught in
    src/provider/inlineCompletionService.ts: no suggestion), src/completions/inlineCompletion.ts
    `extractCompletionText` (`response?.choices?.[0]?.text`, a string or nothing) and `cleanCompletionText`
    (whitespace only is nothing; trailing newlines trimmed)."""
    if status >= 300:
        return ""
    data = json_object(raw, "Copilot LLM Gateway")  # `await response.json()`: not JSON throws
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    text = first.get("text") if isinstance(first, dict) else None
    text = text if isinstance(text, str) else ""
    return "" if not text.strip() else text.rstrip("\n")


# --- cursortab.nvim (sweepai/cursortab.nvim bc06a8f) ------------------------------------------------------------


def cursortab(status: int, raw: bytes) -> str:
    """server/client/openai/openai.go `runLineStream` (a status other than 200 is an error: no completion) and
    `processLineStream` (each `data: ` line but `[DONE]` decoded as a `StreamChunk`: Go's json.Unmarshal fails on a
    wrong type, and the line is skipped; `choices[0].text` appended; `data: [DONE]` ends it)."""
    if status != 200:
        return ""
    text = []
    for line in raw.decode().split("\n"):
        if line == "data: [DONE]":
            break
        if not line.startswith("data: "):
            continue
        chunk = orjson.loads(line[6:])
        need(isinstance(chunk, dict), "cursortab: a chunk that is not an object")
        choices = chunk.get("choices")
        need(choices is None or isinstance(choices, list), "cursortab: choices is not a list")
        if choices:
            need(isinstance(choices[0].get("text", ""), str), "cursortab: text is not a string")
            need(isinstance(choices[0].get("finish_reason") or "", str), "cursortab: finish_reason")
            text.append(choices[0].get("text", ""))
    else:
        raise PluginBrokeError("cursortab: the stream ended without data: [DONE]")
    return "".join(text)


# --- Sweep's VS Code extension, local mode (sweepai/vscode-nes fa52a26) ------------------------------------------


def sweep_vscode(status: int, raw: bytes) -> str:
    """src/api/client.ts `sendRequest` (a status other than 200 rejects: no suggestion; a body that fails
    `AutocompleteResponseSchema` rejects too, and a 200 that does so is the proxy's fault) and `getAutocomplete`
    (the completion inserted between `start_index` and `end_index`, byte offsets with `use_bytes`)."""
    if status != 200:
        return ""
    data = json_object(raw, "Sweep")
    for name in ("autocomplete_id", "completion"):
        need(isinstance(data.get(name), str), f"Sweep: {name} is not a string: {data.get(name)!r}")
    for name in ("start_index", "end_index", "confidence"):
        need(number(data.get(name)), f"Sweep: {name} is not a number: {data.get(name)!r}")
    need(data.get("finish_reason") is None or isinstance(data["finish_reason"], str), "Sweep: finish_reason")
    need(data.get("elapsed_time_ms") is None or number(data["elapsed_time_ms"]), "Sweep: elapsed_time_ms")
    return str(data["completion"])


@dataclass(frozen=True)
class Plugin:
    """One plugin's request (a fixture) and its answer reader."""

    name: str
    path: str
    fixture: str
    read: Callable[[int, bytes], str]
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> dict[str, Any]:
        return cast(dict[str, Any], orjson.loads((FIXTURES / self.fixture).read_bytes()))


PLUGINS = (
    Plugin("llama.vscode", "/infill", "llama-vscode/fim.json", llama_vscode),
    Plugin("llama.vim", "/infill", "llama-vim/fim-with-extra.json", llama_vim),
    Plugin("minuet", "/v1/completions", "minuet/fim-stream.json", lambda s, r: minuet(s, r, stream=True)),
    Plugin("minuet (stream = false)", "/v1/completions", "minuet/fim-stream.json", lambda s, r: minuet(s, r, False)),
    Plugin("Continue (Ollama)", "/api/generate", "continue/ollama-fim.json", continue_ollama),
    Plugin("Continue (OpenAI)", "/v1/completions", "continue/openai-completions.json", continue_openai),
    Plugin("Twinny", "/api/generate", "twinny/ollama-fim.json", twinny),
    Plugin("Tabby", "/completion", "tabby/completion.json", tabby),
    Plugin("JetBrains mellum-sdk", "/api/generate", "mellum-sdk/generate.json", mellum_sdk),
    Plugin("Copilot LLM Gateway", "/v1/completions", "copilot-llm-gateway/inline.json", copilot_gateway),
    Plugin("cursortab.nvim", "/v1/completions", "cursortab/fim.json", cursortab),
    Plugin("Sweep (VS Code)", "/backend/next_edit_autocomplete", "sweep-vscode/next-edit.json", sweep_vscode),
    *(
        Plugin(f"Zed ({name})", "/v1/completions", f"zed/fim-{name.replace('_', '-')}.json", zed)
        for name in ("star_coder", "code_llama", "deepseek_coder", "qwen", "code_gemma", "codestral", "glm")
    ),
)


def request_body(plugin: Plugin) -> dict[str, Any]:
    body = plugin.body()
    if plugin.name == "minuet (stream = false)":
        body["stream"] = False
    return body
