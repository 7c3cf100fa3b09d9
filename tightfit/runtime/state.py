"""Per-sequence inference state of a qwen35 model (spec/qwen35.md §4).

A `State` holds, for one sequence:

* a K and a V cache per full-attention block, `[capacity, Hkv, D]` in `kv_dtype` (float16 by
  default, the rounding llama.cpp applies), plus the number of valid positions `pos`; or, with a
  quantized `kv_type` (q8_0, tq3, tq4, ..., `<k>+<v>`: tightfit/kvquant/formats.py), byte caches
  `uint8 [capacity, Hkv, row_bytes]` written by `kvquant.reference.write_rows` (quantize on
  write, prefill and decode alike) and read by `kvquant.reference.attention_quant` through
  `kv_bytes`; snapshots, restore and truncate copy the bytes;
* a conv state `[K-1, conv_dim]` (raw pre-conv `attn_qkv` rows, oldest first) and an SSM state
  `[Hv, S, S]` (`[head, key, value]`, HF orientation, heads in GGUF tiled order) per Gated
  DeltaNet block, always in the compute dtype (float32, or float64 for tests).

**Double bank.** The recurrent state cannot be recomputed from the KV cache, so a step that
blows up half-way (a NaN in one layer) must not leave it half-updated. Each recurrent tensor
therefore has two banks: a forward reads the *active* bank and writes the *staging* bank, and
`commit(n)` swaps the banks and advances `pos` only after the whole step produced finite
outputs. KV rows are written at positions `pos..pos+n-1`, which lie beyond the committed length
until the commit, so a failed step leaves the KV cache logically untouched as well.

**Rollback.** KV can be truncated (`truncate(pos)`), the recurrent state cannot: it is a lossy
summary of every token so far. Rolling back a hybrid model therefore needs a snapshot taken at
(or before) the target position: `snap = state.snapshot()` ... `state.restore(snap)`. After a
`truncate` to an earlier position without a restore, the recurrent state no longer matches
`pos` and `check_usable()` (called by every forward) refuses to run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from tightfit.errors import UserError
from tightfit.model.config import Qwen35Config

PLAIN_KV = {"f16": torch.float16, "f32": torch.float32}


def quant_kv_type(kv_type: str | None, config: Qwen35Config) -> str | None:
    """Normalized quantized KV type ('tq3', 'q8_0+tq3') for kv_type, None for f16 / f32 / None.
    UserError for an unknown name or a format the head_dim cannot hold."""
    if kv_type is None or kv_type.lower() in PLAIN_KV:
        return None
    from tightfit.kvquant.formats import FORMATS, get_format, split_kv_type
    try:
        kn, vn = split_kv_type(kv_type)
        for name in (kn, vn):
            get_format(name).check_dim(config.head_dim)
    except ValueError as e:
        raise UserError(f"--kv-type {kv_type}: {e} (use f16, f32, {', '.join(FORMATS)} or "
                        f"<k>+<v>, e.g. q8_0+tq3)") from None
    return kn if kn == vn else f"{kn}+{vn}"


class NonFiniteError(UserError):
    """A forward step produced NaN/Inf; the state was left as it was before the step."""


class ContextOverflowError(UserError):
    """The tokens do not fit in the sequence's context window."""


class StateError(UserError):
    """The state cannot be used as asked (stale recurrent state, foreign snapshot, bad position)."""


@dataclass
class Snapshot:
    """Host copy of a sequence's recurrent state at position `pos` (and optionally its KV rows).

    Without KV rows a snapshot is only valid for the state it came from, as long as the KV rows
    below `pos` were not rewritten since (the speculative-decoding pattern: snapshot, append
    drafts, restore on rejection). With `include_kv=True` it is self-contained (a prompt cache
    entry) and can be restored into any state of the same model geometry.
    """
    pos: int
    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]
    geometry: tuple
    kv: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None
    kv_type: Optional[str] = None     # quantized KV type of the kv bytes (None: float rows)

    def nbytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.conv + self.ssm)
        for k, v in self.kv or []:
            n += k.numel() * k.element_size() + v.numel() * v.element_size()
        return n


