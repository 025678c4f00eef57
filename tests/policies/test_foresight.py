"""Foresight: send at once when a pause is likely, hold about one keystroke's gap when it is not."""

from __future__ import annotations

from mellum_proxy.models import NormalizedRequest
from mellum_proxy.policies import Dispatch, Foresight, PauseModel
from mellum_proxy.policies.pause_model import FEATURES, MIN_PAUSES, PAUSE_S, Prior
from tests.policies.test_dispatch import ManualClock


def _foresight(clock: ManualClock, hold_max_s: float = 0.3) -> Foresight:
    weights = [0.0] * len(FEATURES)
    weights[FEATURES.index("after_word")] = -2.0
    model = PauseModel(Prior(tuple(weights), threshold=0.3, held_pauses=0.03))
    return Foresight(Dispatch(clock=clock, hold_min_s=0.002), hold_max_s, model, clock)


def _request(prefix: str) -> NormalizedRequest:
    return NormalizedRequest(id="1", route="openai", session="s", prefix=prefix, suffix="")


def _learned(foresight: Foresight, clock: ManualClock) -> None:
    """A person who pauses after spaces and types on after letters, 120 ms a key."""
    for _ in range(MIN_PAUSES + 2):
        foresight.hold_for(_request("x = ab "), busy=False)
        clock.t += PAUSE_S + 0.5
        foresight.hold_for(_request("x = ab"), busy=False)
        clock.t += 0.12


def test_a_new_session_is_sent_at_once() -> None:
    clock = ManualClock()
    foresight = _foresight(clock)
    for _ in range(5):
        assert foresight.hold_for(_request("x = abc"), busy=False) == 0
        clock.t += 0.12


def test_a_likely_keystroke_is_held_about_one_gap_and_a_likely_pause_goes_at_once() -> None:
    clock = ManualClock()
    foresight = _foresight(clock)
    _learned(foresight, clock)
    hold = foresight.hold_for(_request("x = abc"), busy=False)
    assert 0.12 < hold < 0.3  # the session's longest typing gap and a margin, under the cap
    clock.t += 0.12
    assert foresight.hold_for(_request("x = abc "), busy=False) == 0


def test_the_hold_never_passes_the_cap_and_a_busy_server_is_left_to_the_adaptive_rule() -> None:
    clock = ManualClock()
    foresight = _foresight(clock, hold_max_s=0.05)
    _learned(foresight, clock)
    assert foresight.hold_for(_request("x = abc"), busy=False) == 0.05
    clock.t += 0.12
    # busy: the adaptive rule's hold, as without foresight (its defaults hold nothing for a session that never bursts)
    assert foresight.hold_for(_request("x = abcd"), busy=True) == 0
