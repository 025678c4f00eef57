"""`Policies`: the policy objects one proxy shares between all its requests (the guards of
`mellum_proxy.policies`, the reuse cache, and the switches the service reads), and `admitted`: the one place a
request is admitted into its session under its deadline."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.models import Outcome
from mellum_proxy.policies import AdmissionQueue, Deadline, Debouncer, Guard, HoldRule, Supersede
from mellum_proxy.policies.supersede import Ticket
from mellum_proxy.serving.reuse import ReuseCache


@dataclass(slots=True)
class Policies:
    """The policy objects one proxy shares between all its requests."""

    debouncer: Debouncer
    supersede: Supersede
    admission: AdmissionQueue
    ttft_timeout_s: float | None = None  # None: no deadline
    timeout_s: float | None = None
    postprocess: bool = False  # clean completions while they stream (`mellum_proxy.shaping.cleanup`)
    clock: Clock = field(default=LOOP_CLOCK)
    hold: HoldRule | None = None  # the hold rule in force (`policies.holds`); None: the debouncer's own window
    reuse: ReuseCache | None = None
    keep_prefill: bool = False
    bulk_wait_s: float | None = None  # the longest a bulk request (chat, agents) waits for a slot; None: no limit
    guards: tuple[Guard, ...] = ()  # asked in turn after the hold, before admission (`policies.registry`)


@dataclass(slots=True)
class Admitted:
    """A request admitted into its session: its ticket (a newer keystroke supersedes it) and its deadline."""

    ticket: Ticket
    deadline: Deadline

    @property
    def cut(self) -> Outcome | None:
        """Why it was cut short once its block is left: superseded (cancelled) or past its deadline; None: not."""
        if not self.ticket.scope.cancelled_caught:
            return None
        return Outcome.CANCELLED if self.ticket.superseded else Outcome.TIMEOUT


@contextmanager
def admitted(policies: Policies, session: str, order: float = math.inf) -> Iterator[Admitted]:
    """Admit a request into `session` (superseding the oldest beyond `max_inflight`) under a deadline that starts
    now; the block runs in the ticket's cancel scope, and `Admitted.cut` says afterwards why it was cut short."""
    with policies.supersede.admit(session, order) as ticket:
        deadline = Deadline.start(policies.clock, policies.ttft_timeout_s, policies.timeout_s)
        ticket.scope.deadline = deadline.first_token
        with ticket.scope:
            yield Admitted(ticket, deadline)
