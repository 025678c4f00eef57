"""`PauseModel`: at each request, the probability that its edit begins a pause (no further request of the
session within `PAUSE_S`), from what the proxy already sees.

The features (`FEATURES`) are the class of the character just before the cursor, where the cursor stands
(end of line, at the start of a line, inside a word), how the text before the cursor changed since the
session's previous request (one character more, several, fewer), the time since that request and the
session's recent gaps. No text is kept: per session, the previous request's time, its prefix length and
pause probability, the last `RECENT_GAPS` gaps and the probabilities at its last `PAUSES_KEPT` pauses; at most
`MAX_SESSIONS` sessions, the least recent dropped.

The weights are a prior fitted offline on the shipped traces (`pause_prior.json`, written by
`python -m benchmarks pauses`, which also scores it on traces it was not fitted on). What is learned online, per
session, is where to draw the line: when a request arrives, the gap since the previous one says whether that one
began a pause; once a session has shown `MIN_PAUSES` pauses, its threshold is the probability under which the
prior's share (`held_pauses`, 3 %) of its own recent pauses fell. So a typist whose pauses the prior scores low
(a trace of pasted bursts: 24 % of its pauses sent at once with the prior's threshold) gets a lower line within
a few dozen pauses (94 %). Moving the weights themselves online (logistic-regression steps) made it worse on
the traces it did not see (`docs/foresight.md`).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson

PAUSE_S = 0.3  # a pause: no further edit within this (the lab's `pause_ms`)
RECENT_GAPS = 8
MAX_SESSIONS = 1024
PAUSES_KEPT, MIN_PAUSES = 100, 20  # a session's own threshold: from its last 100 pauses, once it has shown 20
GAP_FLOOR_S, GAP_CAP_S, GAP_SCALE_S = 0.01, 2.0, 0.2
LEARNING_RATE = 0.02
DECAY = 0.01  # per step, the share of a session's learned offset that returns to the prior
PRIOR_FILE = "pause_prior.json"

CLASSES = ("word", "space", "line_start", "open", "close", "quote", "dot", "separator", "operator", "other")
FEATURES = (
    "bias",
    *(f"after_{name}" for name in CLASSES),
    "word_continues",
    "end_of_line",
    "deleted",
    "inserted_several",
    "unchanged",
    "log_gap",
    "log_median_gap",
    "after_pause",
    "first",
    "log_word_length",
    "log_column",
)
_CLASS_OF = {
    **dict.fromkeys("([{", "open"),
    **dict.fromkeys(")]}", "close"),
    **dict.fromkeys("\"'`", "quote"),
    ".": "dot",
    **dict.fromkeys(",;:", "separator"),
    **dict.fromkeys("=+-*/%<>!&|^~?@", "operator"),
}
_OFFSET = {name: 1 + index for index, name in enumerate(CLASSES)}
_AFTER = len(CLASSES) + 1  # index of the first feature after the classes
_WORD_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


def char_class(prefix: str) -> str:
    """The class of what was just typed: `line_start` when the cursor's line holds only indentation."""
    line = prefix[prefix.rfind("\n") + 1 :]
    if not line.strip(" \t"):
        return "line_start"
    last = line[-1]
    if last.isalnum() or last == "_":
        return "word"
    if last in " \t":
        return "space"
    return _CLASS_OF.get(last, "other")


def _log_gap(seconds: float) -> float:
    return math.log(min(GAP_CAP_S, max(GAP_FLOOR_S, seconds)) / GAP_SCALE_S)


