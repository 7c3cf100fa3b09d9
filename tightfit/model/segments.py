"""Piecewise CUDA graphs for the decode step with host rows (issue 5).

A step with host-computed matrix rows cannot be ONE graph: the CPU has to compute between kernels.
Launched eagerly it costs ~1,000 Python kernel launches per token (~60 ms on the 27B 8 GiB plan).
Here the step is captured once per (attention mode, head, feed) and state as a chain of graphs cut
at every host call ("host point"):

    seg 0 .. [D2H x -> pinned x_0]   | ev.record | prefix 0 (GPU rows of those matrices)
                                     | ev.sync; CPU: y_0 = host rows . x_0 (into pinned y_0)
    seg 1 [H2D y_0 -> out suffixes] .. [D2H x -> pinned x_1] | ...
    ...
    seg N [H2D y_{N-1} -> ...] .. commit

- a segment ends with the D2H copy of the activation the host needs (a memcpy node into pinned
  memory), so the event recorded right after its replay (outside any capture) covers exactly the
  work the host waits for;
- the GPU prefix rows of the same matrices are their own small graph replayed after that event,
  so they run on the GPU while the CPU computes the suffix rows;
- the next segment starts with the H2D copies from the pinned result: a memcpy node reads the
  pinned memory when it executes, i.e. after the host wrote it (the host replays that segment
  only after its call returned).
Each host point owns its pinned x and y: stream order makes reuse across tokens safe (a buffer
is written again only by the next token's same segment, queued after the host finished with it).

Everything dynamic comes from device buffers, exactly as in the whole-step graph: the token id
(`tok_id`), position and bank (the state's status word); the host-embedding fallback copies its
row into `x` before the first replay. The attention mode, head and feed pick the cached chain
(st.graphs[("host-segments", mode, head, feed)]), as they pick the whole-step graph.

Capture: the same `Recorder` pass twice on a side stream, first eagerly (JIT compiles, host
groups built, pinned buffers allocated -- nothing of that may happen inside a capture -- and
the host points computed), then captured; the status word and token id are restored after both,
like GPUModel._graph.

Switches (read when used): TIGHTFIT_HOST_GRAPHS=0 keeps the eager step (read when the executor
is built); TIGHTFIT_HOST_GRAPHS_PIN=torch takes the pinned buffers from torch's allocator instead
of cudaHostRegister. `Recorder` takes a backend (`CudaBackend`, or a fake one in tests that runs
everything at once and records each segment's calls for replay), so the bookkeeping is testable
without a GPU.
"""
from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import torch

from tightfit.model import onetime


def enabled() -> bool:
    """TIGHTFIT_HOST_GRAPHS (default on): piecewise graphs for steps with host rows."""
    return os.environ.get("TIGHTFIT_HOST_GRAPHS", "1").strip() != "0"


