"""`fit`'s memory readings through NVML, with a device that stands in for one (no GPU here): what the server
added is the device's use less what was used before it started, and its peak is sampled while it runs."""

from __future__ import annotations

import asyncio

from mellum_proxy.planning.memory import MemoryWatch
from mellum_proxy.telemetry.gpu import MIB, GpuReading

GIB_MIB = 1024


class Device:
    """A GPU whose used memory the test sets; 8 GiB in all."""

    def __init__(self, used_mib: float) -> None:
        self.used_mib = used_mib
        self.closed = False

    def read(self) -> GpuReading:
        return GpuReading(int(self.used_mib * MIB), 8 * GIB_MIB * MIB)

    def close(self) -> None:
        self.closed = True


async def test_the_peak_is_what_the_server_added_above_what_was_used_before() -> None:
    device = Device(used_mib=1000)  # another program's 1000 MiB before the server starts
    watch = MemoryWatch(0, opener=lambda: device)
    assert (watch.source, watch.before_mib, watch.total_mib) == ("nvml", 1000, 8 * GIB_MIB)
    watch.watch()
    device.used_mib = 3500  # loading, then a long prompt's peak
    await asyncio.sleep(0)  # one turn of the loop: the sampler's read; a peak that came and went is still seen
    device.used_mib = 2500
    assert watch.used_mib(None) == 1500
    assert await watch.peak_mib(sid=0) == 2500  # 3500 at its peak, less the 1000 used before
    watch.close()
    assert device.closed


def test_without_a_driver_the_reading_is_host_memory_and_says_so() -> None:
    from mellum_proxy.telemetry.gpu import GpuUnavailableError

    def no_driver() -> Device:
        raise GpuUnavailableError("NVML unavailable: no driver")

    watch = MemoryWatch(0, opener=no_driver)
    assert watch.source == "host_rss" and "no driver" in watch.note and "host memory" in watch.note
