"""Verification of a draft: target logits over the block [last, d_1..d_k] in one forward, token
acceptance (greedy, or speculative rejection sampling), and the state commit that keeps exactly
the accepted prefix.

Acceptance (`Acceptor.step`, one position at a time, with the history as it would be without
speculation, so penalties see the accepted drafts):

* greedy: the target token is the plain sampler's choice (argmax of the penalised logits); the
  draft token is accepted iff it equals it, otherwise the target token is emitted instead;
* sampled: p = the sampler's own filtered distribution (`apply_penalties` + `filtered_distribution`,
  the same functions `Sampler` draws from); draft d with drafter distribution q is accepted with
  probability min(1, p(d)/q(d)) (deterministic drafters: q = one-hot, so p(d)); on rejection the
  token is drawn from max(0, p - q) renormalised; after a fully accepted draft the bonus token is
  drawn from p. The emitted tokens then have exactly the target distribution.

Verifiers (`begin(tokens, state) -> Round`; `Round.row(i)`, `Round.hidden`, `Round.commit(n)`):

* `NativeVerifier` (ReferenceModel): one batched forward over the block that records the Gated
  DeltaNet conv/SSM state after every position (the recurrence runs token by token anyway), so
  `commit(n)` stages the states after block token n-1 and commits n positions: no re-run. KV rows
  written past the kept point are abandoned (the State's high-water mark moves back). It also
  returns the final hidden state output_norm(h) of every row (what the MTP head reads).
* `ReplayVerifier` (any model with forward/snapshot/restore): snapshot, forward the block, and on a
  partial accept restore and re-run the kept tokens. Correct first version and fallback.
* `BlockVerifier` (executors with `forward_block`, i.e. tightfit.model.executor.GPUModel): one
  batched forward over the k+1 positions that keeps what the chunked GDN recurrence needs to
  rebuild the state after any position; `commit(n)` keeps exactly the accepted prefix (native
  rollback, nothing re-run) and abandons the KV rows past it. Rows of logits move to the host
  one at a time, as the acceptance reads them (an early rejection copies fewer rows). A round
  without a draft (one token) runs the executor's graph-captured step instead.
* `StepVerifier` (one-token step executors without `forward_block`): steps the block token by
  token and stops at the first rejection, so there is nothing to roll back (and no batching gain).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.runtime.sampler import Sampler, apply_penalties, filtered_distribution


# ---- acceptance ---------------------------------------------------------------------------------
class Acceptor:
    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.params = sampler.params
        self.rng = sampler.rng

    @property
    def argmax_only(self) -> bool:
        """Greedy without penalties: every emitted token is a row's argmax, so a verifier round
        can hand over the M argmaxes (one small copy) instead of M rows of logits."""
        return self.params.greedy and not self.params.penalized

    def target(self, row: np.ndarray, history: Sequence[int]) -> int:
        """A token from the target distribution (the plain sampler: same draw, same RNG)."""
        return self.sampler(row, history)

    def step(self, row: np.ndarray, history: Sequence[int], d: int,
             q: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[int, bool]:
        """(emitted token, whether it is the draft token d)."""
        if self.params.greedy:
            t = self.sampler(row, history)
            return t, t == d
        x = apply_penalties(np.asarray(row), history, self.params)
        ids, p = filtered_distribution(x, self.params)
        hit = np.nonzero(ids == d)[0]
        pd = float(p[hit[0]]) if hit.size else 0.0
        if q is None:
            qd = 1.0
        else:
            qi, qp = q
            h = np.nonzero(np.asarray(qi) == d)[0]
            qd = float(qp[h[0]]) if h.size else 0.0
        if qd <= 0.0:                     # q must cover its own draft; treat as one-hot
            qd, q = 1.0, None
        if self.rng.random() < min(1.0, pd / qd):
            return int(d), True
        # residual max(0, p - q) on p's support (tokens outside it have p = 0: residual 0)
        r = p.copy()
        if q is None:
            if hit.size:
                r[hit[0]] = 0.0
        else:
            qmap = dict(zip((int(i) for i in q[0]), (float(v) for v in q[1])))
            r = np.maximum(0.0, p - np.array([qmap.get(int(i), 0.0) for i in ids]))
        s = r.sum()
        if s <= 0.0:                      # numerically p == q: any draw from p is exact
            r, s = p, p.sum()
        return int(ids[self.rng.choice(len(ids), p=r / s)]), False


# ---- verifiers ----------------------------------------------------------------------------------
def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


class _Round:
    """A verified block: logits rows, normed hidden rows (or None), commit(n). Logits given as a
    device tensor stay there until a row is asked for: a greedy round without penalties reads
    only its argmaxes (the one-token round's 248,320 logits were a 1 MB copy, session 22)."""

    def __init__(self, logits, hidden, commit_fn):
        self._dev = logits if isinstance(logits, torch.Tensor) else None
        self._rows = None if self._dev is not None else logits
        self.hidden = hidden
        self._commit = commit_fn
        self.n_rows = logits.shape[0]

    @property
    def logits(self) -> np.ndarray:
        if self._rows is None:
            self._rows = _np(self._dev)
        return self._rows

    def row(self, i: int) -> np.ndarray:
        return self.logits[i]

    def argmaxes(self) -> list[int]:
        if self._rows is None:      # first maximal index, as np.argmax
            return [int(i) for i in self._dev.argmax(dim=-1).tolist()]
        return [int(i) for i in np.argmax(self.logits, axis=1)]

    def commit(self, n: int) -> None:
        if not 1 <= n <= self.n_rows:
            raise ValueError(f"commit({n}) outside 1..{self.n_rows}")
        self._commit(n)


class NativeVerifier:
    """Batched verify forward on a ReferenceModel with per-position recurrent states."""
    native = True

    def __init__(self, model):
        from tightfit.model.reference import rmsnorm
        self.model = model
        self.config = model.config
        self._rmsnorm = rmsnorm

    # the block forward: ReferenceModel.forward with the GDN recurrence capturing every state
    def _gdn(self, il: int, a: torch.Tensor, state, keep_all: bool):
        m, c, p = self.model, self.config, f"blk.{il}."
        n = a.shape[0]
        Hk, Hv, S, K = c.ssm_k_heads, c.ssm_v_heads, c.ssm_state, c.ssm_conv_kernel
        eps = c.rms_eps
        u = m._lin(a, p + "attn_qkv.weight")
        z = m._lin(a, p + "attn_gate.weight").view(n, Hv, S)
        beta = torch.sigmoid(m._lin(a, p + "ssm_beta.weight"))
        g = F.softplus(m._lin(a, p + "ssm_alpha.weight") + m._w(p + "ssm_dt.bias")) * m._w(p + "ssm_a")
        hist = torch.cat([state.conv(il).to(m.dtype), u], dim=0)
        windows = hist.unfold(0, K, 1)
        y = F.silu((windows * m._w(p + "ssm_conv1d.weight")).sum(-1))
        kd = c.key_dim
        q = y[:, :kd].reshape(n, Hk, S)
        k = y[:, kd:2 * kd].reshape(n, Hk, S)
        v = y[:, 2 * kd:].reshape(n, Hv, S)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + eps) * (S ** -0.5)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)
        r = Hv // Hk
        qh, kh = q.repeat(1, r, 1), k.repeat(1, r, 1)
        st = state.ssm(il).to(m.dtype).clone()
        decay = torch.exp(g)
        out = torch.empty(n, Hv, S, dtype=m.dtype)
        states = [] if keep_all else None
        for t in range(n):
            st.mul_(decay[t][:, None, None])
            kt = kh[t].unsqueeze(1)
            kv = torch.bmm(kt, st).squeeze(1)
            delta = beta[t][:, None] * (v[t] - kv)
            st.baddbmm_(kt.transpose(1, 2), delta.unsqueeze(1))
            out[t] = torch.bmm(qh[t].unsqueeze(1), st).squeeze(1)
            if keep_all:
                states.append(st.clone())
        o = self._rmsnorm(out, m._w(p + "ssm_norm.weight"), eps) * F.silu(z)
        # conv state after block token t: raw rows t+1 .. t+K-1 of hist
        rec = (hist, states if keep_all else [st])
        return m._lin(o.reshape(n, Hv * S), p + "ssm_out.weight"), rec

    def _forward(self, ids: Sequence[int], state, keep_all: bool, want: str):
        """Run the block at state.pos without committing. want: 'all' (logits every row), 'last'.
        Returns (logits np [r, V], hidden torch [n, E] normed, recurrent captures)."""
        m, c = self.model, self.config
        if state.config != c or state.dtype != m.dtype:
            from tightfit.runtime.state import StateError
            raise StateError("state was created for a different model or dtype")
        t = m._token_ids(ids)
        n = int(t.numel())
        state.check_usable(n)
        pos = torch.arange(state.pos, state.pos + n)
        caps: dict[int, tuple] = {}
        with torch.no_grad():
            x = m._embed(t)
            for il in range(c.n_layer):
                p = f"blk.{il}."
                a = self._rmsnorm(x, m._w(p + "attn_norm.weight"), c.rms_eps)
                if c.is_recurrent(il):
                    o, caps[il] = self._gdn(il, a, state, keep_all)
                    x = x + o
                else:
                    x = x + m._attention(il, a, state, pos)
                x = x + m._ffn(il, self._rmsnorm(x, m._w(p + "post_attention_norm.weight"), c.rms_eps))
                m._check_finite(x, f"the hidden state after block {il}")
            h = self._rmsnorm(x, m._w("output_norm.weight"), c.rms_eps)
            rows = h if want == "all" else h[-1:]
            logits = m._lin(rows, m._head)
            m._check_finite(logits, "the logits")
        return _np(logits), h, caps

    def _stage(self, state, caps: dict, j: int) -> None:
        """Stage the recurrent state after block token j (0-based)."""
        K = self.config.ssm_conv_kernel
        for il, (hist, states) in caps.items():
            conv = hist[j + 1: j + K]
            st = states[j] if len(states) > 1 else states[-1]
            state.stage_recurrent(il, conv, st)

    def prefill(self, ids: Sequence[int], state, chunk: int = 512):
        """Feed prompt tokens; returns (logits of the last one, normed hidden of every one)."""
        hs = []
        last = None
        for i in range(0, len(ids), chunk):
            part = ids[i:i + chunk]
            logits, h, caps = self._forward(part, state, keep_all=False, want="last")
            self._stage(state, caps, len(part) - 1)
            state.commit(len(part))
            hs.append(h)
            last = logits[-1]
        return last, torch.cat(hs, 0)

    def begin(self, tokens: Sequence[int], state) -> _Round:
        logits, h, caps = self._forward(tokens, state, keep_all=len(tokens) > 1, want="all")

        def commit(n: int) -> None:
            self._stage(state, caps, n - 1)
            state.commit(n)
        return _Round(logits, h, commit)


