"""Talking to the model server: `UpstreamClient`, its event-stream reader, the pass-through relay,
the translation of transport errors, and the embedded llama.cpp server."""

from mellum_proxy.upstream.client import UpstreamClient

__all__ = ["UpstreamClient"]
