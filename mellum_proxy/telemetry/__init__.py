"""Per-request records and their sinks: recent records, the JSONL log, Prometheus, GPU memory."""

from mellum_proxy.telemetry.gpu import GpuReading, GpuSampler, GpuUnavailableError, NvmlBackend
from mellum_proxy.telemetry.hub import Telemetry
from mellum_proxy.telemetry.jsonl import JsonlLog
from mellum_proxy.telemetry.prometheus import ProxyMetrics
from mellum_proxy.telemetry.record import RecentRecords, RequestRecord

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
