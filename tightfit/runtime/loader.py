"""Build an Engine from a GGUF path: open + validate the file, pick the forward backend for the
device, build the tokenizer and chat template from the file's own metadata."""
from __future__ import annotations

from typing import Any

from tightfit.errors import UserError


KV_DTYPES = {"f16": "float16", "f32": "float32"}


def load_engine(path: str, device: str = "cpu", n_ctx: int | None = None, kv_type: str = "f16",
                **kw: Any):
    from tightfit.api import open_model
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf

    mf = open_model(path)
    if device == "cpu":
        from tightfit.model.reference import ReferenceModel
        import torch
        if kv_type not in KV_DTYPES:
            raise UserError(f"--kv-type {kv_type}: the CPU path supports {', '.join(KV_DTYPES)}")
        model = ReferenceModel.from_model_file(mf, kv_dtype=getattr(torch, KV_DTYPES[kv_type]))
    elif device.startswith("cuda"):
        try:
            from tightfit.model.executor import GPUModel  # the graph-captured GPU executor
        except ImportError as e:
            raise UserError(f"the GPU executor is not available in this build ({e})") from e
        model = GPUModel.from_model_file(mf, device=device, n_ctx=n_ctx, **kw)
    else:
        raise UserError(f"unknown device {device!r} (use 'cpu' or 'cuda[:N]')")
    tok = from_gguf(mf.gguf.metadata)
    template = mf.gguf.metadata.get("tokenizer.chat_template")
    return Engine(mf, model, tok, n_ctx=n_ctx, chat_template=template)
