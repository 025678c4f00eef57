"""`CompletionService`: one completion from a normalized request to the writer, with its record.

The steps are: (policies) -> upstream stream -> dialect writer. Telemetry observes in `finally`.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from aiohttp import web

from proxy.dialects.base import ResponseWriter
from proxy.errors import ProxyError
from proxy.models import Completion, NormalizedRequest, Outcome
from proxy.telemetry import RecentRecords, RequestRecord
from proxy.upstream import UpstreamClient, completion_payload


class CompletionService:
    """Serves completions against one upstream and records each request."""

    def __init__(self, upstream: UpstreamClient, records: RecentRecords) -> None:
        self.upstream = upstream
        self.records = records

    async def complete(self, request: NormalizedRequest, writer: ResponseWriter) -> web.StreamResponse:
        """Answer `request` through `writer`; never raises a `ProxyError` (it becomes `writer.fail`)."""
        record = RequestRecord.start(request)
        completion = Completion(id=f"cmpl-{request.id}")
        try:
            outcome = await self._generate(request, writer, completion, record)
            record.outcome = outcome
            return await writer.finish(completion, outcome)
        except ProxyError as error:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.upstream_status = error.status
            return await writer.fail(error)
        except (asyncio.CancelledError, ConnectionResetError):
            record.outcome = Outcome.CLIENT_GONE
            raise
        finally:
            record.close(completion)
            self.records.add(record)

    async def _generate(
        self,
        request: NormalizedRequest,
        writer: ResponseWriter,
        completion: Completion,
        record: RequestRecord,
    ) -> Outcome:
        async with aclosing(self.upstream.stream_completion(completion_payload(request))) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    record.mark_first_token()
                completion.add(chunk)
                await writer.send_chunk(completion, chunk)
        record.upstream_status = 200
        return Outcome.OK
