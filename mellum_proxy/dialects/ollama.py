"""Ollama's `POST /api/generate` (Continue's and Twinny's Ollama providers) and the discovery calls
these plugins make first (`GET /api/tags`, `POST /api/show`, `GET /api/version`).

Request fields as Continue sends them (continuedev/continue `core/llm/llms/Ollama.ts`
`_getGenerateOptions`): `model`, `prompt`, `suffix`, `raw`, `options` {temperature, top_p, top_k,
num_predict, stop, num_ctx, ...}, `keep_alive`, `stream`. Answers are NDJSON lines `{response, done}`
ending with `done: true`, `done_reason` and the eval counts. Continue treats a model as FIM-capable
when `/api/show`'s `template` contains `.Suffix`, so the answer says so: the proxy renders the FIM
prompt itself whatever the upstream is.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from mellum_proxy.dialects.base import (
    CompletionRoute,
    Dialect,
    DiscoveryRoute,
    Encoder,
    FieldReader,
    ServedModels,
    finish_reason,
    header,
    require_object,
    session_key,
)
from mellum_proxy.edit_region import edit_region_format
from mellum_proxy.errors import InvalidRequestError, ProxyError, UpstreamError
from mellum_proxy.models import Chunk, Completion, NormalizedRequest, Outcome

DIALECT = "ollama"
OLLAMA_VERSION = "0.9.0"  # what /api/version claims: plugins compare it against their minimums
_SAMPLING = ("temperature", "top_p", "top_k", "min_p")


def parse_generate(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    fields = FieldReader(require_object(body))
    prompt = fields.string("prompt", "") or ""
    suffix = fields.string("suffix")
    stream = fields.boolean("stream", default=True)  # Ollama streams unless told not to
    fields.boolean("raw")  # the proxy never applies a chat template: raw or not, the prompt is the text
    for ignored in ("model", "context", "images", "system", "template", "format"):
        fields.raw(ignored)  # the upstream's model is not the client's to choose here
    keep_alive = fields.raw("keep_alive")  # how long its model stays loaded: passed on to an Ollama server
    if keep_alive is not None and (isinstance(keep_alive, bool) or not isinstance(keep_alive, str | int | float)):
        raise InvalidRequestError("'keep_alive' must be a duration ('30m') or a number of seconds")
    options_value = fields.raw("options") or {}
    if not isinstance(options_value, dict):
        raise InvalidRequestError("'options' must be an object")
    options = FieldReader(options_value, prefix="options.")
    params = options.sampling(_SAMPLING)
    num_predict = options.integer("num_predict", minimum=-2)
    num_ctx = options.integer("num_ctx", minimum=1)
    return NormalizedRequest(
        id=request_id, route=DIALECT, session=session_key(headers), prefix=prompt, suffix=suffix or None,
        stream=stream, max_tokens=None if num_predict is None or num_predict < 0 else num_predict, params=params,
        file_path=header(headers, "X-File-Path"), language=header(headers, "X-Language"), context_tokens=num_ctx,
        edit_region=None if suffix else edit_region_format(prompt), keep_alive=keep_alive,
    )  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def error_body(error: ProxyError) -> dict[str, Any]:
    """Ollama's error shape: `{"error": "message"}` (api/types.go `StatusError`)."""
    return {"error": error.message}


class OllamaEncoder(Encoder):
    content_type = "application/x-ndjson"
    end_of_stream = b""

    def frame(self, payload: Any) -> bytes:
        return orjson.dumps(payload) + b"\n"

    def _base(self, completion: Completion, text: str, done: bool) -> dict[str, Any]:
        return {"model": completion.model, "created_at": _now(), "response": text, "done": done}

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        usage = completion.usage or {}
        timings = completion.timings or {}
        body = self._base(completion, text, True)
        body.update({
            "done_reason": finish_reason(completion, outcome),
            "context": [],
            "prompt_eval_count": usage.get("prompt_tokens", 0),
            "eval_count": usage.get("completion_tokens", 0),
            "prompt_eval_duration": int(float(timings.get("prompt_ms", 0)) * 1e6),
            "eval_duration": int(float(timings.get("predicted_ms", 0)) * 1e6),
        })  # fmt: skip
        return body

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        return self._base(completion, chunk.text, False)

    def stream_error(self, error: ProxyError) -> Any:
        return error_body(error)


def tags(ids: list[str]) -> dict[str, Any]:
    details = {"format": "gguf", "family": "", "families": None, "parameter_size": "", "quantization_level": ""}
    return {"models": [{"name": i, "model": i, "modified_at": _now(), "size": 0, "digest": "", "details": details}
                       for i in ids]}  # fmt: skip


def show(name: str, max_context_tokens: int) -> dict[str, Any]:
    return {
        "modelfile": f"# served through mellum-proxy\nFROM {name}\n",
        "parameters": f"num_ctx {max_context_tokens}",
        "template": "{{ .Prompt }}{{ .Suffix }}",  # FIM-capable: the proxy renders the model's FIM prompt
        "details": {"format": "gguf", "family": "", "parameter_size": "", "quantization_level": ""},
        "model_info": {},
        "capabilities": ["completion", "insert"],
    }


async def _tags(discovery: ServedModels, body: Any) -> dict[str, Any]:
    return tags(await discovery.model_ids())


async def _show(discovery: ServedModels, body: Any) -> dict[str, Any]:
    name = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("'model' (or 'name') is required")
    try:
        ids = await discovery.model_ids()
    except UpstreamError:
        ids = []  # an upstream that lists no models: the name the plugin asked for
    return show(name if name in ids else (ids[0] if ids else name), discovery.max_context_tokens)


async def _version(discovery: ServedModels, body: Any) -> dict[str, Any]:
    return {"version": OLLAMA_VERSION}


OLLAMA = Dialect(
    name=DIALECT,
    completions=(CompletionRoute("/api/generate", DIALECT, parse_generate),),
    encoder=OllamaEncoder,
    error_body=error_body,
    discovery=(
        DiscoveryRoute("GET", "/api/tags", _tags),
        DiscoveryRoute("POST", "/api/show", _show),
        DiscoveryRoute("GET", "/api/version", _version),
    ),
)