class ReplayVerifier:
    """Snapshot -> batched forward -> on partial accept: restore + re-run the kept tokens."""
    native = False

    def __init__(self, model):
        self.model = model
        self.config = model.config
        self.replayed = 0          # tokens re-run (the cost native rollback avoids)

    def prefill(self, ids: Sequence[int], state, chunk: int = 512):
        last = None
        for i in range(0, len(ids), chunk):
            final = i + chunk >= len(ids)
            last = self.model.forward(ids[i:i + chunk], state, logits="last" if final else "none")
        return _np(last)[-1], None

    def begin(self, tokens: Sequence[int], state) -> _Round:
        tokens = list(tokens)
        snap = state.snapshot() if len(tokens) > 1 else None
        logits = _np(self.model.forward(tokens, state, logits="all"))

        def commit(n: int) -> None:
            if n < len(tokens):
                state.restore(snap)
                self.model.forward(tokens[:n], state, logits="none")
                self.replayed += n
        return _Round(logits, None, commit)


class _StepRound:
    def __init__(self, model, tokens, state, hidden_attr: str | None):
        self.model, self.tokens, self.state = model, list(tokens), state
        self.n_rows = len(self.tokens)
        self.done = 0
        self._hidden_attr = hidden_attr
        self._h: list[torch.Tensor] = []

    def row(self, i: int) -> np.ndarray:
        assert i == self.done, "StepRound rows must be read in order"
        out = self.model.forward([self.tokens[i]], self.state, logits="last")
        if self._hidden_attr:
            self._h.append(getattr(self.model, self._hidden_attr).detach().reshape(1, -1).clone())
        self.done += 1
        return _np(out)[-1]

    @property
    def hidden(self):
        return torch.cat(self._h, 0) if self._h else None

    def commit(self, n: int) -> None:
        if n != self.done:
            raise ValueError(f"a step round ran {self.done} tokens and cannot keep {n}")


