"""The hold rules' registry: how long a request is held before it may go upstream, chosen by the `dispatch`
setting. A rule is a module of `policies/` with its settings (a pydantic model of flat fields, inherited by
`Settings` through `PolicySettings`) and a `HoldKind`, registered in `policies/__init__.py`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mellum_proxy.clock import Clock
from mellum_proxy.models import NormalizedRequest


class HoldRule(Protocol):
    @property
    def reads_load(self) -> bool:
        """Whether `hold_for` looks at `busy` (the service asks the queue only then)."""
        ...

    def hold_for(self, request: NormalizedRequest, busy: bool) -> float:
        """Seconds to hold `request`, arriving now (`busy`: no free slot, or its session has one admitted)."""
        ...


@dataclass(frozen=True, slots=True)
class HoldKind:
    name: str  # a value of the `dispatch` setting
    build: Callable[[Any, Clock], HoldRule]  # from the settings (its own fields among them)
    chosen_by: tuple[str, ...] = ()  # settings that, set without `dispatch`, choose this rule


HOLDS: list[HoldKind] = []


def register_hold(kind: HoldKind) -> None:
    """Add a hold rule; a rule of the same name is replaced."""
    HOLDS[:] = [known for known in HOLDS if known.name != kind.name] + [kind]


def hold_names() -> tuple[str, ...]:
    return tuple(kind.name for kind in HOLDS)


def hold_named(name: str) -> HoldKind:
    """Raises: ValueError for a name no rule has."""
    for kind in HOLDS:
        if kind.name == name:
            return kind
    raise ValueError(f"unknown dispatch '{name}' ({', '.join(hold_names())})")


def chosen_hold(dispatch: str, given: set[str]) -> str:
    """The rule in force: `dispatch`, unless it was not given and a setting that chooses another rule was."""
    if "dispatch" not in given:
        for kind in HOLDS:
            if any(name in given for name in kind.chosen_by):
                return kind.name
    return dispatch
