"""The pause model: features from what the proxy sees, no text kept, and a line drawn per session."""

from __future__ import annotations

import dataclasses

import pytest

from mellum_proxy.policies.pause_model import (
    FEATURES,
    MAX_SESSIONS,
    MIN_PAUSES,
    PAUSE_S,
    PauseModel,
    Prior,
    char_class,
    features,
)


def _feature(x: list[float], name: str) -> float:
    return x[FEATURES.index(name)]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("def f", "word"), ("x = ", "space"), ("if x:\n    ", "line_start"), ("f(", "open"), ("f()", "close"),
     ("s = '", "quote"), ("self.", "dot"), ("a, b;", "separator"), ("x +", "operator"), ("", "line_start")],
)  # fmt: skip
def test_the_character_just_typed_is_classed(prefix: str, expected: str) -> None:
    assert char_class(prefix) == expected


def test_where_the_cursor_stands_and_how_the_text_changed() -> None:
    x = features("print(valu", "e)\n", 0.12, [0.1, 0.2], previous_length=9)
    assert _feature(x, "after_word") == 1 and _feature(x, "word_continues") == 1
    assert _feature(x, "end_of_line") == 0 and _feature(x, "deleted") == 0 and _feature(x, "inserted_several") == 0
    assert _feature(x, "log_word_length") > 0
    pasted = features("x = call(a, b)", "\n", 0.05, [], previous_length=4)
    assert _feature(pasted, "inserted_several") == 1 and _feature(pasted, "end_of_line") == 1
    deleted = features("x = cal", "", 0.05, [], previous_length=8)
    assert _feature(deleted, "deleted") == 1
    first = features("x", None, None, [], None)
    assert _feature(first, "first") == 1 and _feature(first, "log_gap") == 0


def test_the_shipped_prior_is_fitted_on_these_features() -> None:
    prior = Prior.shipped()
    assert len(prior.weights) == len(FEATURES) and 0 < prior.threshold < 1
    assert prior.about["traces"]  # what it was fitted on
    with pytest.raises(ValueError, match="refit"):
        Prior.from_json({"features": ["bias"], "weights": [0.0], "threshold": 0.5, "held_pauses": 0.03})


def _prior(bias: float = 0.0) -> Prior:
    weights = [0.0] * len(FEATURES)
    weights[0] = bias
    weights[FEATURES.index("after_word")] = -2.0  # a letter: typing on; anything else: a pause is likely
    return Prior(tuple(weights), threshold=0.3, held_pauses=0.03)


def test_nothing_is_held_until_the_session_has_shown_its_pauses_then_its_own_line_is_drawn() -> None:
    model, t = PauseModel(_prior()), 0.0
    decisions = []
    for i in range(MIN_PAUSES + 5):
        decisions.append(model.likely_pause("s", t, "x = abc", ""))  # a letter, then a pause after each
        t += PAUSE_S + 0.5
        assert model.likely_pause("s", t, "x = abc ", "") is True  # after a space: likely a pause
        t += 0.1 if i % 2 else PAUSE_S + 0.5
    assert all(decisions[: MIN_PAUSES // 2])  # before it knows the person: every request goes at once
    # the session's pauses came after letters too, so its line sits under them: letters still go at once
    assert decisions[-1] is True
    typed_on = PauseModel(_prior())
    t = 0.0
    for _ in range(MIN_PAUSES + 2):  # pauses only after spaces, typing on after letters
        typed_on.likely_pause("s", t, "x = ab ", "")
        t += PAUSE_S + 0.5
        typed_on.likely_pause("s", t, "x = ab", "")
        t += 0.1
    assert typed_on.likely_pause("s", t, "x = abc", "") is False  # a letter: held
    assert typed_on.likely_pause("s", t + 0.1, "x = abc ", "") is True


def test_no_text_is_kept_and_sessions_are_bounded() -> None:
    model = PauseModel(_prior())
    secret = "password = 'hunter2'"
    for i in range(MAX_SESSIONS + 10):
        model.likely_pause(f"s{i}", i * 0.1, secret, secret)
    assert len(model._sessions) == MAX_SESSIONS
    state = next(iter(model._sessions.values()))
    values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    assert not any(isinstance(v, str) for v in values)
    assert all(isinstance(v, (int, float)) for v in values if not hasattr(v, "maxlen"))
    assert "s0" not in model._sessions  # the least recent went first
