"""The engine most runtime / server / speculation tests share: the built-in demo model on the CPU,
torch on one thread (tiny matrices: one thread is far faster on a busy 2-core machine)."""
from __future__ import annotations

from typing import Iterator

import torch


def demo_engine(n_ctx: int, path: str | None = None) -> Iterator:
    """Generator for a module-scoped fixture (`yield from demo_engine(N_CTX)`): the engine of
    `path` (default: the demo model), torch's thread count restored afterwards."""
    from tightfit.model.demo import demo_model_path
    from tightfit.runtime.loader import load_engine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_engine(str(path or demo_model_path()), n_ctx=n_ctx)
    finally:
        torch.set_num_threads(threads)
