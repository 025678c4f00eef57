"""Per-request records: what each request waited for, produced and how it ended."""

from proxy.telemetry.record import RecentRecords, RequestRecord

__all__ = ["RecentRecords", "RequestRecord"]
