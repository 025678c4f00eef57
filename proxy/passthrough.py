"""Endpoints the proxy forwards unchanged (chat completions, model list), streamed byte for byte."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.upstream import UpstreamClient
from proxy.upstream.errors import status_error, translate_errors


async def forward(request: web.Request, upstream: UpstreamClient, path: str) -> web.StreamResponse:
    """Send `request` to `path` on the upstream and pipe the answer back as it arrives."""
    url = upstream.url(path)
    body = await request.read() if request.method in ("POST", "PUT", "PATCH") else None  # read() is cached
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    with translate_errors(url):
        async with upstream.session.request(request.method, url, data=body, headers=headers) as resp:
            try:
                if resp.status >= 400:
                    raise status_error(resp.status, await resp.read())
                return await _pipe(request, resp)
            except BaseException:
                resp.close()
                raise


async def _pipe(request: web.Request, resp: aiohttp.ClientResponse) -> web.StreamResponse:
    out = web.StreamResponse(status=resp.status)
    out.content_type = resp.content_type
    if resp.charset:
        out.charset = resp.charset
    await out.prepare(request)
    async for data in resp.content.iter_any():
        await out.write(data)
    await out.write_eof()
    return out
