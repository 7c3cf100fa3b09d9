"""What the run-time-compiled CUDA C++ kernels (NVRTC through cupy: gemv_cuda, attn_decode_q_cuda)
share: the optional cupy import and cupy's view of torch's current stream, cached per stream
(creating an ExternalStream per launch costs host time in the step)."""
from __future__ import annotations

import threading
from functools import lru_cache

_streams: dict[tuple[int, int], object] = {}
_lock = threading.Lock()


@lru_cache(maxsize=1)
def cupy():
    """The cupy module, or None when it cannot be imported (the Triton kernels are used then)."""
    try:
        import cupy as cp
        return cp
    except Exception:  # noqa: BLE001 - any import failure means: no CUDA C++ path
        return None


def stream(ptr: int, device: int):
    """cupy.cuda.ExternalStream for torch's stream handle `ptr` on `device` (cached)."""
    key = (int(ptr), int(device))
    s = _streams.get(key)
    if s is None:
        with _lock:
            s = _streams.get(key)
            if s is None:
                s = _streams[key] = cupy().cuda.ExternalStream(int(ptr), int(device))
    return s
