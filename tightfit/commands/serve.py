"""`tightfit serve`: the OpenAI-compatible HTTP server (llama-server's routes and conventions).

The socket is bound and /health answers 503 while the model loads; a load failure prints one
line and exits non-zero. `--spec ngram,suffix[,mtp]` serves through a SpeculativeEngine
(tightfit.runtime.spec) with one SuffixCache for all requests; responses' timings then carry
draft_n / draft_n_accepted and /metrics the llamacpp:spec_decode_* counters."""
from __future__ import annotations

import argparse
import os
import sys

from tightfit.commands.common import (add_model_args, add_spec_args, load_from_args, resolve_model,
                                      spec_drafters, spec_load_kwargs, wrap_speculative)
from tightfit.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY); also $TIGHTFIT_API_KEY")
    p.add_argument("--alias", default=None, help="model id shown by /v1/models (default: file name)")
    p.add_argument("--cache-ram", type=int, default=2048,
                   help="prompt-cache budget in host RAM, MiB (default 2048; 0 = off)")
    p.add_argument("--queue", type=int, default=64,
                   help="requests that may wait while one generates (default 64; more get 503)")
    add_spec_args(p, shared_cache=True)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    import socket

    import uvicorn

    from tightfit.server.app import create_app

    if not 0 <= a.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {a.port}")
    if a.cache_ram < 0:
        raise UserError(f"--cache-ram must be >= 0 MiB, got {a.cache_ram}")
    if a.queue < 0:
        raise UserError(f"--queue must be >= 0, got {a.queue}")
    if a.ctx_size is not None and a.ctx_size < 2:
        raise UserError(f"--ctx-size must be >= 2, got {a.ctx_size}")
    drafters = spec_drafters(a)
    path = resolve_model(a)
    if not os.path.exists(path):
        raise UserError(f"model file not found: {path}")
    try:
        sock = socket.create_server((a.host, a.port))
    except OSError as e:
        raise UserError(f"cannot listen on {a.host}:{a.port}: {e.strerror or e}") from None
    failure: list[str] = []
    server: uvicorn.Server | None = None

    def on_load_error(msg: str) -> None:
        failure.append(msg)
        if server is not None:
            server.should_exit = True

    def loader():
        return wrap_speculative(load_from_args(a, path, **spec_load_kwargs(a, drafters)), a, drafters)

    app = create_app(loader=loader,
                     model_id=a.alias, api_key=a.api_key or os.environ.get("TIGHTFIT_API_KEY"),
                     queue_size=a.queue, cache_bytes=a.cache_ram << 20, on_load_error=on_load_error)
    config = uvicorn.Config(app, log_level=a.log_level, lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    print(f"tightfit serve: listening on http://{host}:{port} (loading {path})", file=sys.stderr)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:      # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    if failure:
        raise UserError(f"loading the model failed: {failure[0]}")
    return 0
