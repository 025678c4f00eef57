"""Supersede on its own: at most `max_inflight` admitted per session; a newer one cancels the oldest."""

from __future__ import annotations

import anyio
import pytest

from mellum_proxy.policies import Supersede


async def test_a_newer_request_supersedes_the_oldest_of_its_session_only() -> None:
    supersede = Supersede(max_inflight=1)
    with supersede.admit("a") as first, supersede.admit("b") as other:
        with supersede.admit("a") as second:
            assert first.superseded and first.scope.cancel_called
            assert not second.superseded and not other.superseded
            assert supersede.admitted("a") == 1 and supersede.admitted("b") == 1
    assert supersede.sessions() == {}


async def test_max_inflight_two_keeps_two() -> None:
    supersede = Supersede(max_inflight=2)
    with supersede.admit("a") as one, supersede.admit("a") as two, supersede.admit("a") as three:
        assert [t.superseded for t in (one, two, three)] == [True, False, False]
        two.running = True
        assert supersede.sessions() == {"a": {"running": 1, "queued": 1}}


async def test_superseding_a_running_request_cancels_its_scope() -> None:
    supersede = Supersede(max_inflight=1)
    reached_end = False
    with supersede.admit("a") as ticket:
        with ticket.scope:
            with supersede.admit("a"):
                await anyio.sleep(10)  # cancelled at once: the scope was cancelled by the newer ticket
            reached_end = True
        assert ticket.scope.cancelled_caught and not reached_end


async def test_a_ticket_leaving_by_error_is_removed() -> None:
    supersede = Supersede(max_inflight=1)
    with pytest.raises(KeyError), supersede.admit("a"):
        raise KeyError("the request failed")
    assert supersede.admitted("a") == 0 and supersede.sessions() == {}


async def test_an_older_request_admitted_late_is_the_one_superseded() -> None:
    """Admission follows arrival, not the moment of admitting: one that arrived first but is admitted after a
    newer one of its session (it followed a completion first) is the oldest, and is cut, not the newer."""
    supersede = Supersede(max_inflight=1)
    with supersede.admit("a", order=2) as newer, supersede.admit("a", order=1) as older:
        assert older.superseded and older.scope.cancel_called
        assert not newer.superseded and supersede.admitted("a") == 1
    assert supersede.sessions() == {}
