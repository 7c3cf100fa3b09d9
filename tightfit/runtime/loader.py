"""Build an Engine from a GGUF path: open + validate the file, pick the forward backend for the
device, build the tokenizer and chat template from the file's own metadata."""
from __future__ import annotations

from typing import Any

from tightfit.errors import UserError


KV_DTYPES = {"f16": "float16", "f32": "float32"}
# The CPU path also takes the quantized types of tightfit.kvquant (q8_0, tq3, tq4, <k>+<v>, ...):
# the State stores them natively (tightfit/runtime/state.py). device='cuda' takes them too
# (GPUModel kv_type=, attn_decode_q), with a placement too (--vram / plan: the plan prices the
# cache in that format and the arena holds it).


def load_engine(path: str, device: str = "cpu", n_ctx: int | None = None, kv_type: str = "f16",
                vram: int | str | None = None, plan: Any = None, host_embd: str = "auto",
                progress: bool | None = None, mtp: bool = False, batch: int = 1, **kw: Any):
    """`vram` (bytes, '16GiB', or 'auto' = the device's free memory) or a ready `plan`
    (tightfit.plan.plan_model of this file) place the weights for device='cuda': one device arena
    sized by the plan, host rows read from the mmap (tightfit.model.placed). Without either,
    the GPU executor uploads every trunk matrix by itself (legacy path).
    `mtp`: the GPU executor also holds the MTP block for the MTP drafter (`--spec ...,mtp`); a plan
    made from `vram` then prices it and must fit wholly on the GPU, a ready plan must have been
    made with MTP. The CPU model needs nothing (its drafter dequantizes the block itself)."""
    from tightfit.api import open_model
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf

    if (vram is not None or plan is not None) and not device.startswith("cuda"):
        raise UserError("--vram places weights in GPU memory; it needs --device cuda")
    mf = open_model(path)
    if device == "cpu":
        from tightfit.model.reference import ReferenceModel
        import torch
        from tightfit.runtime.state import quant_kv_type
        qt = quant_kv_type(kv_type, mf.config)      # None for f16/f32; UserError if unknown
        dt = getattr(torch, KV_DTYPES.get(kv_type.lower(), "float16"))
        model = ReferenceModel.from_model_file(mf, kv_dtype=dt, kv_type=qt)
    elif device.startswith("cuda"):
        # before anything touches CUDA: a ready plan without MTP cannot hold the drafter's block
        if mtp and plan is not None and not plan.options.include_mtp:
            raise UserError("the MTP drafter is not in this plan: make the plan with MTP "
                            "(tightfit plan --mtp, plan_for(..., mtp=True))")
        try:
            from tightfit.model.executor import GPUModel  # the graph-captured GPU executor
        except ImportError as e:
            raise UserError(f"the GPU executor is not available in this build ({e})") from e
        if kv_type.lower() != "f16":   # never a silent downgrade of the asked-for cache format
            from tightfit.runtime.state import quant_kv_type
            qt = quant_kv_type(kv_type, mf.config)      # UserError if unknown / wrong head_dim
            if qt is None:
                raise UserError(f"--kv-type {kv_type}: the GPU executor runs an f16 or a quantized "
                                "KV cache (q8_0, tq3, tq4, <k>+<v>); f32 runs on --device cpu")
            kw["kv_type"] = qt
        if plan is None and vram is not None:
            from tightfit.model.placed import plan_for
            plan = plan_for(path, n_ctx or min(mf.config.n_ctx_train, 4096), vram,
                            kv_type=kv_type, host_embd=host_embd, device=device, mtp=mtp,
                            batch=batch)
        if plan is not None:
            n_ctx = n_ctx or plan.options.ctx
            kw.update(plan=plan, progress=progress)
        model = GPUModel.from_model_file(mf, device=device, n_ctx=n_ctx, mtp=mtp, **kw)
    else:
        raise UserError(f"unknown device {device!r} (use 'cpu' or 'cuda[:N]')")
    tok = from_gguf(mf.gguf.metadata)
    template = mf.gguf.metadata.get("tokenizer.chat_template")
    return Engine(mf, model, tok, n_ctx=n_ctx, chat_template=template)
