"""Dequantize a qwen35 GGUF's tensors into torch tensors for the CPU reference forward.

Shapes follow spec/qwen35.md §0: a tensor with ggml `ne = {n_in, n_out}` becomes a torch tensor
of shape `(n_out, n_in)`, i.e. exactly an `nn.Linear.weight`, so the forward computes `x @ W.T`.

Two ways to hold the weights, both `Mapping[str, torch.Tensor]`:

* `load_weights(mf, dtype)` dequantizes every trunk tensor once (eager). Matrices are stored in
  `dtype` (float32 default; bfloat16/float16 halve the memory and the forward casts one matrix
  at a time to its compute dtype), 1-D tensors always in float32. Right for small models.
* `LazyWeights(mf, dtype)` dequantizes a tensor each time it is read and keeps nothing but the
  1-D tensors; memory stays at the mmap'd file plus the one matrix in use. This is how a CPU
  reference can touch a 27B file without a second full copy of the weights. It also serves
  embedding rows without dequantizing the whole `token_embd` (`rows()`).

The ModelFile (`tightfit.api.open_model`) supplies `.config` and `.gguf.tensors[name]` with
`.raw()`, `.qtype` and `.numpy_shape`; any object of that shape works.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np
import torch

from tightfit.errors import GGUFError
from tightfit.model.config import Qwen35Config


def _dequantize_np(raw: np.ndarray, qtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """raw uint8 blocks -> float32 array of `shape` (numpy order)."""
    try:
        from tightfit.quant.dequant import dequantize as tf_dequantize
    except ImportError:  # the project's dequantizer is not there: fall back to gguf-py's
        tf_dequantize = None
    if tf_dequantize is not None:
        return tf_dequantize(raw, int(qtype), shape)
    import gguf
    qt = gguf.GGMLQuantizationType(int(qtype))
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    arr = np.asarray(raw, dtype=np.uint8).reshape(-1, shape[-1] // bs * ts)
    return np.asarray(gguf.quants.dequantize(arr, qt), dtype=np.float32).reshape(shape)


def _to_torch(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.to(dtype) if t.dtype != dtype else t


def dequantize_tensor(info: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One tensor record (`.raw()`, `.qtype`, `.numpy_shape`) -> torch tensor in numpy shape."""
    shape = tuple(int(s) for s in info.numpy_shape)
    return _to_torch(_dequantize_np(info.raw(), info.qtype, shape), dtype)


def _row_bytes(qtype: Any, n_cols: int) -> int:
    try:
        from tightfit.quant.traits import row_bytes
        return int(row_bytes(int(qtype), n_cols))
    except ImportError:
        import gguf
        bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(qtype))]
        return n_cols // bs * ts


def dequantize_rows(info: Any, rows: torch.Tensor | np.ndarray,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize only the given rows of a 2-D tensor (embedding lookup without a full copy)."""
    n_rows, n_cols = (int(s) for s in info.numpy_shape)
    rb = _row_bytes(info.qtype, n_cols)
    raw = np.asarray(info.raw(), dtype=np.uint8).reshape(n_rows, rb)
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    return _to_torch(_dequantize_np(raw[idx], info.qtype, (idx.size, n_cols)), dtype)


def _trunk_names(config: Qwen35Config, tensors: Mapping[str, Any]) -> list[str]:
    names = [n for n in config.tensor_shapes(include_mtp=False) if n in tensors]
    missing = [n for n in config.tensor_shapes(include_mtp=False) if n not in tensors]
    if missing:
        raise GGUFError(f"model file lacks tensor {missing[0]} (and {len(missing) - 1} more)"
                        if len(missing) > 1 else f"model file lacks tensor {missing[0]}")
    return names


def _tensors_of(mf: Any) -> Mapping[str, Any]:
    g = getattr(mf, "gguf", mf)
    return g.tensors


def load_weights(mf: Any, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Eagerly dequantize every trunk tensor of `mf` (MTP tensors are skipped: they never feed
    the main logits). Matrices in `dtype`, 1-D tensors in float32."""
    tensors = _tensors_of(mf)
    out: dict[str, torch.Tensor] = {}
    for name in _trunk_names(mf.config, tensors):
        info = tensors[name]
        vec = len(info.numpy_shape) == 1 or Qwen35Config.is_vector_tensor(name)
        out[name] = dequantize_tensor(info, torch.float32 if vec else dtype)
    return out


class LazyWeights(Mapping):
    """Dequantize-on-read view of a model file's trunk tensors (see module docstring)."""

    def __init__(self, mf: Any, dtype: torch.dtype = torch.float32):
        self._tensors = _tensors_of(mf)
        self._names = _trunk_names(mf.config, self._tensors)
        self.dtype = dtype
        self._vectors: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._vectors:
            return self._vectors[name]
        if name not in self._tensors or name not in self._names:
            raise KeyError(name)
        info = self._tensors[name]
        if len(info.numpy_shape) == 1 or Qwen35Config.is_vector_tensor(name):
            t = self._vectors[name] = dequantize_tensor(info, torch.float32)
            return t
        return dequantize_tensor(info, self.dtype)

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self._tensors[name], ids.cpu().numpy(), self.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
