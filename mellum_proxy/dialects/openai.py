"""OpenAI `POST /v1/completions`: parse into a `NormalizedRequest`, answer as OpenAI does.

Clients: minuet-ai.nvim (`openai_fim_compatible`), Tabby's OpenAI backend, JetBrains AI Assistant's
OpenAI-compatible provider, Continue's OpenAI provider (which pre-renders FIM tokens into `prompt`).
`text_completion` and `sse` are the one encoding of OpenAI's completion events; the bench's fake
upstream and simulator use them too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from mellum_proxy.dialects.base import (
    CompletionRoute,
    Dialect,
    Encoder,
    FieldReader,
    capped_max_tokens,
    finish_reason,
    header,
    openai_error,
    require_object,
    session_key,
)
from mellum_proxy.edit_region import edit_region_format
from mellum_proxy.errors import InvalidRequestError
from mellum_proxy.models import Chunk, Completion, NormalizedRequest, Outcome

DIALECT = "openai"
DONE = b"data: [DONE]\n\n"


def parse_completion(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    """Validate an OpenAI text-completion body.

    Raises:
        InvalidRequestError: the body is not an object, or a field has the wrong type.
    """
    fields = FieldReader(require_object(body))
    prompt = fields.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise InvalidRequestError("'prompt' must be a string (or a list of exactly one string)")
    for several in ("n", "best_of"):
        if fields.integer(several, minimum=1) not in (None, 1):
            raise InvalidRequestError(f"'{several}' must be 1: the proxy serves one completion per request")
    params = fields.sampling(("temperature", "top_p"))
    user = fields.string("user")
    suffix = fields.string("suffix")
    max_tokens = capped_max_tokens(
        fields, fields.integer("max_tokens", minimum=0), "n_predict", "max_completion_tokens"
    )
    stream = fields.boolean("stream")
    params.update(fields.rest())
    return NormalizedRequest(
        id=request_id,
        route=DIALECT,
        session=session_key(headers, user),
        prefix=prompt,
        suffix=suffix,
        edit_region=None if suffix is not None else edit_region_format(prompt),
        stream=stream,
        max_tokens=max_tokens,
        params=params,
        file_path=header(headers, "X-File-Path"),
        language=header(headers, "X-Language"),
    )


def text_completion(
    ident: str, created: int, model: str, text: str, finish: str | None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One OpenAI `text_completion` object (a whole response, or one stream event)."""
    body: dict[str, Any] = {
        "id": ident,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def sse(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class CompletionEncoder(Encoder):
    """SSE `text_completion` events then `[DONE]` for `stream: true`, else one JSON body.

    The upstream speaks this dialect, so its plain text events go to the client as they came; only
    the events that end the answer (finish reason, usage) are written by the proxy.
    """

    end_of_stream = DONE

    def frame(self, payload: Any) -> bytes:
        return sse(payload)

    def event(self, completion: Completion, chunk: Chunk) -> bytes:
        if chunk.raw is not None and chunk.finish_reason is None and chunk.usage is None:
            return b"data: " + chunk.raw + b"\n\n"  # a plain text event: already in the client's shape
        return super().event(completion, chunk)

    def _object(self, completion: Completion, text: str, finish: str | None, usage: Any) -> dict[str, Any]:
        created = completion.created or int(time.time())
        ident = completion.upstream_id or completion.id  # the events passed through carry the upstream's
        return text_completion(ident, created, completion.model, text, finish, usage)

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        return self._object(completion, chunk.text, None, chunk.usage)

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        return self._object(completion, text, finish_reason(completion, outcome), completion.usage)

    def body(self, completion: Completion, outcome: Outcome) -> bytes:
        """The whole answer, with `usage` always: Zed's edit predictions read it as required (an answer without
        it, one the proxy ended before the server counted anything, fails its parse)."""
        answer = self.final(completion, outcome, completion.text)
        answer.setdefault("usage", {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
        return orjson.dumps(answer)


OPENAI = Dialect(
    name=DIALECT,
    completions=(CompletionRoute("/v1/completions", DIALECT, parse_completion),),
    encoder=CompletionEncoder,
    error_body=openai_error,
    passthrough=(("POST", "/v1/chat/completions"), ("GET", "/v1/models")),
)
