"""OpenAI `POST /v1/completions`: parse into a `NormalizedRequest`, answer as OpenAI does.

Clients: minuet-ai.nvim (`openai_fim_compatible`), Tabby's OpenAI backend, JetBrains AI Assistant's
OpenAI-compatible provider, Continue's OpenAI provider (which pre-renders FIM tokens into `prompt`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proxy.dialects.base import FieldReader, StreamWriter, finish_reason, require_object
from proxy.errors import InvalidRequestError
from proxy.models import Chunk, Completion, NormalizedRequest, Outcome

DIALECT = "openai"


def session_key(headers: Mapping[str, str], user: str | None = None) -> str:
    """`X-Session-Id`, else the body's `user`, else `default`."""
    return headers.get("X-Session-Id") or user or "default"


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
    n = fields.integer("n", minimum=1)
    if n not in (None, 1):
        raise InvalidRequestError("'n' must be 1: the proxy serves one completion per request")
    params = fields.sampling(("temperature", "top_p"))
    user = fields.string("user")
    suffix = fields.string("suffix")
    max_tokens = fields.integer("max_tokens", minimum=0)
    stream = fields.boolean("stream")
    params.update(fields.rest())
    return NormalizedRequest(
        id=request_id,
        dialect=DIALECT,
        session=session_key(headers, user),
        prefix=prompt,
        suffix=suffix,
        stream=stream,
        max_tokens=max_tokens,
        params=params,
        file_path=headers.get("X-File-Path"),
        language=headers.get("X-Language"),
    )


def completion_object(completion: Completion, text: str, finish: str | None) -> dict[str, Any]:
    """One OpenAI `text_completion` object (a whole response, or one stream chunk)."""
    return {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created or int(time.time()),
        "model": completion.model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }


class CompletionWriter(StreamWriter):
    """SSE `text_completion` chunks then `[DONE]` for `stream: true`, else one JSON body."""

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        body = completion_object(completion, chunk.text, None)
        if chunk.usage is not None:
            body["usage"] = chunk.usage
        return body

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        body = completion_object(completion, text, finish_reason(completion, outcome))
        if completion.usage is not None:
            body["usage"] = completion.usage
        return body
