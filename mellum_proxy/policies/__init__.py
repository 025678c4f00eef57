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
from mellum_proxy.policies.debounce import Debouncer
from mellum_proxy.policies.dispatch import Dispatch
from mellum_proxy.policies.registry import GUARDS, Guard, GuardKind, build_guards, register
from mellum_proxy.policies.sessions import Documents
from mellum_proxy.policies.supersede import Supersede, Ticket


class PolicySettings(CommentSettings):
    """The guards' own settings, which `mellum_proxy.config.Settings` inherits: a new guard's joins here."""


register(COMMENTS)

__all__ = [
    "GUARDS",
    "AdmissionQueue",
    "Deadline",
    "Debouncer",
    "Dispatch",
    "Documents",
    "Guard",
    "GuardKind",
    "Lease",
    "PolicySettings",
    "QueueFullError",
    "Supersede",
    "Ticket",
    "build_guards",
    "register",
]
