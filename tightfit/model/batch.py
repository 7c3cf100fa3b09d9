"""Batched forward of the GPU executor: a block of n > 1 tokens through all blocks at once
(prefill, speculative verify), on the executor's raw GGUF weights and its GPUState.

`BatchForward(model)` wraps a tightfit.model.executor.GPUModel (its `lin` matrices, `vec` 1-D
tensors, RoPE tables) and runs, per chunk of at most `chunk` tokens (default 1,024; 512-2,048 is
the useful range):

* matrices: tightfit.kernels.gemm_q (fused decode + bf16 tensor-core GEMM for small M, decode
  into a bf16 row-chunk scratch + cuBLAS for large M; a single row goes to the executor's GEMV);
  on the CPU the same code decodes to fp32 with torch ops (gemm_q_torch);
* Gated DeltaNet: tightfit.kernels.gdn_chunk (causal conv over the block continuing from the
  stored rows; chunked gated delta rule from the active bank's state);
* attention: tightfit.kernels.attn_prefill (q/k norm + RoPE, K/V rows p0..p0+n-1 written to the
  cache, causal SDPA over the prefix and the block); with a quantized KV cache the rows are
  quantized on write and attention is kvquant.reference.attention_quant over the codes;
* norms, SwiGLU, gates: torch ops (the norms take their mean in float64 like the reference).

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
positions; the KV rows of the rejected tokens are abandoned.

Workspace (device bytes besides weights and state) for a chunk of n tokens, see
`workspace_bytes(config, n)`: activations ~ n * (3 E + 3 n_ff + 4 conv_dim + 3 value_dim
+ 6 H D + 4 kv_dim) * 4, the GEMM dequant scratch (gemm_q.DEFAULT_SCRATCH, 64 MiB), the chunked
GDN temporaries (gdn_chunk.workspace_bytes) and the attention's expanded K/V after a prefix
(attn_prefill.kv_expand_bytes).
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
GEMV_MAX_M = int(os.environ.get("TIGHTFIT_BATCH_GEMV_MAX_M", "1"))


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w


class Block:
    """A verified block (speculative decoding): rows of logits, normed hidden rows, commit(j)."""

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor, commit_fn: Callable[[int], None]):
        self.logits = logits
        self.hidden = hidden
        self.n_rows = logits.shape[0]
        self._commit = commit_fn
        self.committed = False

    def row(self, i: int) -> np.ndarray:
        return self.logits[i].detach().float().cpu().numpy()

    def commit(self, n: int) -> None:
        if self.committed:
            raise StateError("this block was already committed")
        if not 1 <= n <= self.n_rows:
            raise ValueError(f"commit({n}) outside 1..{self.n_rows}")
        self._commit(n)
        self.committed = True


class BatchForward:
    def __init__(self, model: Any, chunk: int | None = None, gdn_chunk: int = GC.DEFAULT_CHUNK,
                 scratch_bytes: int = DEFAULT_SCRATCH):
        self.m = model
        self.c = model.config
        self.chunk = int(chunk or DEFAULT_PREFILL_CHUNK)
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
        L = self.m.lin[name]
        if (x.shape[0] <= GEMV_MAX_M and x.is_cuda and L.kind in ("quant", "float")):
            from tightfit.kernels import gemv as gm
            return gm.gemv(x.contiguous(), L.raw, L.qtype, L.n_out, L.n_in)
        return gemm_q(x, L.raw, L.qtype, L.n_out, L.n_in, scratch_bytes=self.scratch_bytes)

    def _gdn(self, il: int, xn: torch.Tensor, st: Any, a: int, caps: dict | None) -> torch.Tensor:
        c, p, v = self.c, f"blk.{il}.", self.m.vec
        n = xn.shape[0]
        Hk, Hv, S, K = c.ssm_k_heads, c.ssm_v_heads, c.ssm_state, c.ssm_conv_kernel
        slot = st.rec_slot[il]
        u = self.lin(xn, p + "attn_qkv.weight")
        z = self.lin(xn, p + "attn_gate.weight")
        beta_raw = self.lin(xn, p + "ssm_beta.weight")
        alpha = self.lin(xn, p + "ssm_alpha.weight")
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
        qg = self.lin(xn, p + "attn_q.weight")
        k = self.lin(xn, p + "attn_k.weight")
        vv = self.lin(xn, p + "attn_v.weight")
        kvt = getattr(st, "kv_type", None)
        q = AP.qk_prep_block(qg, k, vv, v[p + "attn_q_norm.weight"], v[p + "attn_k_norm.weight"],
                             self.m.cos, self.m.sin, st.k[s], st.v[s], p0, c.rms_eps, kvt)
        if kvt:      # quantized cache: the torch twin of attn_decode_q (tiles of decoded codes)
            from tightfit.kvquant.reference import attention_quant
            o = attention_quant(q, st.k[s], st.v[s], p0, kvt)
        else:
            o = AP.attn_prefill(q, st.k[s], st.v[s], p0)
        o = o * torch.sigmoid(qg.view(n, H, 2 * D)[..., D:])
        return self.lin(o.reshape(n, H * D), p + "attn_output.weight")

    def _ffn(self, il: int, h: torch.Tensor) -> torch.Tensor:
        p = f"blk.{il}."
        g = self.lin(h, p + "ffn_gate.weight")
        u = self.lin(h, p + "ffn_up.weight")
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
            if il == c.n_layer - 1 and logits != "all":
                if logits == "none":
                    break
                x = x[-1:]
            x = x + self._ffn(il, _rmsnorm(x, v[p + "post_attention_norm.weight"], eps))
        if logits == "none":
            if not bool(torch.isfinite(x).all()):
                raise NonFiniteError("non-finite values in the hidden state; the state was not "
                                     "advanced past the previous chunk")
            return None, None, a
        h = _rmsnorm(x, v["output_norm.weight"], eps)
        out = self.lin(h, "output.weight")
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(out).all())):
            raise NonFiniteError("non-finite values in the hidden state or the logits; the state "
                                 "was not advanced past the previous chunk")
        return out, (h if want_hidden else None), a

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

    def forward_block(self, ids: Sequence[int], st: Any, keep_states: bool = True) -> Block:
        """One block (a verify round) without committing; see the module docstring."""
        n = len(ids)
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
                    gdn_chunk: int = GC.DEFAULT_CHUNK) -> dict[str, int]:
    """Device bytes of one chunk of n tokens besides weights and state (planner prefill line)."""
    c = config
    H, D = c.n_head, c.head_dim
    act = n * (3 * c.n_embd + 3 * c.n_ff + 4 * c.conv_dim + 3 * c.value_dim + 6 * H * D
               + 4 * c.kv_dim) * 4
    return {"activations": int(act), "gemm_scratch": int(scratch_bytes),
            "gdn": GC.workspace_bytes(n, c.ssm_v_heads, c.ssm_state, c.ssm_state, gdn_chunk),
            "attn_kv_expand": AP.kv_expand_bytes(c.n_head, c.head_dim, n, depth),
            "logits": c.n_vocab * 4}
