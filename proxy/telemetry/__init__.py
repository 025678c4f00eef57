"""Per-request records and their sinks: recent records, the JSONL log, Prometheus, GPU memory."""

from proxy.telemetry.gpu import GpuReading, GpuSampler, GpuUnavailableError, NvmlBackend
from proxy.telemetry.hub import Telemetry
from proxy.telemetry.jsonl import JsonlLog
from proxy.telemetry.prometheus import ProxyMetrics
from proxy.telemetry.record import RecentRecords, RequestRecord

__all__ = [
    "GpuReading",
    "GpuSampler",
    "GpuUnavailableError",
    "JsonlLog",
    "NvmlBackend",
    "ProxyMetrics",
    "RecentRecords",
    "RequestRecord",
    "Telemetry",
]