class StepVerifier:
    """For one-token step executors: verify sequentially, stop at the first rejection."""
    native = True

    def __init__(self, model, hidden_attr: str | None = None):
        self.model = model
        self.config = model.config
        self.hidden_attr = hidden_attr     # e.g. "xn" on GPUModel: output_norm(h) of the last step

    def prefill(self, ids: Sequence[int], state, chunk: int = 512):
        hs = []
        last = None
        if self.hidden_attr:
            for t in ids:
                last = self.model.forward([t], state, logits="last")
                hs.append(getattr(self.model, self.hidden_attr).detach().reshape(1, -1).clone())
            return _np(last)[-1], torch.cat(hs, 0)
        for i in range(0, len(ids), chunk):
            final = i + chunk >= len(ids)
            last = self.model.forward(ids[i:i + chunk], state, logits="last" if final else "none")
        return _np(last)[-1], None

    def begin(self, tokens: Sequence[int], state) -> _StepRound:
        return _StepRound(self.model, tokens, state, self.hidden_attr)


class BlockVerifier:
    """For executors with `forward_block(tokens, state, keep_states)` (GPUModel): the block runs
    once without committing; the returned Block's `commit(n)` stages the recurrent state after
    block token n-1 and commits n positions (no re-run)."""
    native = True

    def __init__(self, model, hidden_chunk: int = 64):
        self.model = model
        self.config = model.config
        # prefill chunk when the caller wants the hidden rows (MTP): forward_block computes the
        # logits of every row, so the chunk bounds that [chunk, n_vocab] fp32 buffer
        self.hidden_chunk = int(hidden_chunk)
        # the longest draft worth a block: past GEMV_MAX_M tokens the block leaves the skinny
        # GEMV (and the captured verify graph) for the GEMM path; a 17-token block cost 252 ms
        # against 21.6 for 9 on the device (session 13), and the policy's linear cost model then
        # settled on 1-token drafts
        from tightfit.model.batch import GEMV_MAX_M
        from tightfit.model.verify_graph import planned_tokens
        self.max_draft = GEMV_MAX_M - 1
        planned = planned_tokens(model)
        if planned:              # a placed model: the blocks its plan priced (PlanOptions.batch)
            self.max_draft = min(self.max_draft, planned - 1)

    def prefill(self, ids: Sequence[int], state, chunk: int = 512, want_hidden: bool = True):
        """Feed prompt tokens; (logits of the last one, normed hidden of every one or None)."""
        ids = list(ids)
        if not want_hidden:
            last = None
            for i in range(0, len(ids), chunk):
                final = i + chunk >= len(ids)
                last = self.model.forward(ids[i:i + chunk], state, logits="last" if final else "none")
            return _np(last)[-1], None
        hs: list[torch.Tensor] = []
        last = self.prefill_into(ids, state, lambda rows, part: hs.append(rows))
        return last, torch.cat(hs, 0)

    def prefill_into(self, ids: Sequence[int], state, sink) -> np.ndarray:
        """Feed prompt tokens through the executor's own prefill (prefill_hidden: the plain
        prefill's chunks and kernels, so the same state and last logits as without MTP), handing
        each chunk's normed hidden rows to sink(rows, ids) as it goes; the last token's logits.
        Executors without it: forward_block chunks (prefill's hidden rows path)."""
        ids = list(ids)
        if hasattr(self.model, "prefill_hidden"):
            return _np(self.model.prefill_hidden(ids, state, sink))[-1]
        blk = None
        step = max(1, self.hidden_chunk)
        for i in range(0, len(ids), step):
            part = ids[i:i + step]
            blk = self.model.forward_block(part, state, keep_states=False)
            blk.commit(len(part))
            sink(blk.hidden, part)
        return blk.row(blk.n_rows - 1)

    def begin(self, tokens: Sequence[int], state):
        tokens = list(tokens)
        if len(tokens) == 1 and hasattr(self.model, "step_token"):
            # no draft this round: the executor's (graph-captured) one-token step, as plain decode
            out = self.model.forward(tokens, state, logits="last")     # rows read on demand
            h = getattr(self.model, "xn", None)
            h = h.detach().reshape(1, -1).clone() if h is not None else None
            return _Round(out, h, lambda n: None)        # the step committed its one token
        return self.model.forward_block(tokens, state, keep_states=len(tokens) > 1)


