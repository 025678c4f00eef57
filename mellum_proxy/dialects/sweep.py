"""Sweep's `POST /backend/next_edit_autocomplete`: what the Sweep VS Code extension (`sweepai/vscode-nes`) asks
of its local autocomplete server in local mode (`sweep.localPort`).

Request fields as the extension builds them (`src/api/client.ts` `buildRequest`, checked by the zod schema in
`src/api/schemas.ts`): `file_path`, `file_contents`, `cursor_position` (a UTF-8 byte offset when `use_bytes`, as
the extension always sends), `original_file_contents`, `recent_changes`, `file_chunks`, `retrieval_chunks`,
`editor_diagnostics`, `recent_user_actions`, ... The proxy serves it as a fill-in-the-middle completion at the
cursor (the text before and after it), in the served model's own layout; the answer is one JSON object,
`{autocomplete_id, start_index, end_index, completion, confidence}`, an insertion at the cursor (start and end
both there, in bytes again). The extension checks that its server is up with `GET /` (any answer under 500),
which the proxy's own page answers, so it starts no server of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mellum_proxy.dialects.base import (
    CompletionRoute,
    Dialect,
    Encoder,
    FieldReader,
    finish_reason,
    header,
    require_object,
    session_key,
)
from mellum_proxy.errors import InvalidRequestError, ProxyError
from mellum_proxy.models import Chunk, Completion, NormalizedRequest, Outcome

DIALECT = "sweep"


def parse_next_edit(body: Any, headers: Mapping[str, str], request_id: str) -> NormalizedRequest:
    fields = FieldReader(require_object(body))
    contents = fields.string("file_contents")
    cursor = fields.integer("cursor_position", minimum=0)
    if contents is None or cursor is None:
        raise InvalidRequestError("'file_contents' and 'cursor_position' are required")
    if fields.boolean("use_bytes", default=False):
        data = contents.encode("utf-8", "surrogatepass")
        if cursor > len(data):
            raise InvalidRequestError("'cursor_position' is past the end of 'file_contents'")
        prefix, suffix = (part.decode("utf-8", "replace") for part in (data[:cursor], data[cursor:]))
    else:
        if cursor > len(contents):
            raise InvalidRequestError("'cursor_position' is past the end of 'file_contents'")
        prefix, suffix = contents[:cursor], contents[cursor:]
    return NormalizedRequest(
        id=request_id, route=DIALECT, session=session_key(headers), prefix=prefix, suffix=suffix or None,
        stream=False, max_tokens=None, params={},
        file_path=fields.string("file_path") or header(headers, "X-File-Path"), language=header(headers, "X-Language"),
    )  # fmt: skip


def error_body(error: ProxyError) -> dict[str, Any]:
    """FastAPI's shape (the sweep-autocomplete server's): `{"detail": "message"}`."""
    return {"detail": error.message}


class SweepEncoder(Encoder):
    """One JSON answer: the completion as an insertion at the cursor (the extension never streams)."""

    content_type = "application/json"
    end_of_stream = b""

    def final(self, completion: Completion, outcome: Outcome, text: str) -> dict[str, Any]:
        at = len(self.request.prefix.encode("utf-8", "surrogatepass"))  # the cursor, in bytes as it was sent
        return {"autocomplete_id": completion.id, "start_index": at, "end_index": at, "completion": text,
                "confidence": 1.0, "finish_reason": finish_reason(completion, outcome)}  # fmt: skip

    def partial(self, completion: Completion, chunk: Chunk) -> dict[str, Any]:
        raise NotImplementedError("the extension reads one answer")


SWEEP = Dialect(
    name=DIALECT,
    completions=(CompletionRoute("/backend/next_edit_autocomplete", DIALECT, parse_next_edit),),
    encoder=SweepEncoder,
    error_body=error_body,
)
