"""OpenAI-compatible HTTP server (`tightfit serve`): FastAPI app, one-worker scheduler, metrics."""
from __future__ import annotations


def create_app(*args, **kwargs):
    """See tightfit.server.app.create_app (imported lazily: FastAPI is only needed to serve)."""
    from tightfit.server.app import create_app as _create
    return _create(*args, **kwargs)


__all__ = ["create_app"]
