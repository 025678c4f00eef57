"""nginx (Debian's `nginx`/`nginx-light`) as a reverse proxy in front of the fake upstream: the relay the field
uses, measured beside the proxy by `benchmarks overhead` where it is installed. Buffering is off, so each event is
passed on as it comes, as a completion proxy must."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

CONFIG = """
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    upstream model {{ server {upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def installed() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


@contextlib.asynccontextmanager
async def nginx_relay(upstream: str) -> AsyncIterator[str]:
    """nginx in front of `upstream` (`http://host:port`) on a free loopback port, for the `async with` body."""
    binary = installed()
    if binary is None:
        raise RuntimeError("nginx is not installed (Debian: apt install nginx-light)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="mellum-nginx-") as folder:
        config = Path(folder) / "nginx.conf"
        config.write_text(CONFIG.format(folder=folder, port=port, upstream=upstream.removeprefix("http://")))
        process = await asyncio.create_subprocess_exec(binary, "-c", str(config), "-p", folder, "-e",
                                                       f"{folder}/error.log")  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session, asyncio.timeout(10):
                while True:  # nginx's own process: there is no event to wait on
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(url + "/health") as resp:
                            if resp.status == 200:
                                break
                    if process.returncode is not None:
                        raise RuntimeError(f"nginx exited: {(Path(folder) / 'error.log').read_text()[-300:]}")
                    await asyncio.sleep(0.05)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await process.wait()
