"""Device-resident inference state of one sequence for the GPU executor (tightfit/model/executor.py).

Everything the decode step reads or writes lives in tensors allocated once, up front, so the
step can be captured as a CUDA graph and replayed:

* KV cache `k`, `v`: [n_attn_blocks, max_ctx, Hkv, D] fp16 (allocated for the whole context:
  the planner prices it as `kv_bytes`), or with a quantized `kv_type` (q8_0, tq3, `<k>+<v>`,
  tightfit/kvquant) byte caches uint8 [n_attn_blocks, max_ctx, Hkv, row_bytes] of K's and V's
  formats (kvquant.reference.alloc_cache), written quantize-on-write;
* recurrent state, double-banked: `conv` [2, n_rec, K-1, conv_dim] fp32 and `ssm`
  [2, n_rec, Hv, S, S] fp32 ([head, key, value], heads in GGUF tiled order);
* the status word `status` int32 [4] on the device: (active bank, sticky non-finite flag,
  device position, the commit scan's counter: 0 between launches). Kernels read the active
  bank and the position from it; the step's last kernel (tightfit.kernels.norm.commit) flips the bank and advances the position only if
  the step's hidden state and logits are finite, otherwise it sets the flag.

The host keeps an optimistic mirror `pos` (to choose the attention mode and check overflow
without reading the device) and reads the status word lazily in `sync()`, which raises
`NonFiniteError` when a step failed: the state is then as before that step (the flag makes
every later step of the same call refuse to commit as well).

Snapshots are host copies in the same `Snapshot` format as the CPU `State`.
"""
from __future__ import annotations

import torch

from tightfit.errors import UserError
from tightfit.model.config import Qwen35Config
from tightfit.runtime.state import (ContextOverflowError, NonFiniteError, Snapshot, StateError)


def state_bytes(config: Qwen35Config, max_ctx: int, kv_type: str | None = None) -> dict[str, int]:
    """Device bytes of one GPUState (for the planner): KV + both recurrent banks + status."""
    c = config
    n_attn, n_rec = len(c.attention_ids), len(c.recurrent_ids)
    if kv_type:
        from tightfit.kvquant.formats import kv_bytes_per_token
        kv = max_ctx * kv_bytes_per_token(kv_type, c.n_head_kv, c.head_dim, n_attn)
    else:
        kv = 2 * n_attn * max_ctx * c.kv_dim * 2
    return {
        "kv": kv,
        "recurrent": 2 * n_rec * (c.conv_state_elems + c.ssm_state_elems) * 4,
        "status": 16,
    }


