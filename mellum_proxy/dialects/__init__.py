"""Editor wire formats, one module each, and the registry the HTTP routes are generated from.

Each `Dialect` parses its bodies into a `NormalizedRequest`, encodes the answer in its own shape,
renders errors its own way, and answers its plugins' discovery calls.
"""

from mellum_proxy.dialects.base import CompletionRoute, Dialect, DiscoveryRoute, Encoder, ServedModels
from mellum_proxy.dialects.llamacpp import LLAMACPP
from mellum_proxy.dialects.ollama import OLLAMA
from mellum_proxy.dialects.openai import OPENAI
from mellum_proxy.dialects.sweep import SWEEP

REGISTRY: tuple[Dialect, ...] = (OPENAI, LLAMACPP, OLLAMA, SWEEP)
DEFAULT = OPENAI  # the error shape of paths no dialect owns

__all__ = [
    "DEFAULT",
    "LLAMACPP",
    "OLLAMA",
    "OPENAI",
    "REGISTRY",
    "SWEEP",
    "CompletionRoute",
    "Dialect",
    "DiscoveryRoute",
    "Encoder",
    "ServedModels",
]