def features(prefix: str, suffix: str | None, gap_s: float | None, gaps: deque[float] | list[float],
             previous_length: int | None) -> list[float]:  # fmt: skip
    """The feature vector (`FEATURES` order) of a request: `gap_s` since the session's previous request (None:
    its first), `gaps` the session's recent gaps before this one, `previous_length` that request's prefix length."""
    x = [0.0] * len(FEATURES)
    x[0] = 1.0
    x[_OFFSET[char_class(prefix)]] = 1.0
    after = suffix[:1] if suffix else ""
    x[_AFTER] = float(after.isalnum() or after == "_")
    x[_AFTER + 1] = float(after in ("", "\n", "\r"))
    if previous_length is not None:
        delta = len(prefix) - previous_length
        x[_AFTER + 2], x[_AFTER + 3], x[_AFTER + 4] = float(delta < 0), float(delta > 1), float(delta == 0)
    if gap_s is None:
        x[_AFTER + 8] = 1.0
    else:
        x[_AFTER + 5] = _log_gap(gap_s)
        x[_AFTER + 7] = float(gap_s >= PAUSE_S)
    if gaps:
        ordered = sorted(gaps)
        x[_AFTER + 6] = _log_gap(ordered[len(ordered) // 2])
    line = prefix[prefix.rfind("\n") + 1 :]
    word = len(line) - len(line.rstrip(_WORD_CHARS))
    x[_AFTER + 9], x[_AFTER + 10] = math.log1p(word), math.log1p(len(line))
    return x


def probability(weights: Sequence[float], x: Sequence[float]) -> float:
    z = sum(w * v for w, v in zip(weights, x, strict=True))
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


@dataclass(frozen=True, slots=True)
class Prior:
    """The offline fit: weights in `FEATURES` order, and where it came from."""

    weights: tuple[float, ...]
    threshold: float = 0.5  # below it a request is held: fitted so that few pauses are (`bench pauses`)
    held_pauses: float = 0.03  # the share of pauses the threshold holds
    about: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def shipped(cls) -> Prior:
        raw = orjson.loads(resources.files("mellum_proxy.policies").joinpath(PRIOR_FILE).read_bytes())
        return cls.from_json(raw)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Prior:
        """Raises ValueError: the features it was fitted on are not this module's."""
        if tuple(raw.get("features", ())) != FEATURES:
            raise ValueError("the pause prior was fitted on other features: refit it (python -m benchmarks pauses)")
        about = {k: v for k, v in raw.items() if k not in ("weights", "threshold")}
        return cls(tuple(float(w) for w in raw["weights"]), float(raw["threshold"]), float(raw["held_pauses"]), about)


@dataclass(slots=True)
class _Session:
    at: float
    length: int
    p: float = 0.0  # the last request's pause probability
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_GAPS))
    pause_ps: deque[float] = field(default_factory=lambda: deque(maxlen=PAUSES_KEPT))  # at its recent pauses


@dataclass(eq=False)
class PauseModel:
    """The prior, and each session's rhythm and threshold."""

    prior: Prior = field(default_factory=Prior.shipped)
    learn: bool = True
    _sessions: OrderedDict[str, _Session] = field(default_factory=OrderedDict, init=False, repr=False)

    def likely_pause(self, session: str, now: float, prefix: str, suffix: str | None) -> bool:
        """Note a request of `session` at `now` (seconds): whether it likely begins a pause (its probability at
        least the session's threshold; always, before the session has shown `MIN_PAUSES` pauses). The gap since
        the session's previous request labels that one (a pause or not), and the session learns it."""
        _, p, threshold = self.step(session, now, prefix, suffix)
        return p >= threshold

    def typing_gap_s(self, session: str) -> float | None:
        """The longest of the session's recent gaps that were not pauses: how long its next keystroke takes to
        come when one comes (None: none seen)."""
        state = self._sessions.get(session)
        typed = [gap for gap in state.gaps if gap < PAUSE_S] if state is not None else []
        return max(typed) if typed else None

    def step(self, session: str, now: float, prefix: str, suffix: str | None) -> tuple[list[float], float, float]:
        """`likely_pause`'s parts: the request's feature vector, its pause probability and the threshold."""
        state = self._sessions.pop(session, None)
        if state is None:
            x = features(prefix, suffix, None, [], None)
            state = _Session(now, len(prefix))
        else:
            gap = now - state.at
            if self.learn and gap >= PAUSE_S:
                state.pause_ps.append(state.p)
            x = features(prefix, suffix, gap, state.gaps, state.length)
            state.gaps.append(min(gap, GAP_CAP_S))
            state.at, state.length = now, len(prefix)
        self._sessions[session] = state
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        state.p = probability(self.prior.weights, x)
        return x, state.p, self._threshold(state)

    def _threshold(self, state: _Session) -> float:
        """The probability under which `held_pauses` of the session's recent pauses fell (so a wrong guess stays
        as rare for every typist); 0 (nothing is held) until it has shown `MIN_PAUSES`; the prior's own when it
        does not learn."""
        if not self.learn:
            return self.prior.threshold
        if len(state.pause_ps) < MIN_PAUSES:
            return 0.0
        ordered = sorted(state.pause_ps)
        return ordered[int(self.prior.held_pauses * len(ordered))]
