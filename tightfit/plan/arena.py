"""One device arena per session, filled from the GGUF file (seed 000 '实测' §2).

`Arena(plan, device)` allocates a single uint8 tensor of `plan.arena_bytes` and hands out aligned
views: the GPU rows of every weight, the KV cache, both recurrent-state banks, workspace, staging
and the verify block's buffers. Besides it, the batched forward's per-chunk tensors (the `scratch`
line) and the MTP drafter's cache and step (the `mtp` line) are allocated through torch within
what the plan leaves for them; bench/mtp_peak.py compares the measured peak with the plan.

`upload(model, placement, arena)` copies every GPU segment from the file into the arena:

* the segments, in file order, are cut into *chunks* of at most one staging slot: a segment larger
  than a slot spans several chunks; consecutive small segments (norms, biases, ...) whose file
  ranges are at most `COALESCE_GAP` apart share one chunk, so they cost one read, not one each;
* a pool of `UPLOAD_READERS` threads `os.preadv`s each chunk straight into its (pinned, on CUDA)
  slot of a ring of `RING_SLOTS` x `RING_SLOT_BYTES`: no mmap, no page fault per 4 KiB, and
  preadv releases the GIL, so the readers run in parallel;
* the caller's thread issues the H2D copies of a filled slot on a dedicated CUDA stream, records
  one event per slot use, and the next reader of that slot waits on that event first; on a CPU
  arena the same path does a plain copy;
* once a chunk's bytes are in the ring, their page-cache pages are dropped (posix_fadvise
  DONTNEED) by a single background thread, off the copy path: peak extra host memory is the ring,
  never a second copy of the weights.

A read error or a file that ends early inside a reader thread is raised in the caller (as
UserError); the pools are shut down and the copy stream drained before `upload` returns or raises.
"""
from __future__ import annotations

import mmap
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from tightfit.errors import UserError
from tightfit.plan.placement import GPU, Placement, Segment

#: Bytes per staging slot. 16 MiB: one preadv of 16 MiB from the page cache takes ~2 ms and one
#: H2D copy ~0.3 ms, so the per-chunk overhead (a future, an event, a few copy calls: ~50 us) is a
#: few percent, while the ring stays small and the pipeline fills within the first 200 MiB.
RING_SLOT_BYTES = 16 << 20
#: Slots in the ring. UPLOAD_READERS slots are being filled at any time; the 4 more are filled
#: slots whose H2D copies are queued or in flight, so the readers never wait on the copy engine
#: while the copy engine always has the next slot ready. 12 x 16 MiB = 192 MiB of pinned host
#: memory (the ceiling is 256 MiB: the bar is 1 GiB of extra host RSS for a 16 GB file). Each slot
#: is its own power-of-two allocation, so the pinned allocator rounds nothing up.
RING_SLOTS = 12
#: Reader threads. Copying from the page cache runs at ~5-10 GB/s per core, so 8 readers can feed
#: a PCIe 5 link (~50 GB/s) from the page cache, and on a cold cache they keep 8 chunks of disk
#: I/O (each announced with POSIX_FADV_WILLNEED) in flight. Capped at RING_SLOTS - 1.
UPLOAD_READERS = 8
#: Two GPU segments whose file ranges are at most this far apart go into one read (the bytes in
#: between are read and thrown away): GGUF pads tensors to 32 B, so in practice this batches runs
#: of small tensors into one chunk while never reading a large host suffix for nothing.
COALESCE_GAP = 64 << 10
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


@dataclass
class _Chunk:
    """File bytes [lo, hi) read into one slot; `pieces` = (offset in the slot, arena offset,
    bytes) of the GPU data in it (the bytes between pieces, at most COALESCE_GAP each, are not
    copied); `segments` = GPU segments whose last byte is in this chunk (progress)."""
    lo: int
    hi: int
    pieces: list[tuple[int, int, int]] = field(default_factory=list)
    nbytes: int = 0
    segments: int = 0


