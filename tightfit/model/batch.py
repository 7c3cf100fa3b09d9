"""Batched forward of the GPU executor: a block of n > 1 tokens through all blocks at once
(prefill, speculative verify), on the executor's raw GGUF weights and its GPUState.

`BatchForward(model)` wraps a tightfit.model.executor.GPUModel (its `lin` matrices, `vec` 1-D
tensors, RoPE tables) and runs, per chunk of at most `chunk` tokens (default 1,024; 512-2,048 is
the useful range):

* matrices: blocks of M <= 16 tokens (GEMV_MAX_M; speculative verify) go through the GEMV
  dispatcher tightfit.kernels.gemv with N = M columns (one pass over W, ~1.0-1.3x the one-token
  cost on the v2 formats); larger ones through tightfit.kernels.gemm_q (fused decode + bf16
  tensor-core GEMM for small M, decode into a bf16 row-chunk scratch + cuBLAS for large M);
  on the CPU the same code decodes to fp32 with torch ops (gemm_q_torch);
* Gated DeltaNet: tightfit.kernels.gdn_chunk (causal conv over the block continuing from the
  stored rows; chunked gated delta rule from the active bank's state);
* attention: tightfit.kernels.attn_prefill (q/k norm + RoPE, K/V rows p0..p0+n-1 written to the
  cache, quantized on write for a quantized kv_type), then `prefill_attention`: on CUDA the
  bounded Triton flash kernel (attn_prefill_flash: the f16 cache read in place, a quantized cache
  decoded tile by tile into a fixed fp16 scratch) after a prefix and for quantized caches, torch
  flash SDPA for an f16 cache's first chunk; the CPU keeps SDPA / kvquant attention_quant
  (TIGHTFIT_PREFILL_ATTN=sdpa|flash overrides);
* norms, SwiGLU, gates: torch ops (the norms take their mean in float64 like the reference).

Row-split matrices (placement left rows on the host): `lin_split` runs the device prefix with
gemm_q and, for blocks of >= RING_MIN_M (32) tokens, streams the host suffix rows through a
double-buffered pinned ring (`HostRowRing`, 2 x 32 MiB pinned + 2 x 32 MiB device, `ring_line`)
into the same GEMM; smaller blocks compute the host rows on the CPU. (placed.PlacedBatch still
overrides `lin` with its CPU-only path; the ring is live once it defers to BatchForward.lin.)
Without an explicit chunk, a placed model's chunk is its plan's `prefill_chunk`.

State protocol (tightfit/runtime/gpu_state.py): a chunk reads the active bank (status[0], read
once per chunk on the host) and writes the staging bank and KV rows beyond the committed length;
only when the chunk's hidden state (and logits) are finite does it flip the bank and advance the
position (status[2] and the host mirror). A non-finite chunk raises NonFiniteError with the state
as before that chunk (earlier chunks of the same call stay committed).

State-only rule: with logits='last' / 'none' the final norm and LM head run for the last token
only (or not at all) and the last block's FFN runs on one row, as in ReferenceModel.forward.

`forward_block(ids, state, keep_states=True)` (speculative verify) runs one block without
committing and returns a `Block`: logits of every row, the normed final hidden rows (what an MTP
head reads), and `commit(j)`, which stages the recurrent state after block token j-1 (rebuilt from
the chunked recurrence's kept K/U/decays, gdn_chunk.KeptStates: no re-run) and commits j
positions; the KV rows of the rejected tokens are abandoned. Blocks of <= 16 tokens on a GPUModel
without host rows, placement or a quantized KV cache take tightfit.model.verify_graph instead (a
CUDA graph per (M, attention mode): planned buffers, device position, the GDN state after a
partial accept replayed from per-token k, delta and decay); TIGHTFIT_VERIFY_GRAPH=0 keeps them here.

Workspace (device bytes besides weights and state) for a chunk of n tokens after `depth` cached
ones: `workspace_bytes(config, n, depth, kv_type=)`, which IS the planner's prefill scratch line
(tightfit.plan.budget.prefill_workspace): the residual rows, then the largest block (GEMM
temporaries with gemm_q's 64 MiB dequant chunk, the chunked GDN temporaries of the larger of
fla-core and the torch path, attention: the bounded flash kernel's output + for quantized caches
2 fp16 tiles of attn_prefill_flash.TILE_ROWS rows and the running state; nothing grows with
depth) and one logits row.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.kernels import attn_prefill as AP
from tightfit.kernels import gdn_chunk as GC
from tightfit.kernels.gemm_q import DEFAULT_SCRATCH, gemm_q
from tightfit.kernels.gemm_q_torch import dequant_rows
from tightfit.runtime.state import NonFiniteError, StateError

DEFAULT_PREFILL_CHUNK = int(os.environ.get("TIGHTFIT_PREFILL_CHUNK", "1024"))
# blocks of at most GEMV_MAX_M tokens (speculative verify, short prompts) run every matrix through
# the GEMV dispatcher (tightfit.kernels.gemv: one pass over W for N = 1..16 columns) instead of
# gemm_q; 0 disables it. On the CPU only when BatchForward.gemv_on_cpu is set (interpreter tests).
GEMV_MAX_M = min(16, int(os.environ.get("TIGHTFIT_BATCH_GEMV_MAX_M", "16")))
RING_SLOT_BYTES = int(os.environ.get("TIGHTFIT_RING_SLOT_BYTES", str(32 << 20)))
RING_MIN_M = int(os.environ.get("TIGHTFIT_RING_MIN_M", "32"))


class HostRowRing:
    """Host rows of split matrices streamed to the device for a block of tokens (issue 8 item 4).

    Two pinned host slots and two device staging slots of `slot_bytes` each. A matrix's host
    suffix (HostRows: raw GGUF rows read in place from the mmap) goes over in pieces of
    floor(slot_bytes / row_bytes) whole rows; piece i uses slot i % 2:

      host:  wait until slot s's previous H2D copy is done -> memcpy mmap rows into pinned[s]
      copy stream: wait until the GEMM that read staging[s] is done -> staging[s] <- pinned[s]
      compute stream: wait for that copy -> gemm_q(x, staging[s]) into out[:, piece columns]

    so the host memcpy and the PCIe copy of piece i+1 overlap the GEMM of piece i (launches are
    asynchronous; the host blocks only on the copy two pieces back). One prefill chunk streams
    every host row once: PCIe time host_bytes / bandwidth per chunk, amortized over its tokens.
    On the CPU (tests) the same piece loop runs synchronously on plain tensors.

    Memory (the plan's prefill line, `ring_line`): 2 * slot_bytes on the device and 2 * slot_bytes
    of pinned host memory, besides gemm_q's dequant scratch."""

    def __init__(self, device: torch.device, slot_bytes: int = RING_SLOT_BYTES,
                 scratch_bytes: int = DEFAULT_SCRATCH):
        self.device = torch.device(device)
        self.slot_bytes = int(slot_bytes)
        self.scratch_bytes = int(scratch_bytes)
        cuda = self.device.type == "cuda"
        self.host = [torch.empty(self.slot_bytes, dtype=torch.uint8, pin_memory=cuda)
                     for _ in range(2)]
        self.dev = ([torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
                     for _ in range(2)] if cuda else self.host)
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.copied: list = [None, None]      # event: H2D of the slot's last piece finished
        self.used: list = [None, None]        # event: the GEMM that read the slot finished
        self.pieces = 0                       # counters (tests, bench)
        self.bytes = 0

    def rows_per_piece(self, row_bytes: int) -> int:
        n = self.slot_bytes // int(row_bytes)
        if n < 1:
            raise ValueError(f"ring slot of {self.slot_bytes} bytes is smaller than one row "
                             f"({row_bytes} bytes)")
        return n

    def matmul(self, x: torch.Tensor, rows: np.ndarray, qtype: int, n_in: int,
               out: torch.Tensor) -> torch.Tensor:
        """out [M, n_rows] = x . W_rows^T, W_rows = rows [n_rows, row_bytes] uint8 on the host."""
        from tightfit.kernels.gemm_q import gemm_q
        n_rows, rb = rows.shape
        per = self.rows_per_piece(rb)
        cuda = self.stream is not None
        cur = torch.cuda.current_stream(self.device) if cuda else None
        for i, r0 in enumerate(range(0, n_rows, per)):
            r1 = min(n_rows, r0 + per)
            s = i % 2
            nb = (r1 - r0) * rb
            if self.copied[s] is not None:
                self.copied[s].synchronize()          # pinned[s] is no longer being read
            np.copyto(self.host[s][:nb].numpy(), np.asarray(rows[r0:r1]).reshape(-1))
            if cuda:
                with torch.cuda.stream(self.stream):
                    if self.used[s] is not None:
                        self.stream.wait_event(self.used[s])
                    self.dev[s][:nb].copy_(self.host[s][:nb], non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(self.stream)
                self.copied[s] = ev
                cur.wait_event(ev)
            gemm_q(x, self.dev[s][:nb], qtype, r1 - r0, n_in, out=out[:, r0:r1],
                   scratch_bytes=self.scratch_bytes)
            if cuda:
                ev = torch.cuda.Event()
                ev.record(cur)
                self.used[s] = ev
            self.pieces += 1
            self.bytes += nb
        return out


def ring_line(slot_bytes: int = RING_SLOT_BYTES) -> dict[str, int]:
    """What HostRowRing adds to the plan's prefill line (bytes)."""
    return {"ring_device": 2 * int(slot_bytes), "ring_pinned_host": 2 * int(slot_bytes)}


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w


class Block:
    """A verified block (speculative decoding): rows of logits, normed hidden rows, commit(j)."""

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor, commit_fn: Callable[[int], None],
                 argmaxes: list[int] | None = None):
        self._am = argmaxes        # taken on the device with the block (verify_graph), if given
        self.logits = logits
        self.hidden = hidden
        self.n_rows = logits.shape[0]
        self._commit = commit_fn
        self.committed = False

    def row(self, i: int) -> np.ndarray:
        return self.logits[i].detach().float().cpu().numpy()

    def argmaxes(self) -> list[int]:
        """Each row's argmax (first index of the max, as np.argmax), taken where the logits are:
        M integers cross to the host instead of M x n_vocab floats (verify_profile, session 7:
        2.0 ms of a 20.9 ms round at M = 5 went to copying rows and taking argmaxes on the host).
        The captured verify block takes them inside its graph and hands them over with its one
        read (no launch, no sync here)."""
        if self._am is not None:
            return list(self._am)
        return [int(i) for i in torch.argmax(self.logits.detach().float(), dim=-1).tolist()]

    def commit(self, n: int) -> None:
        if self.committed:
            raise StateError("this block was already committed")
        if not 1 <= n <= self.n_rows:
            raise ValueError(f"commit({n}) outside 1..{self.n_rows}")
        self._commit(n)
        self.committed = True


class BatchForward:
    gemv_max_m = GEMV_MAX_M      # blocks of M <= this (<= 16) tokens: every matrix through gemv
    gemv_on_cpu = False          # tests: the same route on the CPU (needs TRITON_INTERPRET=1)
    use_verify_graph: bool | None = None   # None: TIGHTFIT_VERIFY_GRAPH (auto = CUDA only)

    def __init__(self, model: Any, chunk: int | None = None, gdn_chunk: int = GC.DEFAULT_CHUNK,
                 scratch_bytes: int = DEFAULT_SCRATCH):
        self.m = model
        self.c = model.config
        if chunk is None:          # the plan's priced prefill chunk, when the model was placed
            plan = getattr(getattr(model, "placed", None), "plan", None)
            chunk = getattr(getattr(plan, "options", None), "prefill_chunk", None)
        self.chunk = int(chunk or DEFAULT_PREFILL_CHUNK)
        self.ring: HostRowRing | None = None      # built on the first streamed host matrix
        self._vg = None                           # verify_graph.VerifyGraph, built on first use
        self.ring_min_m = RING_MIN_M
        self.gdn_chunk = int(gdn_chunk)
        self.scratch_bytes = int(scratch_bytes)
        info = model._embd_info
        n_rows = int(info.numpy_shape[0])
        self._embd_raw = np.asarray(info.raw(), dtype=np.uint8).reshape(n_rows, -1)
        self._embd_qtype = int(info.qtype)

    # ---- pieces -------------------------------------------------------------------------------
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """Raw rows gathered on the host (n * row_bytes), decoded where the model lives."""
        raw = torch.from_numpy(np.ascontiguousarray(self._embd_raw[np.asarray(ids, np.int64)]))
        raw = raw.to(self.m.device, non_blocking=False)
        return dequant_rows(raw, self._embd_qtype, self.c.n_embd)

    def lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        H = getattr(self.m, "hostw", {}).get(name)
        # placed.PlacedBatch still overrides lin with its CPU-only host rows and calls this one
        # for the GPU prefix: only an un-overridden lin owns the host rows (ring or CPU)
        if H is not None and type(self).lin is BatchForward.lin:
            return self.lin_split(x, name, H)
        return self.lin_gpu(x, self.m.lin[name])

    def lin_many(self, x: torch.Tensor, names: Sequence[str]) -> list[torch.Tensor]:
        """[x . W^T for each of `names`] (matrices that read the same x); placed.PlacedBatch
        overrides it to compute their host rows in one CPU call."""
        return [self.lin(x, n) for n in names]

    def lin_split(self, x: torch.Tensor, name: str, H: Any) -> torch.Tensor:
        """A matrix whose rows [H.row_start, H.row_end) live on the host (placed.HostRows). For
        M >= ring_min_m tokens the host rows stream through the HostRowRing and are multiplied
        where the GPU rows are (the GPU prefix first: it runs while the ring fills); for fewer
        tokens the CPU computes them (cpu_gemv) while the GPU prefix runs."""
        L = self.m.lin.get(name)
        M = x.shape[0]
        n_out = H.row_end
        if M >= self.ring_min_m:
            out = torch.empty((M, n_out), dtype=torch.float32, device=x.device)
            if L is not None:
                gemm_q(x, L.raw, L.qtype, L.n_out, L.n_in, out=out[:, :L.n_out],
                       scratch_bytes=self.scratch_bytes)
            if self.ring is None:
                self.ring = HostRowRing(x.device, scratch_bytes=self.scratch_bytes)
            self.ring.matmul(x, H.w, H.qtype, H.n_in, out[:, H.row_start:])
            return out
        xh = x.detach().to(torch.float32).contiguous().cpu().numpy()
        y_gpu = self.lin_gpu(x, L) if L is not None else None
        y_host = torch.from_numpy(np.ascontiguousarray(H.gemv(xh), np.float32)).to(x.device)
        return y_host if y_gpu is None else torch.cat([y_gpu, y_host], 1)

    def uses_gemv(self, x: torch.Tensor, L: Any) -> bool:
        """Whether lin_gpu sends this matrix to the GEMV dispatcher: blocks of M <= gemv_max_m
        (<= 16) tokens, a matrix with a GEMV kernel (Linear.kind quant/float), on CUDA (or on
        the CPU when gemv_on_cpu, for the interpreter tests)."""
        return (1 <= x.shape[0] <= min(16, self.gemv_max_m) and (x.is_cuda or self.gemv_on_cpu)
                and getattr(L, "kind", None) in ("quant", "float"))

    def lin_gpu(self, x: torch.Tensor, L: Any) -> torch.Tensor:
        """x [M, n_in] . W^T for the device rows of a matrix: the GEMV dispatcher for small
        blocks (one pass over W for all M columns; v2 int8 tensor cores for IQ4_XS/Q4_K/Q5_K at
        M >= 3, measured 1.0-1.3x its one-column time, v1 otherwise), gemm_q for larger ones."""
        if self.uses_gemv(x, L):
            from tightfit.kernels import gemv as gm
            if L.kind == "quant":            # CUDA C++ GEMV when it serves the type (gemv_route)
                from tightfit.kernels.gemv_route import gemv_cuda_direct
                y = gemv_cuda_direct(x, L.raw, L.qtype, L.n_out)
                if y is not None:
                    return y
            return gm.gemv(x.to(torch.float32).contiguous(), L.raw, L.qtype, L.n_out, L.n_in)
        return gemm_q(x, L.raw, L.qtype, L.n_out, L.n_in, scratch_bytes=self.scratch_bytes)

    def _gdn(self, il: int, xn: torch.Tensor, st: Any, a: int, caps: dict | None) -> torch.Tensor:
        c, p, v = self.c, f"blk.{il}.", self.m.vec
        n = xn.shape[0]
        Hk, Hv, S, K = c.ssm_k_heads, c.ssm_v_heads, c.ssm_state, c.ssm_conv_kernel
        slot = st.rec_slot[il]
        u, z, beta_raw, alpha = self.lin_many(xn, [p + "attn_qkv.weight", p + "attn_gate.weight",
                                                    p + "ssm_beta.weight", p + "ssm_alpha.weight"])
        y, hist = GC.causal_conv(u, st.conv[a, slot], v[p + "ssm_conv1d.weight"])
        q, k, vv, g, beta = GC.gdn_inputs(y, alpha, beta_raw, v[p + "ssm_dt.bias"], v[p + "ssm_a"],
                                          Hk, Hv, S, c.rms_eps)
        keep = caps is not None
        o, s_end, kept = GC.chunk_gdn(q, k, vv, g, beta, st.ssm[a, slot], chunk=self.gdn_chunk,
                                      keep=keep)
        if keep:
            caps[il] = (slot, hist, kept)
        else:
            st.conv[1 - a, slot].copy_(hist[-(K - 1):])
            st.ssm[1 - a, slot].copy_(s_end)
        on = _rmsnorm(o.to(torch.float32), v[p + "ssm_norm.weight"], c.rms_eps) \
            * F.silu(z.view(n, Hv, S))
        return self.lin(on.reshape(n, Hv * S), p + "ssm_out.weight")

    def _attention(self, il: int, xn: torch.Tensor, st: Any, p0: int) -> torch.Tensor:
        c, p, v = self.c, f"blk.{il}.", self.m.vec
        n = xn.shape[0]
        H, D = c.n_head, c.head_dim
        s = st.attn_slot[il]
        qg, k, vv = self.lin_many(xn, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        kvt = getattr(st, "kv_type", None)
        q = AP.qk_prep_block(qg, k, vv, v[p + "attn_q_norm.weight"], v[p + "attn_k_norm.weight"],
                             self.m.cos, self.m.sin, st.k[s], st.v[s], p0, c.rms_eps, kvt)
        # bounded flash kernel on CUDA (f16 cache in place / quantized cache tile by tile), torch
        # flash SDPA for an f16 cache's first chunk, torch paths on the CPU (prefill_attn_mode)
        o = AP.prefill_attention(q, st.k[s], st.v[s], p0, kvt)
        o = o * torch.sigmoid(qg.view(n, H, 2 * D)[..., D:])
        return self.lin(o.reshape(n, H * D), p + "attn_output.weight")

    def _ffn(self, il: int, h: torch.Tensor) -> torch.Tensor:
        p = f"blk.{il}."
        g, u = self.lin_many(h, [p + "ffn_gate.weight", p + "ffn_up.weight"])
        return self.lin(F.silu(g) * u, p + "ffn_down.weight")

    # ---- one chunk ----------------------------------------------------------------------------
    def _run(self, ids: Sequence[int], st: Any, logits: str, caps: dict | None,
             want_hidden: bool = False):
        """All blocks over ids at st.pos, writing the staging bank (or caps) and KV rows; no
        commit. Returns (logits [r, V] or None, normed hidden rows or None, active bank)."""
        c, v = self.c, self.m.vec
        eps = c.rms_eps
        a = int(st.status[0])
        p0 = st.pos
        x = self.embed(ids)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            xn = _rmsnorm(x, v[p + "attn_norm.weight"], eps)
            if c.is_recurrent(il):
                x = x + self._gdn(il, xn, st, a, caps)
            else:
                x = x + self._attention(il, xn, st, p0)
            if il == c.n_layer - 1 and logits not in ("all", "hidden"):
                if logits == "none":
                    break
                x = x[-1:]
            if il == c.n_layer - 1 and logits == "hidden" and x.shape[0] > 1:
                # the last row alone, as 'last' runs it (a 1-row FFN takes the GEMV path, the
                # others the GEMM): its logits are the plain prefill's
                x = torch.cat([self._ffn_res(il, x[:-1]), self._ffn_res(il, x[-1:])], 0)
                continue
            x = self._ffn_res(il, x)
        if logits == "none":
            if not bool(torch.isfinite(x).all()):
                raise NonFiniteError("non-finite values in the hidden state; the state was not "
                                     "advanced past the previous chunk")
            return None, None, a
        if logits == "hidden":          # every row's normed hidden, no logits (prefill_hidden)
            if not bool(torch.isfinite(x).all()):
                raise NonFiniteError("non-finite values in the hidden state; the state was not "
                                     "advanced past the previous chunk")
            w = v["output_norm.weight"]
            return None, (_rmsnorm(x, w, eps), _rmsnorm(x[-1:], w, eps)), a
        h = _rmsnorm(x, v["output_norm.weight"], eps)
        out = self.lin(h, "output.weight")
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(out).all())):
            raise NonFiniteError("non-finite values in the hidden state or the logits; the state "
                                 "was not advanced past the previous chunk")
        return out, (h if want_hidden else None), a

    def _ffn_res(self, il: int, x: torch.Tensor) -> torch.Tensor:
        v, eps = self.m.vec, self.c.rms_eps
        return x + self._ffn(il, _rmsnorm(x, v[f"blk.{il}.post_attention_norm.weight"], eps))

    @staticmethod
    def _commit(st: Any, a: int, n: int) -> None:
        st.status[0] = 1 - a
        st.status[2] += n
        st.advanced(n)

    # ---- public -------------------------------------------------------------------------------
    def forward(self, ids: Sequence[int], st: Any, logits: str = "all",
                progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Chunked prefill with ReferenceModel.forward's contract (ids validated by the caller)."""
        n = len(ids)
        V = self.c.n_vocab
        rows = []
        done = 0
        with torch.no_grad():
            for i in range(0, n, self.chunk):
                part = list(ids[i:i + self.chunk])
                last = i + self.chunk >= n
                mode = logits if (logits == "all" or last) else "none"
                out, _, a = self._run(part, st, mode, None)
                self._commit(st, a, len(part))
                if out is not None:
                    rows.append(out)
                done += len(part)
                if progress is not None:
                    progress(done, n)
        if logits == "none":
            return torch.empty(0, V, dtype=torch.float32, device=self.m.device)
        return torch.cat(rows, 0) if len(rows) > 1 else rows[0]

    def prefill_hidden(self, ids: Sequence[int], st: Any,
                       sink: Callable[[torch.Tensor, list[int]], None]) -> torch.Tensor:
        """The chunked prefill of `forward(ids, st, 'last')` (same chunks, same kernels: the same
        state and last logits) that also hands every chunk's normed hidden rows (output_norm(h),
        what the MTP head reads) to sink(rows [m, E], the chunk's ids) before the next chunk
        runs, so they are never all held at once. Returns the last token's logits [1, V]."""
        n = len(ids)
        out = None
        with torch.no_grad():
            for i in range(0, n, self.chunk):
                part = list(ids[i:i + self.chunk])
                _, (h, h_last), a = self._run(part, st, "hidden", None)
                self._commit(st, a, len(part))
                if i + self.chunk >= n:
                    out = self.lin(h_last, "output.weight")
                    if not bool(torch.isfinite(out).all()):
                        raise NonFiniteError("non-finite logits after the prompt")
                sink(h, part)
        return out

    def verify_graph(self, n: int, st: Any):
        """The captured verify block (tightfit.model.verify_graph) for n tokens on this state,
        or None (eager path): see that module for when it applies. Its buffers are sized for the
        largest block seen so far (growing drops the smaller one's graphs)."""
        from tightfit.model import verify_graph as VG
        use = self.use_verify_graph
        if use is None:
            use = VG.enabled_for(self.m.device)
        # a subclass (placed.PlacedBatch) computes host rows its own way: only without any
        if not use or (type(self) is not BatchForward and getattr(self.m, "hostw", None)) or \
                not VG.VerifyGraph.supports(self.m, st, n):
            return None
        if self._vg is None or self._vg.m_max < n:
            self._vg = None
            # a placed model carves the plan's region once, at the planned size
            self._vg = VG.VerifyGraph(self.m, VG.planned_tokens(self.m) or n)
        return self._vg

    def forward_block(self, ids: Sequence[int], st: Any, keep_states: bool = True) -> Block:
        """One block (a verify round) without committing; see the module docstring. Blocks of
        <= 16 tokens on a GPUModel without host rows or a quantized KV cache run as a captured
        graph (tightfit.model.verify_graph; eager on the CPU unless enabled)."""
        n = len(ids)
        vg = self.verify_graph(n, st)
        if vg is not None:      # checks the state's status words with its own read after the block
            return vg.run(list(ids), st)
        st.sync()
        K = self.c.ssm_conv_kernel
        caps: dict | None = {} if keep_states else None
        with torch.no_grad():
            out, h, a = self._run(list(ids), st, "all", caps, want_hidden=True)
        p0 = st.pos

        def commit(j: int) -> None:
            if st.pos != p0 or int(st.status[0]) != a:
                raise StateError("the state moved since this block was run")
            if caps is None:
                if j != n:
                    raise StateError("a block run with keep_states=False can only commit all "
                                     f"{n} tokens")
            else:
                with torch.no_grad():
                    for slot, hist, kept in caps.values():
                        st.conv[1 - a, slot].copy_(hist[j:j + K - 1])
                        st.ssm[1 - a, slot].copy_(kept.state_at(j - 1))
            self._commit(st, a, j)
        return Block(out, h, commit)


def workspace_bytes(config: Any, n: int, depth: int = 0, scratch_bytes: int = DEFAULT_SCRATCH,
                    gdn_chunk: int = GC.DEFAULT_CHUNK, kv_type: str | None = None,
                    gdn: str = "max") -> dict[str, int]:
    """Device bytes of one chunk of n tokens after `depth` cached ones besides weights and state:
    the planner's prefill scratch line itself (tightfit.plan.budget.prefill_workspace, ONE
    formula for both), with this module's GEMM scratch and GDN chunk; key 'total' is the line."""
    from tightfit.plan.budget import prefill_workspace
    from tightfit.kernels.attn_prefill_flash import TILE_ROWS
    return prefill_workspace(config, n, depth, kv_type=None if kv_type in (None, "f16") else kv_type,
                             scratch_bytes=scratch_bytes, gdn_chunk=gdn_chunk, attn_tile=TILE_ROWS,
                             gdn=gdn)
