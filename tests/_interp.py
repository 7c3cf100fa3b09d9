"""Interpreted or compiled Triton kernels: one rule for the test modules that launch them.

`triton.jit` reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is first
imported, and pytest imports every test module of a run into one process. A module that set
TRITON_INTERPRET=1 unconditionally therefore broke the GPU runs: collected after a module that had
already imported some kernels compiled, it chose the CPU and handed CPU tensors to compiled
kernels ("ValueError: Pointer argument ... cannot be accessed from Triton (cpu tensor?)");
collected first, it made every later kernel module interpreted, so the GPU never ran compiled code.

The rule:
* set TRITON_INTERPRET=1 only where there is no GPU, and before importing Triton itself or any
  kernel module (`interpret_without_gpu()`; triton.language's own jit helpers such as tl.zeros are
  decorated when Triton is imported, and compiled ones fail inside interpreted kernels);
* choose the tensor device from how the kernels were actually built (`interpreted(...)`,
  `device(...)`), not from the environment now: interpreted kernels take CPU tensors only,
  compiled ones CUDA tensors only.

Usage (tests/ is on sys.path, as for hf_oracle):

    import _interp
    _interp.interpret_without_gpu()               # before importing triton / tightfit.kernels
    from tightfit.kernels import norm as N
    INTERP = _interp.interpreted(N)               # a kernel module, a kernel, or a module name
    DEV = _interp.device(N)                       # "cpu" if INTERP else "cuda"
"""
from __future__ import annotations

import importlib
import os
import types


def interpret_without_gpu() -> None:
    """TRITON_INTERPRET=1 where no GPU is present (an explicit setting is kept); call it before
    importing triton or any kernel module. (torch does not import triton.)"""
    try:
        import torch
    except ImportError:          # the module skips itself (importorskip)
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _kernel_types():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return JITFunction, InterpretedFunction


def _unwrap(k):
    """The jit function under autotune / heuristics wrappers (they keep it in `.fn`)."""
    kinds = _kernel_types()
    while not isinstance(k, kinds) and hasattr(k, "fn"):
        k = k.fn
    return k


def _kernels(obj) -> list:
    kinds = _kernel_types()
    if isinstance(obj, str):
        obj = importlib.import_module(obj)
    if isinstance(obj, types.ModuleType):
        ks = [_unwrap(v) for v in vars(obj).values()]
        ks = [k for k in ks if isinstance(k, kinds)]
        if not ks:
            raise ValueError(f"{obj.__name__} holds no Triton kernel")
        return ks
    k = _unwrap(obj)
    if not isinstance(k, kinds):
        raise TypeError(f"not a Triton kernel: {obj!r}")
    return [k]


def interpreted(*objs) -> bool:
    """True when every kernel of `objs` (kernel modules, module names, or kernels) was built for
    the interpreter (takes CPU tensors); False when any was compiled (takes CUDA tensors)."""
    if not objs:
        raise TypeError("interpreted() needs a kernel module or kernel")
    _, interp_fn = _kernel_types()
    return all(isinstance(k, interp_fn) for o in objs for k in _kernels(o))


def device(*objs) -> str:
    """The tensor device the kernels of `objs` accept: "cpu" if interpreted, else "cuda"."""
    return "cpu" if interpreted(*objs) else "cuda"
