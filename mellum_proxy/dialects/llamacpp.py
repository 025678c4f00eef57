"""llama.cpp's own endpoints: `POST /infill` (llama.vim, llama.vscode) and `POST /completion`
(Continue's llama.cpp provider, Tabby's llama.cpp backend).

Request fields as the plugins send them (ggml-org/llama.vim `autoload/llama.vim` `llama#fim`;
ggml-org/llama.vscode `src/llama-server.ts` `createRequestPayload`; continuedev/continue
`core/llm/llms/LlamaCpp.ts`): `input_prefix`, `input_suffix`, `input_extra` ([{text, filename, time}]),
`prompt` (for /infill: the current line before the cursor, appended to the prefix), `n_predict`,
`stream`, `samplers`, `cache_prompt`, `t_max_prompt_ms`, `t_max_predict_ms`, `n_indent`,
`response_fields`, `id_slot`. Answers in llama.cpp's shape: `content`, `stop`, `timings`,
`tokens_cached`, `truncated`, and for `stream: true` SSE events with `content` and `stop`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mellum_proxy.dialects.base import (
    CompletionRoute,
    Dialect,
    Encoder,
    FieldReader,
    capped_max_tokens,
    finish_reason,
    header,
    require_object,
    session_key,
)
from mellum_proxy.edit_region import edit_region_format
from mellum_proxy.errors import InvalidRequestError, ProxyError
from mellum_proxy.models import Chunk, Completion, NormalizedRequest, Outcome

INFILL, COMPLETION = "llamacpp-infill", "llamacpp-completion"
# The proxy answers the shape itself; what it owns on the server (slots, `n_cmpl`: llama.vscode asks for 3
# completions, which would interleave into one garbled text) is never forwarded (`base.SERVER_OWNED`).
_NOT_FORWARDED = ("response_fields",)


def _extra_files(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InvalidRequestError("'input_extra' must be a list of {text, filename} objects")
    files = []
    for item in value:
        text, name = item.get("text", ""), item.get("filename", "")
        if not isinstance(text, str) or not isinstance(name, str):
            raise InvalidRequestError("'input_extra' items need string 'text' and 'filename'")
        files.append((name, text))
    return tuple(files)


def _response_fields(value: Any) -> tuple[str, ...] | None:
    return tuple(f for f in value if isinstance(f, str)) if isinstance(value, list) else None


def _max_tokens(fields: FieldReader) -> int | None:
    n_predict = fields.integer("n_predict", minimum=-1)
    return capped_max_tokens(fields, None if n_predict in (None, -1) else n_predict, "max_tokens")


def parse_infill(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    fields = FieldReader(require_object(body))
    prefix = fields.string("input_prefix", "") or ""
    suffix = fields.string("input_suffix", "") or ""
    current_line = fields.string("prompt", "") or ""
    extra = _extra_files(fields.raw("input_extra"))
    max_tokens = _max_tokens(fields)
    stream = fields.boolean("stream")
    params = fields.sampling()
    response_fields = _response_fields(fields.raw("response_fields"))
    params.update(fields.rest(_NOT_FORWARDED))
    # The edited file's name travels only in `X-File-Path`: llama.vim and llama.vscode never send it, and
    # `input_extra` names other buffers (ring chunks), never the current one.
    path = header(headers, "X-File-Path") or None
    return NormalizedRequest(
        id=request_id, route=INFILL, session=session_key(headers), prefix=prefix + current_line, suffix=suffix,
        stream=stream, max_tokens=max_tokens, params=params, file_path=path, language=header(headers, "X-Language"),
        context_files=tuple(f for f in extra if f[1]), response_fields=response_fields,
    )  # fmt: skip


def parse_completion(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    fields = FieldReader(require_object(body))
    prompt = fields.raw("prompt")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise InvalidRequestError("'prompt' must be a string (token arrays are not supported by the proxy)")
    max_tokens = _max_tokens(fields)
    stream = fields.boolean("stream")
    params = fields.sampling()
    response_fields = _response_fields(fields.raw("response_fields"))
    params.update(fields.rest(_NOT_FORWARDED))
    return NormalizedRequest(
        id=request_id, route=COMPLETION, session=session_key(headers), prefix=prompt, suffix=None, stream=stream,
        max_tokens=max_tokens, params=params, file_path=header(headers, "X-File-Path"),
        language=header(headers, "X-Language"), response_fields=response_fields, edit_region=edit_region_format(prompt),
    )  # fmt: skip


def _timings(completion: Completion) -> dict[str, Any]:
    """The upstream's own timings when it is llama.cpp, else what its usage says."""
    if completion.timings:
        return completion.timings
    usage = completion.usage or {}
    return {"prompt_n": usage.get("prompt_tokens", 0), "predicted_n": usage.get("completion_tokens", 0)}


def _flatten(body: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: only those fields, nested ones under their `a/b` path."""
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for part in path.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out


def error_body(error: ProxyError) -> dict[str, Any]:
    """llama.cpp's own error shape (`format_error_response` in tools/server/utils.hpp)."""
    return {"error": {"code": error.status, "message": error.message, "type": error.type}}


class LlamaCppEncoder(Encoder):
    """llama.cpp's answer shape for /infill and /completion."""

    end_of_stream = b""  # llama.cpp ends its stream with the `stop: true` event, no [DONE]

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        reason = finish_reason(completion, outcome)
        usage = completion.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        body = {
            "content": text,
            "stop": True,
            "model": completion.model,
            "tokens_predicted": usage.get("completion_tokens", 0),
            "tokens_evaluated": usage.get("prompt_tokens", 0),
            "tokens_cached": details.get("cached_tokens", 0),
            "truncated": completion.truncated,
            "stop_type": "limit" if reason == "length" else "eos",
            "timings": _timings(completion),
            # llama.vscode's status bar reads `generation_settings.n_ctx` without optional chaining
            # (src/statusbar.ts `showInfo`): real llama.cpp always sends it.
            "generation_settings": {"n_ctx": completion.context_tokens, "n_predict": completion.max_tokens},
        }
        fields = self.request.response_fields
        return _flatten(body, fields) if fields else body

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        return {"content": chunk.text, "stop": False}

    def stream_error(self, error: ProxyError) -> Any:
        return error_body(error)

    def failing(self, completion: Completion, error: ProxyError, final_sent: bool = False) -> bytes:
        """A started stream that failed ends with one last `stop: true` event carrying the error: Tabby's
        llama.cpp backend (crates/http-api-bindings/src/completion/llama.rs) reads every event as
        `{content, stop}` and panics on any other shape."""
        if final_sent:
            return self.end_of_stream
        try:
            last = self.final(completion, Outcome.OK, "")
        except Exception:  # the final event is what failed: the bare end Tabby needs
            last = {}
        last = {"content": "", "stop": True, **last, "stop_type": "error", **error_body(error)}
        return self.frame(last) + self.end_of_stream


LLAMACPP = Dialect(
    name="llamacpp",
    completions=(
        CompletionRoute("/infill", INFILL, parse_infill),
        CompletionRoute("/completion", COMPLETION, parse_completion),
    ),
    encoder=LlamaCppEncoder,
    error_body=error_body,
)
