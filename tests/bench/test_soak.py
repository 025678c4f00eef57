"""`benchmarks soak` in small: the proxy as its own process, faults mixed in; nothing a 500, nothing unlogged."""

from __future__ import annotations

import pytest

from benchmarks.runners.soak import measure

pytestmark = pytest.mark.slow  # seconds of real time: in `make test`, not in `make test-fast`


async def test_a_short_soak_answers_and_logs_everything() -> None:
    result = await measure(requests=400, clients=4, seed=1, progress=lambda line: None)
    assert "500" not in result["statuses"] and result["answered_not_logged"] == 0
    assert result["logged"] == 400 and result["exit_code"] == 0
    assert sum(result["kinds"].values()) == 400 and len(result["kinds"]) >= 6  # a mix, not only "ok"
