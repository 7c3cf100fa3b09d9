"""Placement glue for the GPU executor (issue 5): the weights of a `tightfit.plan.Plan` in ONE
device arena, the host rows read in place from the read-only mmap.

`Placed(plan, model_file, device)`:
1. checks that the plan was made for this very file (every tensor's type, shape, size and file
   offset) and that it leaves no tensor the executor reads excluded;
2. runs `check_exact_cover` (every row in exactly one place) -- before anything is allocated, so a
   bad placement is refused before the first token;
3. allocates `Arena(plan, device)` (the only device allocation of the weights, the KV cache in
   the plan's format, the recurrent state and the executor's step buffers) and `upload`s every
   GPU segment: a reader pool preads the file into a pinned staging ring, H2D copies on their own
   stream (page cache released behind it; rich progress bar);
4. maps the file read-only once more for the host rows: `HostRows` per split matrix (its suffix
   rows, zero-copy, computed by tightfit.kernels.cpu_gemv) and the host embedding table (one row
   decoded on the CPU per token).

MTP (nextn) blocks are excluded by the plan in single-token mode and never touched; a plan made
with MTP (`PlanOptions.include_mtp`, `plan_for(..., mtp=True)`) holds them in the arena.

`PlacedBatch` is the batched forward (tightfit.model.batch.BatchForward) with each split matrix
computed as GPU prefix + CPU suffix (only activations cross PCIe); `ArenaState` is a GPUState
whose KV cache, recurrent banks and status word are views of the arena's regions.

Plan helpers (wrappers, no change to tightfit.plan): `plan_for(path, ctx, vram)` (parse the
budget, `auto` = what the device reports free, plan, require_fit), and `replace_host_rows(plan,
host_rows)`, a plan with a placement of chosen host suffixes (tests and benchmarks).

`HostProfile` (TIGHTFIT_HOST_PROFILE=1, tightfit.model.host_profile): per-token wall-time breakdown
of the placed decode step.

`passive_host_threads()` (called by Placed when the plan has host rows): numba's OpenMP pool waits
passively between host calls unless the user chose (OMP_WAIT_POLICY / NUMBA_THREADING_LAYER set;
TIGHTFIT_HOST_PASSIVE=0 turns it off). It must run before anything starts numba's threading layer.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
import weakref
from typing import Any, Mapping

import numpy as np
import torch

from tightfit.errors import UserError
from tightfit.plan.arena import Arena, UploadReport, host_view, open_readonly, upload
from tightfit.plan.placement import GPU, HOST, build_placement
from tightfit.plan.rowsplit import PlacementError, check_exact_cover
from tightfit.runtime.gpu_state import GPUState


# ---- plans -----------------------------------------------------------------------------------
def device_free_bytes(device: str | torch.device = "cuda") -> int:
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise UserError("--vram auto needs a CUDA device (give a size, e.g. --vram 16GiB)")
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


def vram_bytes(vram: int | str, device: str | torch.device = "cuda") -> int:
    """'auto' (the device's free memory), a size ('16GiB', '7.6GB') or a byte count."""
    if isinstance(vram, (int, np.integer)):
        return int(vram)
    if str(vram).strip().lower() == "auto":
        return device_free_bytes(device)
    from tightfit.plan.budget import parse_size
    return parse_size(str(vram))


def plan_for(path: str | os.PathLike, ctx: int, vram: int | str, *, kv_type: str = "f16",
             host_embd: str = "auto", device: str | torch.device = "cuda",
             reserve: int | None = None, prefill_chunk: int = 512, split: bool = True,
             check: bool = True, mtp: bool = False, batch: int = 1):
    """The plan of `path` at `ctx` within `vram` bytes; PlanError if it cannot fit (the message
    says what would), unless check=False. `mtp`: the MTP drafter's block, KV cache and scratch are
    in the plan too, and the whole model must then fit on the GPU (without it: MTP excluded).
    `batch` > 1: speculative verify blocks of up to that many tokens (the captured block's
    buffers are a region of the arena: the `verify` line)."""
    from tightfit.plan.budget import PlanOptions, plan_model, require_fit
    from tightfit.plan.placement import inventory_from_gguf
    inv = inventory_from_gguf(path)
    plan = plan_model(inv, PlanOptions(ctx=int(ctx), available=vram_bytes(vram, device),
                                       kv_type=kv_type, host_embd=host_embd, split=split,
                                       prefill_chunk=prefill_chunk, reserve=reserve,
                                       include_mtp=mtp, batch=int(batch)))
    return require_fit(plan) if check else plan


def replace_host_rows(plan: Any, host_rows: Mapping[str, int], host_embd: bool | None = None):
    """A copy of `plan` whose placement keeps `host_rows[name]` suffix rows of each named matrix
    on the host (and the whole embedding if host_embd). Exact cover is NOT checked here (that is
    the loader's job, so tests can build faulty placements)."""
    inv, o = plan.inventory, plan.options
    he = plan.host_embd if host_embd is None else bool(host_embd)
    rows = dict(host_rows)
    if he:
        rows["token_embd.weight"] = inv.tensors["token_embd.weight"].n_rows
    excluded = [t.name for t in inv.excluded(o.include_mtp)]
    placement = build_placement(inv.needed(o.include_mtp), rows, excluded)
    return dataclasses.replace(plan, placement=placement, host_embd=he)


# ---- host rows -------------------------------------------------------------------------------
def passive_host_threads() -> bool:
    """Make numba's host thread pool (cpu_gemv) wait passively between calls, unless the user
    chose (OMP_WAIT_POLICY / NUMBA_THREADING_LAYER[_PRIORITY] set) or TIGHTFIT_HOST_PASSIVE=0.

    Why: between two of a token's ~100 host calls the launching thread runs the GPU work; spinning
    OpenMP workers (libgomp's default is to spin a while) compete with it for the cores. On the
    device, the 8 GiB 27B plan went 347 -> 308 ms/token with OMP_WAIT_POLICY=PASSIVE and the omp
    layer. It only works before numba starts its threading layer (libgomp reads the variable
    when numba loads it, at the first parallel call: nothing in tightfit makes one before a
    Placed with host rows exists, as cpu_gemv does not at import); the omp layer is preferred
    (falling back in numba's usual order) since only it honours the policy. Returns True when
    it set something."""
    if os.environ.get("TIGHTFIT_HOST_PASSIVE", "1").strip() == "0":
        return False
    import numba
    from numba.np.ufunc import parallel
    if getattr(parallel, "_is_initialized", False):
        return False                   # too late: the pool runs with what it was started with
    done = False
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        done = True
    if "NUMBA_THREADING_LAYER" not in os.environ and \
            "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ and \
            str(numba.config.THREADING_LAYER).lower() == "default":
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
        done = True
    return done


class HostRows:
    """Rows [row_start, row_end) of a matrix, read in place from the mmap; y = x . W_suffix^T."""

    def __init__(self, name: str, spec: Any, w: np.ndarray, row_start: int, row_end: int):
        self.name = name
        self.qtype = int(spec.qtype)
        self.w = w
        self.row_start, self.row_end = int(row_start), int(row_end)
        self.n_rows = self.row_end - self.row_start
        self.n_in = int(spec.ne[0])
        self.nbytes = int(w.nbytes)

    def gemv(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        from tightfit.kernels.cpu_gemv import gemv
        return gemv(self.w, self.qtype, x, out=out)

    def tail(self, n: int) -> "HostRows":
        """These rows less the first n (self when n = 0): a view, nothing copied."""
        if n == 0:
            return self
        t = copy.copy(self)
        t.w = self.w[n:]
        t.row_start = self.row_start + n
        t.n_rows, t.nbytes = self.n_rows - n, int(t.w.nbytes)
        return t


class HostGroup:
    """The host suffixes of several matrices that read the same x (issue 5), computed in ONE
    parallel CPU call (tightfit.kernels.cpu_gemv.Group: x quantized once, rows of all of them
    balanced by bytes over the threads); y[:, spans[i][0]:spans[i][1]] is rows[i]'s output."""

    def __init__(self, rows: "list[HostRows]"):
        from tightfit.kernels.cpu_gemv import Group
        self.rows = list(rows)
        self.group = Group([(h.w, h.qtype) for h in self.rows])
        self.spans = self.group.spans
        self.n_rows = self.group.n_out
        self.nbytes = sum(h.nbytes for h in self.rows)

    def gemv(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return self.group.gemv(x, out=out)


class PinnedIO:
    """Pinned host buffers for activation vectors crossing PCIe, each guarded by the event of
    its last asynchronous copy (reused only after that copy finished)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, tuple[torch.Tensor, Any]] = {}

    def get(self, key: tuple, shape: tuple[int, ...]) -> torch.Tensor:
        ent = self._bufs.get(key)
        if ent is None or tuple(ent[0].shape) != tuple(shape):
            buf = torch.empty(shape, dtype=torch.float32, pin_memory=True)
            self._bufs[key] = (buf, None)
            return buf
        buf, ev = ent
        if ev is not None:
            ev.synchronize()
        return buf

    def recorded(self, key: tuple) -> Any:
        """Record the buffer's copy; one event per buffer, re-recorded (get() waited on it)."""
        buf, ev = self._bufs[key]
        if ev is None:
            ev = torch.cuda.Event()
            self._bufs[key] = (buf, ev)
        ev.record()
        return ev


def to_host_async(x: torch.Tensor, io: PinnedIO | None, key: tuple):
    """Start copying x (fp32) to the host; returns (numpy array, event or None). On the CPU the
    array is x itself (no copy)."""
    if not x.is_cuda:
        return x.detach().to(torch.float32).contiguous().numpy(), None
    buf = io.get(key, tuple(x.shape))
    buf.copy_(x, non_blocking=True)
    return buf.numpy(), io.recorded(key)


# the per-token host profile lives in tightfit.model.host_profile (re-exported here)
from tightfit.model.host_profile import HOST_PROFILE, HostProfile  # noqa: E402,F401


# ---- the placed weights ----------------------------------------------------------------------
def _file_tensors(model_file: Any) -> Mapping[str, Any]:
    return getattr(model_file, "gguf", model_file).tensors


def check_plan_matches_file(plan: Any, model_file: Any, needed: list[str]) -> None:
    """The plan's inventory must describe this file exactly (a plan made for another file or a
    preset would upload the wrong bytes); every tensor the executor reads must be placed."""
    inv = plan.inventory
    if inv.path is None:
        raise UserError(f"the plan was made for {inv.source}, which has no weights; plan the "
                        "GGUF file itself")
    mpath = getattr(model_file, "path", None)
    if mpath is not None and os.path.realpath(mpath) != os.path.realpath(inv.path):
        raise UserError(f"the plan was made for {inv.path}, not {mpath}")
    ft = _file_tensors(model_file)
    for name, t in inv.tensors.items():
        f = ft.get(name)
        if f is None or (int(f.qtype), tuple(int(d) for d in f.ne), int(f.nbytes), int(f.offset)) \
                != (t.qtype, tuple(t.ne), t.nbytes, t.offset):
            raise UserError(f"the plan's tensor {name} does not match the file {inv.path}")
    excluded = set(plan.placement.excluded)
    for name in needed:
        if name in excluded or name not in plan.placement.segments:
            raise PlacementError(f"{name} is read by the executor but the placement leaves it out")


class Placed:
    def __init__(self, plan: Any, model_file: Any, device: str | torch.device, needed: list[str],
                 progress: bool | None = None):
        self.plan = plan
        self.placement = p = plan.placement
        inv = plan.inventory
        self.tensors = inv.tensors
        check_plan_matches_file(plan, model_file, needed)
        check_exact_cover(p, inv.tensors, int(plan.arena_bytes))     # before any allocation
        self.device = torch.device(device)
        self.arena = Arena(plan, self.device)
        if progress is None:
            progress = sys.stderr.isatty()
        self.upload: UploadReport = upload(inv, p, self.arena, progress=bool(progress))
        self.mm = open_readonly(inv.path)
        if p.host_segments() or self.embedding_on_host():
            passive_host_threads()     # before the first cpu_gemv call starts numba's pool
        self.host: dict[str, HostRows] = {}
        # host rows are read in place from the mapping (session 8: a copy in anonymous huge-page
        # memory decoded no faster on the device, 6.08 vs 6.93 tok/s at 8 GiB)
        for s in p.host_segments():
            t = inv.tensors[s.tensor]
            w = host_view(self.mm, t, s)
            self.host[s.tensor] = HostRows(s.tensor, t, w, s.row_start, s.row_end)
        self._state_ref: Any = None
        self.extra_states = 0          # states allocated outside the arena (more than one live)

    # -- weights
    def gpu_rows(self, name: str) -> int:
        return sum(s.row_end - s.row_start for s in self.placement.segments[name] if s.where == GPU)

    def gpu_raw(self, name: str) -> torch.Tensor | None:
        """The GPU prefix of `name` (raw bytes, a view of the arena), None if wholly on the host."""
        return self.arena.weight(name) if self.gpu_rows(name) else None

    def vector(self, name: str, info: Any) -> torch.Tensor:
        """A 1-D (or conv) tensor as fp32 in numpy shape: a view of the arena for F32, else
        decoded once (a few KB)."""
        shape = tuple(int(s) for s in info.numpy_shape)
        segs = self.placement.segments[name]
        if int(info.qtype) == 0 and all(s.where == GPU for s in segs):
            return self.arena.weight(name).view(torch.float32).view(shape)
        from tightfit.model.weights import dequantize_tensor
        return dequantize_tensor(info, torch.float32).contiguous().to(self.device)

    def embedding_on_host(self) -> bool:
        return any(s.where == HOST for s in self.placement.segments["token_embd.weight"])

    def embed_rows(self, ids) -> np.ndarray:
        """fp32 (n, E) rows of token_embd decoded on the CPU from the mmap (never the table)."""
        from tightfit.plan.arena import embed_tokens
        return embed_tokens(self.mm, self.tensors["token_embd.weight"], ids)

    @property
    def gpu_weight_bytes(self) -> int:
        return self.placement.gpu_bytes

    @property
    def host_weight_bytes(self) -> int:
        return self.placement.host_bytes

    # -- state
    def new_state(self, config: Any, max_ctx: int, kv_type: str | None = None) -> GPUState:
        """The arena's KV/recurrent regions as a GPUState (KV cache in the plan's format:
        fp16 or the quantized `kv_type`); while that state is alive a second one is allocated
        outside the arena (beyond the plan; counted in `extra_states`)."""
        old = self._state_ref() if self._state_ref is not None else None
        if old is not None:
            self.extra_states += 1
            return GPUState(config, max_ctx, device=self.device, kv_type=kv_type)
        st = ArenaState(config, max_ctx, self.arena, kv_type)
        self._state_ref = weakref.ref(st)
        return st

    def close(self) -> None:
        reg = getattr(self, "pcie_reg", None)      # host pages the GPU reads (pcie_rows)
        if reg is not None:
            reg.close()                            # before the mapping goes
        self.host.clear()
        try:
            self.mm.close()
        except BufferError:        # a view is still exported; the mapping goes with it
            pass


class ArenaState(GPUState):
    """GPUState over the arena: k, v from region kv_cache (fp16 [n_attn, max_ctx, Hkv, D], or
    for a quantized `kv_type` byte caches [n_attn, max_ctx, Hkv, row_bytes] of K's and V's
    formats, K's first); conv then ssm (both banks) from the span starting at
    recurrent_state.bank0; the status word at the start of workspace (plan/buffers.py puts
    `status` first)."""

    def __init__(self, config: Any, max_ctx: int, arena: Arena,   # noqa: D107 - no super(): it allocates
                 kv_type: str | None = None):
        from tightfit.runtime.state import quant_kv_type
        c = config
        self.config = config
        self.kv_type = quant_kv_type(kv_type, c)
        self.max_ctx = int(max_ctx)
        self.device = arena.device
        self.rec_slot = {il: i for i, il in enumerate(c.recurrent_ids)}
        self.attn_slot = {il: i for i, il in enumerate(c.attention_ids)}
        n_attn, n_rec = max(len(self.attn_slot), 1), max(len(self.rec_slot), 1)
        kv = arena.region("kv_cache")
        if self.kv_type:
            from tightfit.kvquant.formats import get_format, split_kv_type
            self.kv_dtype = torch.uint8
            rows = [get_format(f).row_bytes(c.head_dim) for f in split_kv_type(self.kv_type)]
        else:
            rows = [2 * c.head_dim, 2 * c.head_dim]
        n_k, n_v = (n_attn * self.max_ctx * c.n_head_kv * r for r in rows)
        if n_k + n_v > kv.numel():
            raise UserError(f"max_ctx {max_ctx} exceeds the plan's KV cache "
                            f"({arena.plan.options.ctx} tokens of {arena.plan.options.kv_type})")
        if self.kv_type:
            self.k = kv[:n_k].view(n_attn, self.max_ctx, c.n_head_kv, rows[0])
            self.v = kv[n_k:n_k + n_v].view(n_attn, self.max_ctx, c.n_head_kv, rows[1])
        else:
            kvh = kv[:n_k + n_v].view(torch.float16)
            shape = (n_attn, self.max_ctx, c.n_head_kv, c.head_dim)
            self.k, self.v = kvh[:n_k // 2].view(shape), kvh[n_k // 2:].view(shape)
        off, _ = arena.regions["recurrent_state.bank0"]
        off1, n1 = arena.regions["recurrent_state.bank1"]
        n_conv = 2 * n_rec * (c.ssm_conv_kernel - 1) * c.conv_dim
        n_ssm = 2 * n_rec * c.ssm_v_heads * c.ssm_state * c.ssm_state
        if off + 4 * (n_conv + n_ssm) > off1 + n1:
            raise UserError("the plan's recurrent-state regions are smaller than the state")
        rec = arena.buffer[off:off + 4 * (n_conv + n_ssm)].view(torch.float32)
        self.conv = rec[:n_conv].view(2, n_rec, c.ssm_conv_kernel - 1, c.conv_dim)
        self.ssm = rec[n_conv:].view(2, n_rec, c.ssm_v_heads, c.ssm_state, c.ssm_state)
        woff, wn = arena.regions["workspace"]
        if wn < 16:
            raise UserError("the plan's workspace region cannot hold the status word")
        self.status = arena.buffer[woff:woff + 16].view(torch.int32)
        for t in (self.k, self.v, self.conv, self.ssm, self.status):
            t.zero_()
        self.pos = 0
        self._kv_high = 0
        self._recurrent_valid = True
        self.graphs: dict = {}


# ---- batched forward with split matrices -----------------------------------------------------
def placed_batch(model: Any, chunk: int | None = None):
    from tightfit.model.batch import BatchForward

    class PlacedBatch(BatchForward):
        """BatchForward whose split matrices run as GPU prefix + CPU suffix, overlapped: x goes
        to the host first, the GPU part is launched, then the CPU computes the suffix rows."""

        def __init__(self, m: Any, chunk: int | None = None):
            super().__init__(m, chunk=chunk)
            self._io = PinnedIO() if m.device.type == "cuda" else None
            self._groups: dict = {}        # host names -> HostGroup (one CPU call each)

        def _streams(self, x: torch.Tensor) -> bool:
            """Whether this block's host rows go to the device through the host-row ring
            (BatchForward.lin_split, priced by the plan's ring line) instead of the CPU: blocks of
            >= ring_min_m tokens, unless TIGHTFIT_PLACED_RING=0. On by default since measured on
            the device (session 12, bench/placed_prefill.py at 8 GiB: a 512-token prompt 30.1 s
            on the CPU path, the ring 259.6 tok/s at 2,048 tokens; the CPU's cost grows with the
            block's rows, the ring's does not)."""
            return x.shape[0] >= self.ring_min_m and \
                os.environ.get("TIGHTFIT_PLACED_RING", "1").strip() not in ("0", "off", "no")

        def lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
            H = self.m.hostw.get(name)
            if H is None:
                return super().lin(x, name)
            if self._streams(x):
                return self.lin_split(x, name, H)
            xh, ev = to_host_async(x.float().contiguous(), self._io, ("bx", name))
            y_gpu = super().lin(x, name) if name in self.m.lin else None
            if ev is not None:
                ev.synchronize()
            y_host = torch.from_numpy(H.gemv(xh)).to(x.device)
            return y_host if y_gpu is None else torch.cat([y_gpu, y_host], 1)

        def lin_many(self, x: torch.Tensor, names) -> list:
            """Matrices that read the same x: x crosses to the host once, every device part is
            launched, then ONE CPU call (HostGroup, rows of all of them balanced over the threads;
            each row bit-identical to its matrix's own call) computes their host rows while the
            device parts run, and one copy brings them back (the step does the same:
            executor._linears). A speculative verify block or prefill chunk made one host call
            and one x copy per matrix before (session 11: 3.4 plain steps per k = 1 round)."""
            host = tuple(n for n in names if n in self.m.hostw)
            if len(host) < 2 or self._streams(x):
                return [self.lin(x, n) for n in names]
            xh, ev = to_host_async(x.float().contiguous(), self._io, ("bx", host))
            dev = {n: (super(PlacedBatch, self).lin(x, n) if n in self.m.lin else None)
                   for n in names}
            if ev is not None:
                ev.synchronize()
            G = self._groups.get(host)
            if G is None:
                G = self._groups[host] = HostGroup([self.m.hostw[n] for n in host])
            yh = torch.from_numpy(G.gemv(xh).reshape(x.shape[0], -1)).to(x.device)
            spans = dict(zip(host, G.spans))
            out = []
            for n in names:
                if n not in spans:
                    out.append(dev[n])
                    continue
                a, b = spans[n]
                out.append(yh[:, a:b] if dev[n] is None else torch.cat([dev[n], yh[:, a:b]], 1))
            return out

    return PlacedBatch(model, chunk=chunk)
