"""The embedded llama.cpp server in a process of its own, for `mellum-proxy fit`: one candidate's knobs, its
start-up log (buffer sizes) on stderr, its memory the process's own. It serves until it is terminated.

    python -m mellum_proxy.planning.embedded_child MODEL CTX_TOTAL SLOTS KV_TYPE PORT THREADS [SPEC CACHE_REUSE]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from mellum_proxy.upstream.embedded import EmbeddedServer


def main(argv: list[str]) -> None:
    model, ctx_total, slots, kv_type, port, threads, *speed = argv
    spec, cache_reuse = speed or ("none", "0")
    server = EmbeddedServer(Path(model), int(ctx_total), int(slots), int(threads), int(port), verbosity=4,
                            kv_type=kv_type, spec=spec, cache_reuse=int(cache_reuse))  # fmt: skip
    try:
        url = server.start()
    except RuntimeError as exc:
        print(f"fit: the server did not start: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"fit: listening at {url}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})  # serve until told to stop
    os._exit(0)  # without waiting on llama.cpp's threads


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # llama.cpp's threads inherit it
    main(sys.argv[1:])
