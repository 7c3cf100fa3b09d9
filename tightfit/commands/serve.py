"""`tightfit serve`: the OpenAI-compatible HTTP server (llama-server's routes and conventions).

The socket is bound and /health answers 503 while the model loads; a load failure prints one
line and exits non-zero. `--spec ngram,suffix[,mtp]` serves through a SpeculativeEngine
(tightfit.runtime.spec) with one SuffixCache for all requests; responses' timings then carry
draft_n / draft_n_accepted and /metrics the llamacpp:spec_decode_* counters."""
from __future__ import annotations

import argparse
import os
import sys

from tightfit.commands.common import add_model_args, load_from_args, resolve_model
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
    p.add_argument("--spec", default=None, metavar="DRAFTERS",
                   help="speculative decoding with these drafters, comma-separated: ngram, suffix, "
                        "mtp (the model's own MTP head); the suffix cache is shared by all requests")
    p.add_argument("--draft-max", type=int, default=8, metavar="N",
                   help="with --spec: most drafted tokens per verify round (default 8)")
    p.add_argument("--draft-mtp", type=int, default=3, metavar="N",
                   help="with --spec mtp: most tokens the MTP head drafts per round (default 3)")
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
    drafters = None
    if a.spec is not None:
        from tightfit.runtime.spec import parse_drafters
        drafters = parse_drafters(a.spec)
        if a.draft_max < 1:
            raise UserError(f"--draft-max must be >= 1, got {a.draft_max}")
        if a.draft_mtp < 1:
            raise UserError(f"--draft-mtp must be >= 1, got {a.draft_mtp}")
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

    # the GPU executor holds the MTP block only when asked (and its plan then prices it); the
    # CPU model's drafter dequantizes the block itself
    want_mtp = drafters is not None and "mtp" in drafters and a.device.startswith("cuda")

    def loader():
        # a verify block is the last token + up to --draft-max drafts
        engine = load_from_args(a, path, mtp=want_mtp,
                                batch=a.draft_max + 1 if drafters is not None else 1)
        if drafters is None:
            return engine
        from tightfit.runtime.spec import build_speculative
        return build_speculative(engine, drafters, max_draft=a.draft_max, mtp_draft=a.draft_mtp)

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