def _plan_chunks(ranges: list[tuple[int, int, int]], slot_bytes: int,
                 gap: int = COALESCE_GAP) -> list[_Chunk]:
    """Cut (file offset, arena offset, bytes) ranges, sorted by file offset, into chunks of at most
    `slot_bytes` file bytes. A range starts a new chunk when it is more than `gap` bytes past the
    current one or the current one is full; a range longer than the room left spills over."""
    chunks: list[_Chunk] = []
    cur: _Chunk | None = None
    for a, d, n in ranges:
        end = a + n
        while a < end:
            if cur is None or a - cur.hi > gap or a < cur.lo or a >= cur.lo + slot_bytes:
                cur = _Chunk(a, a)
                chunks.append(cur)
            k = min(end - a, cur.lo + slot_bytes - a)
            so = a - cur.lo
            last = cur.pieces[-1] if cur.pieces else None
            if last is not None and last[0] + last[2] == so and last[1] + last[2] == d:
                cur.pieces[-1] = (last[0], last[1], last[2] + k)   # contiguous in file AND arena
            else:
                cur.pieces.append((so, d, k))
            cur.hi = max(cur.hi, a + k)
            cur.nbytes += k
            a += k
            d += k
        if cur is not None and n > 0:
            cur.segments += 1
    return chunks


def _pread_into(fd: int, buf: memoryview, off: int, path: str) -> None:
    """Fill `buf` with file bytes [off, off + len(buf)); UserError if the file ends early or the
    read fails (a reader thread raises; the caller re-raises it)."""
    got, n = 0, len(buf)
    while got < n:
        try:
            k = os.preadv(fd, [buf[got:]], off + got)
        except OSError as e:
            raise UserError(f"{path}: read of {n - got} B at byte {off + got} failed: {e}") from e
        if k <= 0:
            raise UserError(f"{path}: the file ends at byte {off + got}, inside tensor data "
                            f"(truncated while loading?)")
        got += k


def _read_chunk(fd: int, path: str, c: _Chunk, buf: memoryview, wait: Any) -> None:
    """Reader thread: wait until the slot's previous H2D copy is done, then read the chunk."""
    if wait is not None:
        wait.synchronize()              # releases the GIL
    n = c.hi - c.lo
    if hasattr(os, "posix_fadvise"):    # start the whole chunk's disk I/O at once (cold cache)
        os.posix_fadvise(fd, c.lo, n, os.POSIX_FADV_WILLNEED)
    _pread_into(fd, buf[:n], c.lo, path)


