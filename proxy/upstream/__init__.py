"""Talking to the model server: `UpstreamClient` and the translation of transport errors."""

from proxy.upstream.client import UpstreamClient, completion_payload

__all__ = ["UpstreamClient", "completion_payload"]
