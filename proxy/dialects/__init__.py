"""Editor wire formats. Each dialect parses its body into a `NormalizedRequest` and writes the
answer back in its own shape through a `ResponseWriter`."""

from proxy.dialects.base import ResponseWriter

__all__ = ["ResponseWriter"]
