"""The bench tests' typing and simulated server."""

from __future__ import annotations

from typing import Any

import pytest

from mellum_proxy.tuning.sim.server import PROFILES, SimServer


@pytest.fixture
async def sim_url(aiohttp_server: Any) -> str:
    server = await aiohttp_server(SimServer(PROFILES["fast"]).app())
    return str(server.make_url("")).rstrip("/")
