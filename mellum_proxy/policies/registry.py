"""The guards' registry, as the server kinds have theirs: a guard that may end a completion before it is admitted is
a module of `policies/` with its settings (a pydantic model of flat fields, which `Settings` inherits through
`PolicySettings`) and a `GuardKind`, registered in `policies/__init__.py`. The service asks each built guard in turn
after the hold and before admission; nothing else is edited for a new one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mellum_proxy.models import NormalizedRequest, Outcome


class Guard(Protocol):
    def stops(self, request: NormalizedRequest) -> Outcome | None:
        """Why `request` ends here, answered empty (None: it goes on)."""
        ...


@dataclass(frozen=True, slots=True)
class GuardKind:
    name: str
    build: Callable[[Any], Guard | None]  # from the settings (its own fields among them); None: off


GUARDS: list[GuardKind] = []


def register(kind: GuardKind) -> None:
    """Add a guard kind, asked after those before it; a kind of the same name is replaced."""
    GUARDS[:] = [known for known in GUARDS if known.name != kind.name] + [kind]


def build_guards(settings: Any) -> tuple[Guard, ...]:
    """The guards `settings` turn on, in registration order."""
    return tuple(guard for kind in GUARDS if (guard := kind.build(settings)) is not None)
