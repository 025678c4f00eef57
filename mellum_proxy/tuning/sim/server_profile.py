"""`ServerProfile`: how a completion server behaves, in the numbers the policy lab's simulator runs on.

The one contract between what measures a server (`mellum-proxy profile`, whose `Profile` adds what it saw)
and what runs one (`bench lab --profile`, the simulator's `SimEngine`): a profile's JSON is read back by these
fields, whoever wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerProfile:
    name: str
    prefill_tps: float  # prompt tokens a second, cold
    decode_tps: float  # tokens a second for one request alone
    slots: int  # requests it runs at once (llama.cpp's -np)
    kv_tokens: int  # KV cache, in tokens, over all slots
    chars_per_token: float  # of code, by its tokenizer
    batch_penalty: float  # each further request at once slows each one's decode by this share
    source: str  # where the numbers come from: measured (by what), or derived (from which published run)
    overhead_ms: float = 0.0  # per request, before prefill (HTTP parse, sampler set-up)
    overhead_per_token_ms: float = 0.0  # per request and prompt token, cached or not (tokenizing, cache lookup)
    spread: float = 0.0  # one request's time, repeated, varies by this (the sigma of its logarithm); 0: never
    idle_slowdown: float = 1.0  # a request that finds the server idle takes this much longer (clocks, caches)
