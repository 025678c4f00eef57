"""Completion policies: what protects the model server from an editor's request storm.

Each module owns one rule: `debounce` (hold, and drop what a newer request replaces),
`supersede` (at most N admitted per session; the oldest is cancelled), `admission` (global
upstream concurrency with a bounded FIFO queue) and `deadline` (first-token and total deadlines).
"""

from proxy.policies.admission import AdmissionQueue, Lease, QueueFullError
from proxy.policies.deadline import Deadline
from proxy.policies.debounce import Debouncer
from proxy.policies.dispatch import Dispatch
from proxy.policies.supersede import Supersede, Ticket

__all__ = ["AdmissionQueue", "Deadline", "Debouncer", "Dispatch", "Lease", "QueueFullError", "Supersede", "Ticket"]
