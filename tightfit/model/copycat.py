"""A synthetic qwen35 GGUF that continues text by copying from its context: a hand-built
induction circuit in the real geometry and quant mix, every other weight zero.

Why: speculative decoding's real drafters (n-gram, suffix decoding) only pay on text that repeats
what came before, and a random-weight model never repeats anything (issue 10: the copy-task drafts
were rejected). A real model editing a code file copies most of it; this model does the same by
construction, with the same bytes per token (same tensors, same types), so its decode speed is
the seed-mix model's and the drafters meet realistic acceptance.

The circuit (residual dims, all of them in the first few 256-blocks of a row), G = 3:
  A  [0, RA)            the current token's code: random +-1 (the embedding row; a constant dim
                        KAPPA at RA feeds the recurrent block's q / k / gate and the recency)
  Bs [bs, bs + RQ)      s = 1..G: the code (first RQ dims) of the token s back. The first
                        recurrent block's conv tap t-s carries the value channels; decay 0 and
                        q = k make its state read back exactly this token's value. Each code
                        dim rides a (+x, -x) channel pair, and silu(x) - silu(-x) = x makes
                        the SiLU after the conv exact: Bs = the code, +-1.
  C  [c0, c0 + RA)      the prediction: the first attention block's head 0 matches the query
                        [A; B1; ..; B(G-1)](t) against the keys [B1; ..; BG](j) (the G tokens
                        before j) in its unrotated dims, i.e. it attends to the positions that
                        followed an earlier occurrence of the current G-gram, and its value is
                        the code A(j) found there. One rotary pair holds a constant in q and k,
                        which adds RECENCY * cos(theta (t - j)) with theta ~ 2e-4: among equal
                        matches the most recent wins, instead of a near tie that rounding breaks.
The output head reads C: logit(v) = <code(v), C>. Where the G-gram never occurred, the longest
partial match wins (each matching token adds a third of the score). Every other block's writers
are zero, so the residual passes through them unchanged.

    make_copycat(path, preset="qwen3.8-27b-seedmix")      # the bench model (bench/spec.py --copycat)
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from tightfit.errors import UserError
from tightfit.model.config import Qwen35Config
from tightfit.model.generate import ModelPlan, plan_model, write_header
from tightfit.quant.quantize import quantize
from tightfit.quant.traits import traits

KAPPA = 1.0          # the constant residual dim
M_V = 1.0            # the recurrent value pre-activation per code dim (silu(+-M_V))
Z_GATE = 4.0         # the recurrent gate's pre-activation (silu(4) ~ 3.93)
SSM_A = -100.0       # ssm_a of the circuit block: decay exp(-100 * softplus(DT_BIAS)) = 0
DT_BIAS = 10.0
QK_NORM = 3.0        # attention q / k norm weight: full-match score ~ sqrt(D) * 9 * 0.8
GRAM = 3             # tokens matched (the query's current token and GRAM - 1 before it)
RECENCY = 0.25       # the rotary pair's share of the q / k energy, relative to the content's
RECENCY_THETA = 2e-4  # its target angle per token (cos decreasing over ~15K tokens)
ROW_CHUNK = 8192     # embedding / head rows written per pwrite


def _silu(x: float) -> float:
    return x / (1.0 + math.exp(-x))


class Layout:
    """Where the circuit lives in this geometry; UserError when it does not fit."""

    def __init__(self, cfg: Qwen35Config):
        E, D, S = cfg.n_embd, cfg.head_dim, cfg.ssm_state
        if cfg.tied_output:
            raise UserError("the copycat model needs an untied output head")
        self.rec = next((i for i in range(cfg.n_layer) if cfg.is_recurrent(i)), None)
        self.att = next((i for i in range(cfg.n_layer) if not cfg.is_recurrent(i)), None)
        if self.rec is None or self.att is None or self.rec > self.att:
            raise UserError("the copycat model needs a recurrent block before an attention block")
        self.gram = min(GRAM, cfg.ssm_conv_kernel - 1)
        self.rq = min((D - cfg.n_rot) // self.gram, 96)   # match dims per code (query/key parts)
        self.ra = min(256, max(self.rq, E // 4), D)     # identity dims (value, output)
        self.nu = self.rq                               # code dims per recurrent value head
        self.hps = 1
        while self.nu > S // 2 or self.rq % self.hps:   # heads per shift: (+x, -x) pairs fit
            self.hps += 1
            self.nu = self.rq // self.hps
        self.const = self.ra
        self.b = [self.ra + 1 + s * self.rq for s in range(self.gram)]   # B1 .. BG
        self.c0 = self.b[-1] + self.rq
        # the rotary pair nearest RECENCY_THETA (its index i < n_rot / 2; pair dims i, i + n_rot/2)
        half = cfg.n_rot // 2
        self.rpair = min(range(half), key=lambda i: abs(math.log(
            cfg.rope_freq_base ** (-2.0 * i / cfg.n_rot) / RECENCY_THETA)))
        if self.rq < 16 or self.c0 + self.ra > E or self.gram * self.hps > cfg.ssm_v_heads:
            raise UserError(f"the copycat circuit does not fit this geometry (n_embd {E}, head dim "
                            f"{D}, rope dims {cfg.n_rot}, {cfg.ssm_v_heads} value heads)")
        # magnitudes: residual rms at the recurrent block's input (embedding rows only)
        self.r0 = math.sqrt((self.ra + KAPPA ** 2) / E)
        rms_head = math.sqrt(self.nu * (_silu(M_V) ** 2 + _silu(-M_V) ** 2) / S)
        self.mag_b = _silu(Z_GATE) * M_V / rms_head     # |Bs_j| before ssm_out's 1 / mag_b


def _codes(n: int, dims: int, seed: int, lo: int = 0) -> np.ndarray:
    """+-1 codes of tokens lo .. lo + n - 1 (deterministic per token, independent of chunking)."""
    out = np.empty((n, dims), np.float32)
    for i in range(n):
        rng = np.random.default_rng([seed, lo + i])
        out[i] = rng.integers(0, 2, dims, dtype=np.int8) * 2 - 1
    return out


class _Writer:
    def __init__(self, path: Path, plan: ModelPlan, start: int):
        self.plan, self.start = plan, start
        self.by_name = {t.name: t for t in plan.tensors}
        self.fd = os.open(path, os.O_WRONLY)

    def close(self) -> None:
        os.close(self.fd)

    def dense(self, name: str, w: np.ndarray) -> None:
        """Quantize a whole tensor (numpy order: rows x ne0) into its type and write it."""
        t = self.by_name[name]
        w = np.asarray(w, np.float32).reshape(t.ne[::-1] if len(t.ne) > 1 else t.ne)
        data = w.astype("<f4") if t.qtype == "F32" else quantize(w.reshape(-1, t.ne[0]), t.qtype)
        os.pwrite(self.fd, np.ascontiguousarray(data).tobytes(), self.start + t.offset)

    def sparse(self, name: str, entries: dict[tuple[int, int], float]) -> None:
        """Write only the quant blocks that hold a non-zero (row, col) entry; the rest of the
        tensor stays the sparse file's zeros, which decode to 0 in every type."""
        t = self.by_name[name]
        bs = traits(t.qtype).block_size
        ts = traits(t.qtype).type_size
        blocks: dict[tuple[int, int], np.ndarray] = {}
        for (r, c), v in entries.items():
            key = (r, c // bs)
            if key not in blocks:
                blocks[key] = np.zeros(bs, np.float32)
            blocks[key][c % bs] = v
        if not blocks:
            return
        keys = sorted(blocks)
        data = quantize(np.stack([blocks[k] for k in keys]), t.qtype)
        for k, b in zip(keys, data):
            os.pwrite(self.fd, b.tobytes(), self.start + t.offset + k[0] * t.row_bytes + k[1] * ts)

    def row_blocks(self, name: str, col0: int, fill) -> None:
        """Every row's columns [col0, col0 + w) from fill(row0, n) -> (n, w) floats, w a whole
        number of blocks from a block boundary; the other columns stay zero."""
        t = self.by_name[name]
        bs, ts = traits(t.qtype).block_size, traits(t.qtype).type_size
        if col0 % bs:
            raise ValueError("row_blocks: col0 must start a block")
        for r0 in range(0, t.rows, ROW_CHUNK):
            n = min(ROW_CHUNK, t.rows - r0)
            vals = np.asarray(fill(r0, n), np.float32)
            q = quantize(vals, t.qtype)
            rows = np.zeros((n, t.row_bytes), np.uint8)
            b0 = col0 // bs * ts
            rows[:, b0:b0 + q.shape[1]] = q
            os.pwrite(self.fd, rows.tobytes(), self.start + t.offset + r0 * t.row_bytes)


def _block_cols(lo: int, hi: int, bs: int) -> tuple[int, int]:
    """The block-aligned column range covering [lo, hi)."""
    return lo // bs * bs, -(-hi // bs) * bs


def write_circuit(w: _Writer, cfg: Qwen35Config, L: Layout, seed: int) -> None:
    S, K = cfg.ssm_state, cfg.ssm_conv_kernel
    Hk, Hv, D = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.head_dim
    kd = cfg.key_dim
    # every norm weight 1 (q / k norms of the circuit's attention QK_NORM); zeros elsewhere mean
    # the other blocks add nothing whatever their norms are, but ones keep them finite and plain
    for t in w.plan.tensors:
        if t.name.endswith("norm.weight") and len(t.ne) == 1:
            w.dense(t.name, np.ones(t.ne[0], np.float32))
    # embedding: A = code, constant dim; output head: C = code
    te = w.by_name["token_embd.weight"]
    bs = traits(te.qtype).block_size
    lo, hi = _block_cols(0, L.const + 1, bs)

    def emb(r0: int, n: int) -> np.ndarray:
        v = np.zeros((n, hi - lo), np.float32)
        v[:, :L.ra] = _codes(n, L.ra, seed, r0)
        v[:, L.const] = KAPPA
        return v
    w.row_blocks("token_embd.weight", lo, emb)
    ho = w.by_name["output.weight"]
    lo2, hi2 = _block_cols(L.c0, L.c0 + L.ra, traits(ho.qtype).block_size)

    def head(r0: int, n: int) -> np.ndarray:
        v = np.zeros((n, hi2 - lo2), np.float32)
        v[:, L.c0 - lo2:L.c0 - lo2 + L.ra] = _codes(n, L.ra, seed, r0)
        return v
    w.row_blocks("output.weight", lo2, head)

    # the recurrent block: q = k = the constant dim, values = the code one / two tokens back
    p = f"blk.{L.rec}."
    a_const = KAPPA / L.r0                    # the constant dim after attn_norm
    qkv: dict[tuple[int, int], float] = {}
    conv = np.zeros((cfg.conv_dim, K), np.float32)
    for hk in range(Hk):
        for ch in (hk * S, kd + hk * S):
            qkv[(ch, L.const)] = 1.0 / a_const
            conv[ch, K - 1] = 1.0
    wv = M_V * L.r0                           # code dim after attn_norm = 1 / r0
    gate: dict[tuple[int, int], float] = {}
    out: dict[tuple[int, int], float] = {}
    for shift, dst in enumerate(L.b, start=1):
        for j in range(L.rq):
            hh = (shift - 1) * L.hps + j // L.nu
            i = j % L.nu
            for sign, col in ((1.0, hh * S + i), (-1.0, hh * S + S // 2 + i)):
                ch = 2 * kd + col
                qkv[(ch, j)] = sign * wv
                conv[ch, K - 1 - shift] = 1.0
                out[(dst + j, col)] = sign / L.mag_b
        for hh in range((shift - 1) * L.hps, shift * L.hps):
            for i in range(S):
                gate[(hh * S + i, L.const)] = Z_GATE / a_const
    w.sparse(p + "attn_qkv.weight", qkv)
    w.sparse(p + "attn_gate.weight", gate)
    w.sparse(p + "ssm_out.weight", out)         # B dims come out as +-1 (the code)
    w.dense(p + "ssm_conv1d.weight", conv)
    w.dense(p + "ssm_a", np.full(Hv, SSM_A, np.float32))
    w.dense(p + "ssm_dt.bias", np.full(Hv, DT_BIAS, np.float32))

    # the attention block: head 0 matches [A; B1..] against [B1; ..; BG] (unrotated dims), a
    # constant in one rotary pair (recency), value A
    p = f"blk.{L.att}."
    r = cfg.n_rot
    a_c = KAPPA                               # the constant dim keeps its raw scale here: the
    q: dict[tuple[int, int], float] = {}      # q / k norms remove the residual's rms anyway
    k: dict[tuple[int, int], float] = {}
    v: dict[tuple[int, int], float] = {}
    o: dict[tuple[int, int], float] = {}
    src_q = [0] + L.b[:-1]                    # A, B1 .. B(G-1)
    for part in range(L.gram):
        for j in range(L.rq):
            q[(r + part * L.rq + j, src_q[part] + j)] = 1.0   # attn_q rows: head 0 = [q_0 | gate_0]
            k[(r + part * L.rq + j, L.b[part] + j)] = 1.0
    kap = math.sqrt(RECENCY * L.gram * L.rq)        # raw pair value (the codes' dims are +-1)
    q[(L.rpair, L.const)] = kap / a_c
    k[(L.rpair, L.const)] = kap / a_c
    for j in range(L.ra):
        v[(j, j)] = 1.0
        o[(L.c0 + j, j)] = 1.0
    w.sparse(p + "attn_q.weight", q)
    w.sparse(p + "attn_k.weight", k)
    w.sparse(p + "attn_v.weight", v)
    w.sparse(p + "attn_output.weight", o)
    w.dense(p + "attn_q_norm.weight", np.full(D, QK_NORM, np.float32))
    w.dense(p + "attn_k_norm.weight", np.full(D, QK_NORM, np.float32))


def make_copycat(path: str | os.PathLike, preset: str = "qwen3.8-27b-seedmix", *, seed: int = 0,
                 qtype: str | None = None, mix: Any = None, vocab: str | None = None,
                 layers: int | None = None) -> ModelPlan:
    """Write the copying model to `path` (same tensors and types as make_model's for these
    arguments); returns the plan."""
    plan = plan_model(preset, seed=seed, qtype=qtype, mix=mix, vocab=vocab, layers=layers)
    plan.args = dict(plan.args, copycat=True)          # the header says what the weights are
    layout = Layout(plan.cfg)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    start = write_header(tmp, plan)
    w = _Writer(tmp, plan, start)
    try:
        write_circuit(w, plan.cfg, layout, plan.args["seed"])
    finally:
        w.close()
    os.replace(tmp, path)
    return plan


__all__ = ["Layout", "make_copycat", "write_circuit"]