def _drop_pages(fd: int, off: int, n: int) -> None:
    """Drop file pages [off, off+n) from the page cache: a hint, always safe (a later read
    refaults). This process never maps the file here, so there is nothing to madvise."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)


def _progress_bar(progress: bool):
    from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn,
                               TransferSpeedColumn)
    return Progress(TextColumn("[bold]upload[/] {task.description}"), BarColumn(),
                    TaskProgressColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(),
                    disable=not progress, transient=True)


def upload(model: Any, placement: Placement, arena: Arena, progress: bool = True,
           slot_bytes: int = RING_SLOT_BYTES, slots: int = RING_SLOTS,
           readers: int = UPLOAD_READERS) -> UploadReport:
    """Copy every GPU segment of `placement` from the file into `arena`; host segments are left
    in place (they are read through the mmap at run time). The page-cache pages of what was read
    are dropped behind the copy (`released_bytes`). `seconds` covers the ring allocation, the
    reads, the copies and the release, up to the final synchronize."""
    from tightfit.plan.rowsplit import check_exact_cover

    path, tensors = _source(model)
    check_exact_cover(placement, {n: t for n, t in tensors.items()}, arena.nbytes)
    segs = sorted(placement.gpu_segments(), key=lambda s: tensors[s.tensor].offset + s.byte_start)
    total = sum(s.nbytes for s in segs)
    slot_bytes, slots = max(1, int(slot_bytes)), max(1, int(slots))
    cuda = arena.device.type == "cuda"
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        ranges = []
        for s in segs:
            src = int(tensors[s.tensor].offset) + s.byte_start
            if src + s.nbytes > size:
                raise UserError(f"{path}: tensor {s.tensor} runs past the end of the file")
            ranges.append((src, int(s.arena_offset), s.nbytes))
        chunks = _plan_chunks(ranges, slot_bytes)
        t0 = time.perf_counter()
        released = _copy_chunks(fd, path, size, chunks, arena, cuda, progress, total, len(segs),
                                min(slots, max(1, len(chunks))), max(1, int(readers)))
        return UploadReport(total, len(segs), time.perf_counter() - t0, released)
    finally:
        os.close(fd)


def _copy_chunks(fd: int, path: str, size: int, chunks: list[_Chunk], arena: Arena, cuda: bool,
                 progress: bool, total: int, n_segs: int, slots: int, readers: int) -> int:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    # the ring: one allocation per slot, no larger than the largest chunk (page-rounded)
    sb = max((c.hi - c.lo for c in chunks), default=1)
    sb = -(-sb // _PAGE) * _PAGE
    ring = [torch.empty(sb, dtype=torch.uint8, pin_memory=cuda) for _ in range(slots)]
    ring_np = [r.numpy() for r in ring]
    ring_mv = [memoryview(r) for r in ring_np]
    events: list[Any] = [None] * slots
    stream = torch.cuda.Stream(device=arena.device) if cuda else None
    buf = arena.buffer
    buf_np = None if cuda else buf.numpy()
    # at most slots - 1 readers: one filled slot is always free for the copy engine
    pool = ThreadPoolExecutor(max(1, min(readers, slots - 1)), thread_name_prefix="tightfit-upload")
    dropper = ThreadPoolExecutor(1, thread_name_prefix="tightfit-upload-release")
    pending: deque[tuple[int, int, Future]] = deque()
    drops: list[Future] = []
    released = 0
    mark = 0            # file pages below `mark` have been released
    done_segs = 0
    try:
        with _progress_bar(progress) as bar:
            task = bar.add_task(f"0/{n_segs} tensors", total=total)

            def drain() -> None:
                nonlocal released, mark, done_segs
                i, k, fut = pending.popleft()
                fut.result()                                # a reader's exception surfaces here
                c = chunks[i]
                src = ring[k]
                if cuda:
                    with torch.cuda.stream(stream):
                        for so, ao, n in c.pieces:
                            buf[ao:ao + n].copy_(src[so:so + n], non_blocking=True)
                        ev = torch.cuda.Event()
                        ev.record(stream)
                    events[k] = ev
                else:                                       # numpy: torch's CPU copy_ is slower
                    src_np = ring_np[k]
                    for so, ao, n in c.pieces:
                        np.copyto(buf_np[ao:ao + n], src_np[so:so + n])
                # the chunk is in the ring: release its pages. Every chunk before it is read too,
                # so [floor(lo), floor(hi)) is safe; the page holding `hi` may be shared with the
                # next chunk, which releases it when it starts in it (the last chunk: now). A page
                # shared with host or excluded bytes past a gap stays cached (one per gap).
                lo = max(mark, c.lo // _PAGE * _PAGE)
                hi = (c.hi // _PAGE * _PAGE) if i + 1 < len(chunks) else \
                    min(size, -(-c.hi // _PAGE) * _PAGE)
                if hi > lo:
                    drops.append(dropper.submit(_drop_pages, fd, lo, hi - lo))
                    released += hi - lo
                    mark = hi
                done_segs += c.segments
                bar.update(task, advance=c.nbytes, description=f"{done_segs}/{n_segs} tensors")

            for i, c in enumerate(chunks):
                k = i % slots
                while len(pending) >= slots:                # chunk i - slots must be copied out
                    drain()
                pending.append((i, k, pool.submit(_read_chunk, fd, path, c, ring_mv[k],
                                                  events[k])))
                while pending and pending[0][2].done():
                    drain()
            while pending:
                drain()
            for f in drops:
                f.result()
        if cuda:
            stream.synchronize()
            torch.cuda.synchronize(arena.device)
    finally:
        for _, _, f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)       # readers finish at most one read each
        dropper.shutdown(wait=True, cancel_futures=True)
        if cuda:
            stream.synchronize()                            # no copy may still read the ring
            del ring, ring_np, ring_mv
            empty = getattr(torch._C, "_host_emptyCache", None)
            if empty is not None:                           # give the pinned ring back now
                try:
                    empty()
                except RuntimeError:
                    pass
    return released


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
