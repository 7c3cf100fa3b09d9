"""What the run-time-compiled CUDA C++ kernels (NVRTC through cupy: gemv_cuda, attn_decode_q_cuda)
share: the optional cupy import, cupy's view of torch's current stream (cached per stream: creating
an ExternalStream per launch costs host time in the step), and `launch`, which starts a kernel
either through cupy or, for programmatic dependent launch (PDL, tightfit/kernels/pdl.py), through
the driver's cuLaunchKernelEx (cupy has no way to pass launch attributes)."""
from __future__ import annotations

import ctypes
import threading
from functools import lru_cache

import numpy as np

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


# ---------------------------------------------------------------- driver launch with attributes
# Layouts from cuda.h (CUDA 12/13; tests/test_pdl_launch.py compiles a probe against the installed
# header and compares sizes and offsets): CUlaunchAttributeValue is a 64-byte union whose members
# include a pointer (8-byte alignment); CUlaunchAttribute is {id, pad to 8, value}; CUlaunchConfig
# is seven unsigned ints, the stream, the attribute array and its length.
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class CUlaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64),
                ("_align", ctypes.c_uint64),        # the union's pointer members align it to 8
                ("programmaticStreamSerializationAllowed", ctypes.c_int)]


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int),               # CUlaunchAttributeID (an enum: int)
                ("pad", ctypes.c_char * 4),
                ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint),
                ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(CUlaunchAttribute)),
                ("numAttrs", ctypes.c_uint)]


# kernel argument types the launchers pass -> the C type the kernel parameter has
_CTYPES = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.int32): ctypes.c_int32,
           np.dtype(np.float32): ctypes.c_float}


def pack_args(args) -> tuple[list, ctypes.Array]:
    """(the ctypes values, the void*[] of their addresses) for kernelParams. Only numpy scalars of
    the types in _CTYPES: a Python int would have no defined width."""
    vals = []
    for i, a in enumerate(args):
        ct = _CTYPES.get(getattr(a, "dtype", None))
        if ct is None or np.ndim(a) != 0:
            raise TypeError(f"kernel argument {i}: {type(a).__name__} is not a numpy scalar of "
                            f"{sorted(str(d) for d in _CTYPES)}")
        vals.append(ct(a.item()))
    ptrs = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
    return vals, ptrs


def _dim3(d) -> tuple[int, int, int]:
    d = tuple(int(v) for v in (d if isinstance(d, (tuple, list)) else (d,)))
    return (d + (1, 1, 1))[:3]


def make_config(grid, block, shared_mem: int, stream_ptr: int, pdl: bool):
    """(CUlaunchConfig, the attribute array it points to: keep both alive over the call)."""
    attrs = (CUlaunchAttribute * 1)()
    n = 0
    if pdl:
        attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[0].value.programmaticStreamSerializationAllowed = 1
        n = 1
    g, b = _dim3(grid), _dim3(block)
    cfg = CUlaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], int(shared_mem),
                         ctypes.c_void_p(int(stream_ptr) or None),
                         ctypes.cast(attrs, ctypes.POINTER(CUlaunchAttribute)), n)
    return cfg, attrs


@lru_cache(maxsize=1)
def _driver():
    return bind(ctypes.CDLL("libcuda.so.1"))


def bind(lib):
    """(cuLaunchKernelEx, cuGetErrorName) of a loaded driver library (tests bind a stand-in built
    against cuda.h), with their C signatures."""
    fn = lib.cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(CUlaunchConfig), ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return fn, name


def _err_name(code: int) -> str:
    s = ctypes.c_char_p()
    try:
        if _driver()[1](code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
    except Exception:  # noqa: BLE001 - the name is only decoration of the error
        pass
    return "?"


def cu_function(fn) -> int:
    """The CUfunction handle of a cupy kernel: RawModule.get_function gives a RawKernel, whose
    `.kernel` is the cupy.cuda.Function of the current device (`.ptr`)."""
    return int(getattr(fn, "kernel", fn).ptr)


def launch(fn, grid, block, args, shared_mem: int = 0, stream_ptr: int = 0, device: int = 0,
           pdl: bool = False) -> None:
    """Launch cupy kernel `fn` on the stream with handle `stream_ptr` (torch's cuda_stream).
    args: numpy scalars (np.uint64 pointers, np.int32, np.float32) in the kernel's order.
    pdl False: cupy's launch, as before. pdl True: cuLaunchKernelEx with
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (the kernel may start before the one
    before it on the stream ends; it must follow pdl.py's rules). Captured into a CUDA graph like
    any launch on the capturing stream (the attribute becomes a programmatic edge). The caller
    makes `fn`'s device current (cupy's launch does not switch devices either)."""
    if not pdl:
        fn(tuple(grid), tuple(block), tuple(args), shared_mem=int(shared_mem),
           stream=stream(stream_ptr, device))
        return
    vals, ptrs = pack_args(args)
    cfg, attrs = make_config(grid, block, shared_mem, stream_ptr, True)
    launch_ex, _ = _driver()
    r = launch_ex(ctypes.byref(cfg), ctypes.c_void_p(cu_function(fn)), ptrs, None)
    del vals, attrs                # alive up to here: the driver copies the parameters at launch
    if r != 0:
        raise RuntimeError(f"cuLaunchKernelEx (PDL) failed: CUresult {r} ({_err_name(r)}), "
                           f"grid {_dim3(grid)}, block {_dim3(block)}, shared {shared_mem}")