def pinned(n: int) -> torch.Tensor:
    """(1, n) fp32 page-locked host buffer. Registered with cudaHostRegister rather than taken
    from torch's caching host allocator: the copies into/out of it are captured, and this keeps
    them clear of the allocator's event bookkeeping (events recorded during capture); the
    allocator's pin_memory where registration fails or with TIGHTFIT_HOST_GRAPHS_PIN=torch.
    Never called inside a capture (host registration is not a capturable call)."""
    if os.environ.get("TIGHTFIT_HOST_GRAPHS_PIN", "").strip() == "torch":
        return torch.zeros(1, int(n), dtype=torch.float32).pin_memory()
    nbytes = 4 * int(n)
    span = -(-nbytes // 4096) * 4096        # whole pages of its own: no two registrations meet
    raw = np.zeros(span + 4096, np.uint8)
    off = (-raw.ctypes.data) % 4096
    arr = raw[off:off + nbytes].view(np.float32).reshape(1, int(n))
    try:
        rt = torch.cuda.cudart()
        rc = rt.cudaHostRegister(arr.ctypes.data, span, 0)
        if int(getattr(rc, "value", rc)) == 0:
            weakref.finalize(raw, rt.cudaHostUnregister, arr.ctypes.data)
            return torch.from_numpy(arr)
    except Exception:  # noqa: BLE001 - no cudart binding: the allocator's pinned memory
        pass
    return torch.zeros(1, int(n), dtype=torch.float32).pin_memory()


class HostPoint:
    """One host call of the step: group `names` computed from pinned `x` into pinned `y`, with
    the graph of the same matrices' GPU prefix rows (None when all are wholly on the host)."""

    def __init__(self, names: tuple, group: Any, x: torch.Tensor, y: torch.Tensor,
                 prefix: Any) -> None:
        self.names, self.group, self.x, self.y, self.prefix = names, group, x, y, prefix
        self.x_np, self.y_np = x.numpy(), y.numpy()
        self.nbytes = int(group.nbytes)
        self.event = None

    def compute(self) -> None:
        self.group.gemv(self.x_np, out=self.y_np)


class SegmentStep:
    """The captured step: graphs[i] precedes points[i]; graphs[-1] ends the step."""

    def __init__(self, graphs: list, points: list[HostPoint], event: Any = None) -> None:
        if len(graphs) != len(points) + 1:
            raise ValueError("a segment step has one graph more than host points")
        self.graphs, self.points = graphs, points
        self._event = event or torch.cuda.Event     # tests replay fake graphs on the CPU

    def replay(self, prof: Any = None) -> None:
        """Run the step on the current stream; returns when the last segment is queued.
        prof (host_profile.HostProfile): `replay` = graph launches (+ event record), `x_wait`
        = waiting for the host's input, the host call as on the eager path; the last launch is
        in gpu_tail."""
        for g, p in zip(self.graphs, self.points):
            if prof is not None:
                t = prof.now()
            g.replay()
            ev = p.event
            if ev is None:
                ev = p.event = self._event()
            ev.record()
            if p.prefix is not None:
                p.prefix.replay()          # GPU rows run while the CPU computes the host rows
            if prof is not None:
                t = prof.lap("replay", t)
            ev.synchronize()
            if prof is not None:
                t = prof.lap("x_wait", t)
            p.compute()
            if prof is not None:
                prof.host_done(prof.host_call(p.names, p.nbytes, t))
        self.graphs[-1].replay()


class CudaBackend:
    """Capture primitives. capture=False is the warm-up: the same Recorder pass run eagerly
    (kernels compiled, host points computed after a sync) that also allocates, in order, the
    pinned buffers the capture pass then takes: no host registration inside a capture. Every
    segment graph shares one pool (the step allocates nothing)."""

    def __init__(self, device: torch.device, capture: bool = True,
                 buffers: list | None = None) -> None:
        self.capture = capture
        self.buffers = list(buffers or [])
        self.made: list[torch.Tensor] = []
        if capture:
            self.pool = torch.cuda.graph_pool_handle()

    def begin(self) -> Any:
        if not self.capture:
            return None
        g = torch.cuda.CUDAGraph()
        onetime.note()
        g.capture_begin(pool=self.pool)
        return g

    def end(self, g: Any) -> Any:
        if g is not None:
            g.capture_end()
        return g

    def buffer(self, n: int) -> torch.Tensor:
        if not self.capture:
            self.made.append(pinned(n))
            return self.made[-1]
        b = self.buffers.pop(0)
        if b.numel() != n:
            raise RuntimeError("the captured step differs from its warm-up (host buffer sizes)")
        return b

    def host_point(self, p: HostPoint) -> None:
        if not self.capture:               # warm-up: compute for real (nothing runs in capture)
            torch.cuda.current_stream().synchronize()
            p.compute()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A copy between pinned host memory and the device, captured into the open graph."""
        dst.copy_(src, non_blocking=True)


class Recorder:
    """Runs exe._step once with `exe._seg_rec = self`: GPUModel._linears hands each host call to
    `host_linears`, which closes the open segment, captures the prefix graph and opens the next
    segment with the copies back."""

    def __init__(self, exe: Any, backend: Any) -> None:
        self.exe, self.b = exe, backend
        self.graphs: list = []
        self.points: list[HostPoint] = []
        self.cur = None

    def run(self, st: Any, mode: str, head: bool, feed: bool) -> SegmentStep:
        exe = self.exe
        self.cur = self.b.begin()
        exe._seg_rec = self
        try:
            exe._step(st, mode, head, feed)
        except BaseException:
            if self.cur is not None:       # close the open capture: the original error surfaces
                try:
                    self.b.end(self.cur)
                except Exception:  # noqa: BLE001 - an invalidated capture; already failing
                    pass
            raise
        finally:
            exe._seg_rec = None
        self.graphs.append(self.b.end(self.cur))
        self.cur = None
        return SegmentStep(self.graphs, self.points, getattr(self.b, "event", None))

    def host_linears(self, x: torch.Tensor, pairs: list, host: list) -> None:
        exe, b = self.exe, self.b
        names = tuple(name for name, _ in host)
        G = exe._host_group(names)
        xb = b.buffer(x.numel())
        b.copy(xb, x.reshape(1, -1))            # D2H: the open segment's last node
        self.graphs.append(b.end(self.cur))
        self.cur = prefix = None
        pcie = getattr(exe, "pcie", {})        # host rows the GPU reads (pcie_rows)
        if any(name in exe.lin or name in pcie for name, _ in pairs):
            self.cur = b.begin()
            exe._gpu_linears(x, pairs)
            prefix = b.end(self.cur)
            self.cur = None
        p = HostPoint(names, G, xb, b.buffer(G.n_rows), prefix)
        self.points.append(p)
        b.host_point(p)
        self.cur = b.begin()
        for (name, out), (lo, hi) in zip(host, G.spans):
            b.copy(out.view(1, -1)[:, exe.hostc[name].row_start:], p.y[:, lo:hi])   # H2D


def capture(exe: Any, st: Any, mode: str, head: bool, feed: bool) -> SegmentStep:
    """The step's segment graphs on CUDA (cached by the caller in st.graphs): a warm-up pass of
    the recorder run eagerly on a side stream, then the capture pass on it; the status word and
    the token id are restored after each (the warm-up writes only the staging bank and the KV row
    at the position, both unseen, like GPUModel._graph's)."""
    saved, saved_tok = st.status.cpu(), exe.tok_id.cpu()
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream(exe.device)
    side.wait_stream(cur)
    warm = CudaBackend(exe.device, capture=False)
    with torch.cuda.stream(side):
        Recorder(exe, warm).run(st, mode, head, feed)
    cur.wait_stream(side)
    st.status.copy_(saved)
    exe.tok_id.copy_(saved_tok)
    torch.cuda.synchronize(exe.device)
    b = CudaBackend(exe.device, buffers=warm.made)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        seg = Recorder(exe, b).run(st, mode, head, feed)
    cur.wait_stream(side)
    st.status.copy_(saved)
    exe.tok_id.copy_(saved_tok)
    return seg


def step(exe: Any, st: Any, mode: str, head: bool, feed: bool) -> SegmentStep:
    """The cached SegmentStep of (mode, head, feed) for state st, captured on first use."""
    gen = getattr(exe, "pcie_gen", 0)       # a later set_pcie_share: a new split, new graphs
    key = ("host-segments", mode, head, feed) + ((gen,) if gen else ())
    seg = st.graphs.get(key)
    if seg is None:
        seg = st.graphs[key] = capture(exe, st, mode, head, feed)
    return seg