def make_verifier(model, mode: str = "auto"):
    """'native' (ReferenceModel), 'block' (models with forward_block), 'replay', 'step', or
    'auto' (the first of native, block, step, replay that the model supports)."""
    from tightfit.model.reference import ReferenceModel
    if mode == "auto":
        if isinstance(model, ReferenceModel):
            mode = "native"
        elif hasattr(model, "forward_block"):
            mode = "block"
        elif hasattr(model, "step_token"):
            mode = "step"
        else:
            mode = "replay"
    if mode == "native":
        if not isinstance(model, ReferenceModel):
            raise ValueError("the native verifier needs a ReferenceModel")
        return NativeVerifier(model)
    if mode == "block":
        if not hasattr(model, "forward_block"):
            raise ValueError("the block verifier needs a model with forward_block")
        return BlockVerifier(model)
    if mode == "replay":
        return ReplayVerifier(model)
    if mode == "step":
        return StepVerifier(model, "xn" if hasattr(model, "xn") else None)
    raise ValueError(f"unknown verifier {mode!r}")


# ---- memory plan line ---------------------------------------------------------------------------
def spec_state_breakdown(config, k: int, dtype_bytes: int = 4, n_ctx: int = 0, mtp: bool = False,
                         kv_dtype_bytes: float = 2) -> dict[str, int]:
    """Bytes per sequence that speculation with k draft tokens adds (verify block k+1):

    * `recurrent_positions`: the SSM state after each of the first k block positions (the last one
      is the ordinary staging bank) for every Gated DeltaNet block, plus the k extra raw conv rows
      of the window the per-position conv states are cut from;
    * `block_logits`: (k+1) logits rows in float32 (the host needs them to accept);
    * `mtp_kv` (mtp=True): the MTP block's own K/V for n_ctx positions, and its draft rows.
    """
    c = config
    k = max(0, int(k))
    n_rec = len(c.recurrent_ids)
    out = {
        "recurrent_positions": n_rec * k * (c.ssm_state_elems + c.conv_dim) * dtype_bytes,
        "block_logits": (k + 1) * c.n_vocab * 4,
    }
    if mtp:
        out["mtp_kv"] = int(2 * c.kv_dim * (int(n_ctx) + k + 1) * kv_dtype_bytes)
    return out


def spec_state_bytes(config, k: int, dtype_bytes: int = 4, n_ctx: int = 0, mtp: bool = False,
                     kv_dtype_bytes: float = 2) -> int:
    """Total of `spec_state_breakdown` (the planner's plan line for speculation)."""
    return sum(spec_state_breakdown(config, k, dtype_bytes, n_ctx, mtp, kv_dtype_bytes).values())
