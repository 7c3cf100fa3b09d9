"""One device arena per session, filled from the read-only mmap (seed 000 '实测' §2).

`Arena(plan, device)` allocates a single uint8 tensor of `plan.arena_bytes` and hands out aligned
views: the GPU rows of every weight, the KV cache, both recurrent-state banks, workspace, scratch
and staging. Nothing else is allocated on the device for the model, so the bill is the truth.

`upload(model, placement, arena)` copies every GPU segment from the file through a small ring of
(pinned, on CUDA) staging buffers, then drops the pages it read from the process and from the page
cache (madvise + posix_fadvise DONTNEED), so peak extra host memory is the ring plus one chunk of
mapped pages, never a second copy of the weights.
"""
from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from tightfit.errors import UserError
from tightfit.plan.placement import GPU, Placement, Segment

RING_SLOT_BYTES = 4 << 20     # 4 MiB per staging slot
RING_SLOTS = 2                # double buffering: fill one slot while the other is in flight
_PAGE = mmap.PAGESIZE


class Arena:
    def __init__(self, plan: Any, device: str | torch.device = "cuda"):
        self.device = torch.device(device)
        self.plan = plan
        self.placement: Placement = plan.placement
        self.regions = {name: (off, n) for name, off, n in plan.layout()}
        self.nbytes = int(plan.arena_bytes)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError("no CUDA device is available for the arena")
        # ONE allocation; every view below aliases it
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        self._gpu: dict[str, Segment] = {s.tensor: s for s in self.placement.gpu_segments()}

    def region(self, name: str) -> torch.Tensor:
        off, n = self.regions[name]
        return self.buffer[off:off + n]

    def segment(self, tensor: str) -> Segment:
        try:
            return self._gpu[tensor]
        except KeyError:
            raise KeyError(f"{tensor} has no rows in the device arena") from None

    def weight(self, tensor: str, row_bytes: int | None = None) -> torch.Tensor:
        """The GPU rows of `tensor` as raw bytes; (rows, row_bytes) when row_bytes is given."""
        s = self.segment(tensor)
        v = self.buffer[s.arena_offset:s.arena_offset + s.nbytes]
        return v.view(s.row_end - s.row_start, row_bytes) if row_bytes else v


@dataclass
class UploadReport:
    bytes: int
    segments: int
    seconds: float
    released_bytes: int


def _source(model: Any) -> tuple[str, Mapping[str, Any]]:
    """(path, tensors-with-absolute-offsets) from a ModelInventory, or any object exposing `.path`
    and `.tensors` (or `.gguf.tensors`) whose entries carry `.offset`."""
    path = getattr(model, "path", None)
    tensors = getattr(model, "tensors", None)
    if tensors is None and getattr(model, "gguf", None) is not None:
        tensors = model.gguf.tensors
        path = path or getattr(model.gguf, "path", None)
    if path is None or tensors is None:
        raise UserError("upload needs a model opened from a GGUF file (a preset has no weights)")
    return os.fspath(path), tensors


def _release(fd: int, mm: mmap.mmap, off: int, n: int) -> int:
    """Drop file pages [off, off+n) from this process (madvise) and from the page cache
    (posix_fadvise). Both are hints on a read-only mapping, always safe: a later read refaults."""
    lo = off // _PAGE * _PAGE
    hi = min(len(mm), -(-(off + n) // _PAGE) * _PAGE)
    if hi <= lo:
        return 0
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
    return hi - lo


def upload(model: Any, placement: Placement, arena: Arena, progress: bool = True,
           slot_bytes: int = RING_SLOT_BYTES, slots: int = RING_SLOTS) -> UploadReport:
    """Copy every GPU segment of `placement` from the file into `arena`; host segments are left
    in place (they are read through the mmap at run time)."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)
    from tightfit.plan.rowsplit import check_exact_cover

    path, tensors = _source(model)
    check_exact_cover(placement, {n: t for n, t in tensors.items()}, arena.nbytes)
    segs = sorted(placement.gpu_segments(), key=lambda s: tensors[s.tensor].offset + s.byte_start)
    total = sum(s.nbytes for s in segs)
    cuda = arena.device.type == "cuda"
    ring = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(slots)]
    ring_np = [r.numpy() for r in ring]
    events: list[Any] = [None] * slots
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    released = 0
    i = 0
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        try:
            with Progress(TextColumn("upload"), BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), TimeRemainingColumn(),
                          disable=not progress, transient=True) as bar:
                task = bar.add_task("upload", total=total)
                for s in segs:
                    src = int(tensors[s.tensor].offset) + s.byte_start
                    if src + s.nbytes > size:
                        raise UserError(f"{path}: tensor {s.tensor} runs past the end of the file")
                    dst = arena.buffer[s.arena_offset:s.arena_offset + s.nbytes]
                    for c in range(0, s.nbytes, slot_bytes):
                        n = min(slot_bytes, s.nbytes - c)
                        k = i % slots
                        if events[k] is not None:
                            events[k].synchronize()    # slot's previous H2D copy has finished
                        np.copyto(ring_np[k][:n], np.frombuffer(mm, np.uint8, n, src + c))
                        dst[c:c + n].copy_(ring[k][:n], non_blocking=cuda)
                        if cuda:
                            events[k] = torch.cuda.Event()
                            events[k].record()
                        i += 1
                        bar.advance(task, n)
                    # the bytes are in the ring or the arena now: drop the mapped pages
                    released += _release(fd, mm, src, s.nbytes)
            if cuda:
                torch.cuda.synchronize(arena.device)
        finally:
            mm.close()
    finally:
        os.close(fd)
    return UploadReport(total, len(segs), time.perf_counter() - t0, released)


# ---- host-resident rows ----------------------------------------------------------------------
def open_readonly(path: str | os.PathLike) -> mmap.mmap:
    """The read-only mapping that host rows are computed from (pages shared with the page cache,
    never copied)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def host_view(mm: mmap.mmap, tensor: Any, seg: Segment) -> np.ndarray:
    """(rows, row_bytes) uint8 view of a host segment, zero-copy from the mapping."""
    from tightfit.kernels.cpu_gemv import as_rows
    rb = (seg.byte_end - seg.byte_start) // (seg.row_end - seg.row_start)
    return as_rows(mm, rb, seg.row_end - seg.row_start, int(tensor.offset) + seg.byte_start)


def embed_tokens(mm: mmap.mmap, tensor: Any, token_ids: Any) -> np.ndarray:
    """Host embedding (seed 004): decode only the looked-up rows of token_embd on the CPU."""
    from tightfit.kernels.cpu_gemv import as_rows, decode_rows
    w = as_rows(mm, tensor.row_bytes, tensor.n_rows, int(tensor.offset))
    return decode_rows(w, tensor.qtype, token_ids)
