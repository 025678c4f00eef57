"""`Policies`: the policy objects one proxy shares between all its requests (the guards of
`mellum_proxy.policies`, the reuse cache, and the switches the service reads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.policies import AdmissionQueue, Debouncer, Dispatch, Foresight, Supersede
from mellum_proxy.serving.reuse import ReuseCache


@dataclass(slots=True)
class Policies:
    """The policy objects one proxy shares between all its requests."""

    debouncer: Debouncer
    supersede: Supersede
    admission: AdmissionQueue
    ttft_timeout_s: float | None = None  # None: no deadline
    timeout_s: float | None = None
    complete_in_comments: bool = True
    postprocess: bool = False  # clean completions while they stream (`mellum_proxy.shaping.cleanup`)
    clock: Clock = field(default=LOOP_CLOCK)
    dispatch: Dispatch | Foresight | None = None  # None: the debouncer's fixed window
    reuse: ReuseCache | None = None
    keep_prefill: bool = False
    bulk_wait_s: float | None = None  # the longest a bulk request (chat, agents) waits for a slot; None: no limit
