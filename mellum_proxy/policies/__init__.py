"""Completion policies, the guards below the flight: what protects the model server from an editor's request
storm, knowing nothing of flights or reuse.

Each module owns one rule: `dispatch` (how long to hold a request), `debounce` (hold, and drop what a newer
request replaces), `supersede` (at most N admitted per session; the oldest is cancelled), `admission` (global
upstream concurrency with a bounded FIFO queue) and `deadline` (first-token and total deadlines). What uses
them is the serving room (`mellum_proxy.serving`); text shaping is `mellum_proxy.shaping`.
"""

from mellum_proxy.policies.admission import AdmissionQueue, Lease, QueueFullError
from mellum_proxy.policies.comments import COMMENTS, CommentSettings
from mellum_proxy.policies.deadline import Deadline
from mellum_proxy.policies.debounce import FIXED, Debouncer, FixedSettings
from mellum_proxy.policies.dispatch import ADAPTIVE, AdaptiveSettings, Dispatch
from mellum_proxy.policies.holds import HOLDS, HoldKind, HoldRule, chosen_hold, hold_named, hold_names, register_hold
from mellum_proxy.policies.registry import GUARDS, Guard, GuardKind, build_guards, register
from mellum_proxy.policies.sessions import Documents
from mellum_proxy.policies.supersede import Supersede, Ticket


class PolicySettings(AdaptiveSettings, FixedSettings, CommentSettings):
    """The hold rules' and the guards' own settings, which `mellum_proxy.config.Settings` inherits: a new one's
    join here."""


register_hold(ADAPTIVE)
register_hold(FIXED)
register(COMMENTS)

__all__ = [
    "GUARDS",
    "HOLDS",
    "AdmissionQueue",
    "Deadline",
    "Debouncer",
    "Dispatch",
    "Documents",
    "Guard",
    "GuardKind",
    "HoldKind",
    "HoldRule",
    "Lease",
    "PolicySettings",
    "QueueFullError",
    "Supersede",
    "Ticket",
    "build_guards",
    "chosen_hold",
    "hold_named",
    "hold_names",
    "register",
    "register_hold",
]
