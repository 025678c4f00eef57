"""Editor wire formats, one module each, and the registry the HTTP routes are generated from.

Each `Dialect` parses its bodies into a `NormalizedRequest`, encodes the answer in its own shape,
renders errors its own way, and answers its plugins' discovery calls.
"""

from proxy.dialects.base import CompletionRoute, Dialect, Discovery, DiscoveryRoute, Encoder
from proxy.dialects.llamacpp import LLAMACPP
from proxy.dialects.ollama import OLLAMA
from proxy.dialects.openai import OPENAI

REGISTRY: tuple[Dialect, ...] = (OPENAI, LLAMACPP, OLLAMA)
DEFAULT = OPENAI  # the error shape of paths no dialect owns

__all__ = [
    "DEFAULT",
    "LLAMACPP",
    "OLLAMA",
    "OPENAI",
    "REGISTRY",
    "CompletionRoute",
    "Dialect",
    "Discovery",
    "DiscoveryRoute",
    "Encoder",
]