class GPUState:
    """State of one sequence on `device`. Create with `GPUModel.new_state(max_ctx)`."""

    dtype = torch.float32
    kv_dtype = torch.float16

    kv_type = None                   # quantized KV type (None: fp16 rows)

    def __init__(self, config: Qwen35Config, max_ctx: int, device: str | torch.device = "cuda",
                 kv_type: str | None = None):
        if max_ctx <= 0:
            raise StateError(f"max_ctx must be positive, got {max_ctx}")
        from tightfit.runtime.state import quant_kv_type
        self.kv_type = quant_kv_type(kv_type, config)
        self.config = config
        self.max_ctx = int(max_ctx)
        self.device = torch.device(device)
        c = config
        self.rec_slot = {il: i for i, il in enumerate(c.recurrent_ids)}
        self.attn_slot = {il: i for i, il in enumerate(c.attention_ids)}
        n_attn, n_rec = len(self.attn_slot), len(self.rec_slot)
        dev = self.device
        if self.kv_type:
            from tightfit.kvquant.formats import split_kv_type
            from tightfit.kvquant.reference import alloc_cache
            self.kv_dtype = torch.uint8
            na = max(n_attn, 1)
            self.k, self.v = (alloc_cache(na * self.max_ctx, c.n_head_kv, c.head_dim, f, dev)
                              .view(na, self.max_ctx, c.n_head_kv, -1)
                              for f in split_kv_type(self.kv_type))
        else:
            self.k = torch.zeros(max(n_attn, 1), self.max_ctx, c.n_head_kv, c.head_dim,
                                 dtype=torch.float16, device=dev)
            self.v = torch.zeros_like(self.k)
        self.conv = torch.zeros(2, max(n_rec, 1), c.ssm_conv_kernel - 1, c.conv_dim,
                                dtype=torch.float32, device=dev)
        self.ssm = torch.zeros(2, max(n_rec, 1), c.ssm_v_heads, c.ssm_state, c.ssm_state,
                               dtype=torch.float32, device=dev)
        self.status = torch.zeros(4, dtype=torch.int32, device=dev)
        self.pos = 0
        self._kv_high = 0
        self._recurrent_valid = True
        self.graphs: dict = {}           # (attention mode, head) -> captured CUDA graph

    # ---- step protocol ------------------------------------------------------------------------
    def check_usable(self, n_new: int) -> None:
        if not self._recurrent_valid:
            raise StateError("the recurrent state does not match position "
                             f"{self.pos} after truncate(); restore a snapshot taken there first")
        if n_new <= 0:
            raise UserError("no tokens to process")
        if self.pos + n_new > self.max_ctx:
            raise ContextOverflowError(
                f"context overflow: {self.pos} tokens in the state + {n_new} new > max_ctx "
                f"{self.max_ctx}")

    def sync(self) -> None:
        """Read the status word (one small device->host copy) and raise NonFiniteError if a step
        since the last sync produced NaN/Inf; the host position then follows the device's."""
        st = self.status.tolist()
        self.check_status(st[1], st[2])

    def check_status(self, flag: int, pos: int) -> None:
        """sync()'s checks on status words 1 and 2 read elsewhere (the verify block reads them
        with its own results, one copy instead of two)."""
        if flag:
            self.pos = int(pos)
            self._kv_high = self.pos
            self.status[1] = 0
            raise NonFiniteError("non-finite values in the hidden state or the logits; the state "
                                 "was not advanced past that token")
        if pos != self.pos:
            raise StateError(f"device position {pos} disagrees with the host's {self.pos}")

    def advanced(self, n: int) -> None:
        """The host launched a step over n tokens (optimistic mirror of the device position)."""
        self.pos += n
        self._kv_high = self.pos

    def _set_pos(self, pos: int) -> None:
        self.pos = pos
        self.status[2] = pos

    # ---- rollback / caching -------------------------------------------------------------------
    def _active(self) -> int:
        return int(self.status[0])

    def _geometry(self) -> tuple:
        c = self.config
        return (c.n_layer, tuple(c.recurrent_ids), c.conv_dim, c.ssm_v_heads, c.ssm_state,
                c.n_head_kv, c.head_dim)

    def snapshot(self, include_kv: bool = False) -> Snapshot:
        self.sync()
        if not self._recurrent_valid:
            raise StateError("cannot snapshot a state whose recurrent part is stale after truncate()")
        a = self._active()
        n = len(self.rec_slot)
        kv = None
        if include_kv:
            kv = [(self.k[i, :self.pos].cpu(), self.v[i, :self.pos].cpu())
                  for i in range(len(self.attn_slot))]
        return Snapshot(pos=self.pos,
                        conv=[self.conv[a, i].cpu().clone() for i in range(n)],
                        ssm=[self.ssm[a, i].cpu().clone() for i in range(n)],
                        geometry=self._geometry(), kv=kv,
                        kv_type=self.kv_type if kv is not None else None)

    def restore(self, snap: Snapshot) -> None:
        self.sync()
        if snap.geometry != self._geometry():
            raise StateError("snapshot comes from a model of a different geometry")
        if snap.pos > self.max_ctx:
            raise ContextOverflowError(f"snapshot at position {snap.pos} exceeds max_ctx {self.max_ctx}")
        if snap.kv is None and snap.pos > self._kv_high:
            raise StateError(f"snapshot at position {snap.pos} is ahead of this state's KV "
                             f"({self.pos} rows) and carries no KV rows")
        snap_kv_type = getattr(snap, "kv_type", None)
        if snap.kv is not None and snap_kv_type != self.kv_type:
            raise StateError(f"snapshot KV is stored as {snap_kv_type or 'floats'}, this state "
                             f"stores {self.kv_type or 'fp16'}")
        a = self._active()
        for i, (cv, sm) in enumerate(zip(snap.conv, snap.ssm)):
            self.conv[a, i].copy_(cv)
            self.ssm[a, i].copy_(sm)
        if snap.kv is not None:
            for i, (k, v) in enumerate(snap.kv):
                self.k[i, :snap.pos].copy_(k)
                self.v[i, :snap.pos].copy_(v)
            self._kv_high = snap.pos
        self._set_pos(snap.pos)
        self._recurrent_valid = True

    def truncate(self, pos: int) -> None:
        self.sync()
        if pos < 0 or pos > self.pos:
            raise StateError(f"cannot truncate to {pos}: the state holds {self.pos} positions")
        if pos != self.pos:
            self._recurrent_valid = False
        self._set_pos(pos)

    def reset(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()
        self.status.zero_()
        self.pos = 0
        self._kv_high = 0
        self._recurrent_valid = True

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.conv, self.ssm,
                                                           self.status))