class State:
    """Inference state of one sequence. Create with `ReferenceModel.new_state(max_ctx)`."""

    def __init__(self, config: Qwen35Config, max_ctx: int, dtype: torch.dtype = torch.float32,
                 kv_dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu",
                 kv_type: str | None = None):
        """kv_type: None (K/V in kv_dtype), 'f16' / 'f32' (the same as that kv_dtype), or a
        quantized KV type stored as bytes (see the module doc)."""
        if max_ctx <= 0:
            raise StateError(f"max_ctx must be positive, got {max_ctx}")
        self.config = config
        self.max_ctx = int(max_ctx)
        self.dtype = dtype
        self.kv_type = quant_kv_type(kv_type, config)
        if self.kv_type is None and kv_type is not None:
            kv_dtype = PLAIN_KV[kv_type.lower()]
        self.kv_dtype = torch.uint8 if self.kv_type else kv_dtype
        self._row_bytes: tuple[int, int] | None = None
        if self.kv_type:
            from tightfit.kvquant.formats import get_format, split_kv_type
            self._row_bytes = tuple(get_format(x).row_bytes(config.head_dim)
                                    for x in split_kv_type(self.kv_type))
        self.device = torch.device(device)
        self.pos = 0
        self._kv_high = 0           # KV rows [0, _kv_high) hold this history's tokens
        self._recurrent_valid = True
        c = config
        K = c.ssm_conv_kernel
        # slot index of each block inside its kind's list
        self.rec_slot = {il: i for i, il in enumerate(c.recurrent_ids)}
        self.attn_slot = {il: i for i, il in enumerate(c.attention_ids)}
        nrec = len(self.rec_slot)
        z = lambda *shape: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        # banks[b][slot] ; active bank index is self._active
        self._conv = [[z(K - 1, c.conv_dim) for _ in range(nrec)] for _ in range(2)]
        self._ssm = [[z(c.ssm_v_heads, c.ssm_state, c.ssm_state) for _ in range(nrec)]
                     for _ in range(2)]
        self._active = 0
        # KV grows on demand (doubling) up to max_ctx: a reference state for a 262k context
        # must not allocate gigabytes up front.
        self._cap = 0
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._alloc_kv(min(self.max_ctx, 256))

    # ---- geometry -----------------------------------------------------------------------------
    def _geometry(self) -> tuple:
        c = self.config
        return (c.n_layer, tuple(c.recurrent_ids), c.conv_dim, c.ssm_v_heads, c.ssm_state,
                c.n_head_kv, c.head_dim)

    def _alloc_kv(self, cap: int) -> None:
        c = self.config
        cap = min(max(cap, 1), self.max_ctx)
        if cap <= self._cap:
            return
        newk, newv = [], []
        kw, vw = self._row_bytes or (c.head_dim, c.head_dim)
        for i in range(len(self.attn_slot)):
            k = torch.zeros(cap, c.n_head_kv, kw, dtype=self.kv_dtype, device=self.device)
            v = torch.zeros(cap, c.n_head_kv, vw, dtype=self.kv_dtype, device=self.device)
            if self._cap:
                k[: self._cap] = self._k[i]
                v[: self._cap] = self._v[i]
            newk.append(k)
            newv.append(v)
        self._k, self._v, self._cap = newk, newv, cap

    # ---- step protocol (used by the forward pass) ---------------------------------------------
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

    def conv(self, il: int) -> torch.Tensor:
        """Active (committed) conv state of recurrent block il, [K-1, conv_dim]."""
        return self._conv[self._active][self.rec_slot[il]]

    def ssm(self, il: int) -> torch.Tensor:
        """Active (committed) SSM state of recurrent block il, [Hv, S(key), S(value)]."""
        return self._ssm[self._active][self.rec_slot[il]]

    def stage_recurrent(self, il: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Write block il's new recurrent state into the staging bank (not visible until commit)."""
        s = self.rec_slot[il]
        b = 1 - self._active
        self._conv[b][s].copy_(conv)
        self._ssm[b][s].copy_(ssm)

    def write_kv(self, il: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V rows [n, Hkv, D] of attention block il at positions pos..pos+n-1 (beyond the
        committed length, so an aborted step leaves them unseen)."""
        n = k.shape[0]
        end = self.pos + n
        if end > self._cap:
            self._alloc_kv(max(end, 2 * self._cap))
        s = self.attn_slot[il]
        if self.kv_type:
            from tightfit.kvquant.reference import write_rows
            write_rows(self._k[s], self._v[s], self.pos, k, v, self.kv_type)
            return
        self._k[s][self.pos:end] = k.to(self.kv_dtype)
        self._v[s][self.pos:end] = v.to(self.kv_dtype)

    def kv(self, il: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows 0..end-1 of attention block il, as stored (kv_dtype); for a quantized
        cache dequantized to the compute dtype (a full copy: for inspection and tests; the
        forward reads `kv_bytes` through kvquant.reference.attention_quant instead)."""
        s = self.attn_slot[il]
        if self.kv_type:
            from tightfit.kvquant.formats import split_kv_type
            from tightfit.kvquant.reference import dequantize
            D = self.config.head_dim
            kn, vn = split_kv_type(self.kv_type)
            return (dequantize(self._k[s][:end], kn, D, dtype=self.dtype),
                    dequantize(self._v[s][:end], vn, D, dtype=self.dtype))
        return self._k[s][:end], self._v[s][:end]

    def kv_bytes(self, il: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte rows 0..end-1 of a quantized cache, uint8 [end, Hkv, row_bytes] (views)."""
        if not self.kv_type:
            raise StateError("kv_bytes: this state's KV cache is not quantized")
        s = self.attn_slot[il]
        return self._k[s][:end], self._v[s][:end]

    def commit(self, n: int) -> None:
        """The step over n tokens finished with finite outputs: make its state the active one.
        Recurrent blocks that were not staged in this step cannot exist (every forward runs all
        blocks), so swapping the whole bank is correct."""
        self._active = 1 - self._active
        self.pos += n
        self._kv_high = self.pos    # rows beyond this now belong to an abandoned history

    # ---- rollback / caching -------------------------------------------------------------------
    def snapshot(self, include_kv: bool = False) -> Snapshot:
        if not self._recurrent_valid:
            raise StateError("cannot snapshot a state whose recurrent part is stale after truncate()")
        a = self._active
        kv = None
        if include_kv:
            kv = [(self._k[i][: self.pos].clone(), self._v[i][: self.pos].clone())
                  for i in range(len(self._k))]
        return Snapshot(pos=self.pos,
                        conv=[t.detach().to("cpu", copy=True) for t in self._conv[a]],
                        ssm=[t.detach().to("cpu", copy=True) for t in self._ssm[a]],
                        geometry=self._geometry(), kv=kv,
                        kv_type=self.kv_type if kv is not None else None)

    def restore(self, snap: Snapshot) -> None:
        """Make the state equal to the snapshot: recurrent state copied back, KV length = snap.pos
        (and KV rows copied back if the snapshot carries them)."""
        if snap.geometry != self._geometry():
            raise StateError("snapshot comes from a model of a different geometry")
        if snap.pos > self.max_ctx:
            raise ContextOverflowError(f"snapshot at position {snap.pos} exceeds max_ctx {self.max_ctx}")
        snap_kv_type = getattr(snap, "kv_type", None)
        if snap.kv is not None and snap_kv_type != self.kv_type:
            raise StateError(f"snapshot KV is stored as {snap_kv_type or 'floats'}, this state "
                             f"stores {self.kv_type or 'floats'}")
        if snap.kv is None and snap.pos > self._kv_high:
            raise StateError(f"snapshot at position {snap.pos} is ahead of this state's KV "
                             f"({self.pos} rows) and carries no KV rows")
        a = self._active
        for dst, src in zip(self._conv[a], snap.conv):
            dst.copy_(src)
        for dst, src in zip(self._ssm[a], snap.ssm):
            dst.copy_(src)
        if snap.kv is not None:
            self._alloc_kv(snap.pos)
            for i, (k, v) in enumerate(snap.kv):
                self._k[i][: snap.pos] = k.to(self.kv_dtype)
                self._v[i][: snap.pos] = v.to(self.kv_dtype)
        if snap.kv is not None:
            self._kv_high = snap.pos
        self.pos = snap.pos
        self._recurrent_valid = True

    def truncate(self, pos: int) -> None:
        """Forget KV positions >= pos. The recurrent state cannot be truncated; unless pos equals
        the current position, restore a snapshot taken at `pos` before the next forward."""
        if pos < 0 or pos > self.pos:
            raise StateError(f"cannot truncate to {pos}: the state holds {self.pos} positions")
        if pos != self.pos:
            self._recurrent_valid = False
        self.pos = pos

    def reset(self) -> None:
        """Start a fresh sequence (zero recurrent state, empty KV)."""
        for bank in self._conv + self._ssm:
            for t in bank:
                t.zero_()
        self.pos = 0
        self._kv_high = 0
        self._recurrent_valid = True

    def nbytes(self) -> int:
        n = sum(t.numel() * t.element_size() for b in self._conv + self._ssm for t in b)
        n += sum(t.numel() * t.element_size() for t in self._k + self._v)
        return n
