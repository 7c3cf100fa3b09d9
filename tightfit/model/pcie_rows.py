"""Host rows read by the GPU over PCIe, in place, beside the CPU's (issue 5).

In the 8 GiB decode the CPU reads ~8 GB of host rows per token and is compute-bound near
70-80 GB/s on the device host's 16 threads. The GPU is a second reader of the same host RAM: the
mapping's pages registered with cudaHostRegister(Mapped | ReadOnly) are readable by a GPU kernel
at their host address (UVA), so the step's GEMV runs on them with nothing copied first and no
VRAM spent. Measured on the device (bench/zero_copy.py, session 12): the CUDA GEMV reads such
rows at 40-49 GB/s alone and 37-46 GB/s while the CPU kernel runs on other rows at 55-63 GB/s,
~92-100 GB/s together against the CPU's 65-74 alone.

So the decode step splits each matrix's host suffix [row_start, row_end) once more:

    [0, gpu_rows)            device arena (the plan's GPU prefix)       -> GPU GEMV, VRAM
    [row_start, pcie_end)    host mapping, registered                   -> GPU GEMV, over PCIe
    [pcie_end, row_end)      host mapping                                -> CPU GEMV

The plan's exact cover is untouched: the PCIe rows are host rows (host memory, host bytes of the
roofline); only who reads them changes. The GPU part runs in the host point's prefix graph, i.e.
while the CPU computes its rows. Batched forwards (prefill chunks, verify blocks) keep the whole
suffix on their own paths (CPU, or the host-row ring).

TIGHTFIT_PCIE_ROWS: the share of each split matrix's host rows the GPU reads (0 = off, the CPU
reads all; default DEFAULT_SHARE), rounded down to whole SPLIT_ROW_QUANTUM row groups; types the
CUDA GEMV does not serve stay on the CPU.
"""
from __future__ import annotations

import os
import numpy as np
import torch

#: the default share of host rows read by the GPU over PCIe (see bench/RESULTS.md, session 12)
DEFAULT_SHARE = 0.4
_PAGE = 4096
_MAPPED, _READ_ONLY = 2, 8        # cudaHostRegisterMapped | cudaHostRegisterReadOnly


def share_from_env() -> float:
    """TIGHTFIT_PCIE_ROWS as a share in [0, 0.9]; a malformed value is an error, not a guess."""
    v = os.environ.get("TIGHTFIT_PCIE_ROWS", "").strip()
    if v == "":
        return DEFAULT_SHARE
    if v.lower() in ("off", "no"):
        return 0.0
    try:
        s = float(v)
    except ValueError:
        raise ValueError(f"TIGHTFIT_PCIE_ROWS={v!r}: expected a share between 0 and 0.9") from None
    if not 0.0 <= s <= 0.9:
        raise ValueError(f"TIGHTFIT_PCIE_ROWS={v!r}: expected a share between 0 and 0.9")
    return s


def pcie_rows(n_host_rows: int, share: float, quantum: int) -> int:
    """How many of a suffix's first rows the GPU reads: share of them in whole quanta."""
    return int(n_host_rows * share) // quantum * quantum


def page_spans(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Page-aligned (start, end) address spans covering every [a, b) of ranges, overlapping or
    touching ones merged: each page is registered once (a second registration of a page fails)."""
    spans: list[tuple[int, int]] = []
    for a, b in sorted((a // _PAGE * _PAGE, -(-b // _PAGE) * _PAGE) for a, b in ranges if b > a):
        if spans and a <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b))
        else:
            spans.append((a, b))
    return spans


class _CudaArray:
    """A device address as __cuda_array_interface__ (torch.as_tensor wraps it, no copy)."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"shape": (int(n),), "typestr": "|u1",
                                         "data": (int(ptr), False), "version": 3,
                                         "strides": None}


class Registration:
    """The host pages of some mapping ranges, registered for GPU reads until close()."""

    def __init__(self, ranges: list[tuple[int, int]]):
        import cupy
        self._rt = cupy.cuda.runtime
        self.spans: list[tuple[int, int]] = []
        try:
            for a, b in page_spans(ranges):
                self._rt.hostRegister(a, b - a, _MAPPED | _READ_ONLY)
                self.spans.append((a, b))
        except Exception:
            self.close()
            raise
        self.nbytes = sum(b - a for a, b in self.spans)

    def device_view(self, arr: np.ndarray) -> torch.Tensor:
        """A CUDA uint8 tensor over arr's registered bytes (the GPU reads them over PCIe)."""
        ptr = int(arr.ctypes.data)
        if not any(a <= ptr and ptr + arr.nbytes <= b for a, b in self.spans):
            raise ValueError("rows outside the registered host pages")
        dptr = int(self._rt.pointerGetAttributes(ptr).devicePointer)
        return torch.as_tensor(_CudaArray(dptr, arr.nbytes), device="cuda")

    def close(self) -> None:
        for a, _ in self.spans:
            try:
                self._rt.hostUnregister(a)
            except Exception:  # noqa: BLE001 - already gone with the context at exit
                pass
        self.spans = []


def register_or_warn(ranges: list[tuple[int, int]], make=None) -> "Registration | None":
    """Registration of ranges, or None with a warning that says why and what happens instead
    (the CPU keeps every host row: slower, never wrong) when the host refuses it (no cupy, a
    mapping the driver cannot pin, a lock limit)."""
    try:
        return (make or Registration)(ranges)
    except Exception as e:  # noqa: BLE001 - any refusal: the step stays on the CPU-only split
        import warnings
        warnings.warn(f"tightfit: host rows stay on the CPU (TIGHTFIT_PCIE_ROWS): registering the "
                      f"model mapping for GPU reads failed: {e}", RuntimeWarning, stacklevel=2)
        return None


def plan_split(hostw: dict, share: float, quantum: int, served) -> dict[str, int]:
    """name -> rows the GPU reads over PCIe (first rows of the host suffix), for the matrices
    whose type `served(qtype)` accepts; none when share is 0."""
    out = {}
    if share <= 0:
        return out
    for name, H in hostw.items():
        if not served(H.qtype):
            continue
        n = pcie_rows(H.n_rows, share, quantum)
        if n > 0:
            out[name] = n
    return out


__all__ = ["DEFAULT_SHARE", "share_from_env", "pcie_rows", "page_spans", "Registration",
           "register_or_warn", "plan_split"]
