"""Gated DeltaNet over a block of tokens (prefill / speculative verify), spec/qwen35.md §3.4.

Per V head, with the state S [key, value] (HF orientation, tightfit/runtime/state.py) and, per
token t, log-decay g_t <= 0, write strength beta_t, L2-normalised k_t, q_t (q also times S^-1/2):

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),
    o_t = S_t^T q_t.

Chunked form (derived here for this module; a chunk of C tokens starting from state S0, G_t the
cumulative log-decay inside the chunk, Gamma_t = exp(G_t)). Unrolling the recurrence,
S_t = Gamma_t S0 + sum_{s<=t} exp(G_t - G_s) k_s u_s^T, and substituting it into u_t:

    (I + A) U = diag(beta) V - diag(beta Gamma) K S0,
    A[t, s] = beta_t exp(G_t - G_s) (k_t . k_s)  for s < t (strictly lower triangular),

so with the unit-lower-triangular solve T = (I + A)^-1:  Ub = T diag(beta) V, W = T diag(beta Gamma) K,
U = Ub - W S0. Then O = diag(Gamma) Q S0 + (Q K^T ⊙ D) U with D[t, s] = exp(G_t - G_s) for
s <= t, and the chunk's end state S_C = Gamma_C S0 + (K ⊙ exp(G_C - G))^T U. Every exponent is
a difference G_t - G_s with s <= t (or G itself), so nothing overflows. Only the last three
products depend on S0: the intra-chunk parts (A, the solve, Q K^T ⊙ D) run for all chunks at
once, the chunk loop is four small batched matmuls.

Per-position states (speculative verify, `keep=True`): S after block token j is rebuilt from the
chunk's start state, K, U and G in one product (`KeptStates.state_at(j)`), so a verify block keeps
O(n (Dk + Dv)) floats per head instead of n full states.

The causal depthwise conv over the block (`causal_conv`) continues from the stored K-1 raw rows
and returns the whole window [K-1+n, C]: the conv state after block token j is rows j+1..j+K-1.

GPU: `chunk_gdn` uses fla-core's chunk_gated_delta_rule (optional run-time dependency, PyPI
`fla-core`, call checked against 0.6.0) by default on CUDA when it imports and keep=False
(TIGHTFIT_GDN=torch forces this module's path; a failing fla call falls back to it for the rest
of the process); otherwise this torch implementation (its matmuls run on the GPU as well). `gdn_recurrent_ref` is the slow token-by-token reference.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DEFAULT_CHUNK = 64


# ---- causal conv ------------------------------------------------------------------------------------
def causal_conv(u: torch.Tensor, conv_prev: torch.Tensor, w: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """u [n, C] new pre-conv rows, conv_prev [K-1, C] stored raw rows (oldest first), w [C, K]
    (tap 0 = oldest) -> (silu(conv) [n, C], window [K-1+n, C]). New conv state = window[-(K-1):]."""
    n = u.shape[0]
    K = w.shape[1]
    hist = torch.cat([conv_prev.to(u.dtype), u], dim=0)
    acc = hist[0:n] * w[:, 0]
    for j in range(1, K):
        acc = acc + hist[j:j + n] * w[:, j]
    return F.silu(acc), hist


def causal_conv_ref(u: torch.Tensor, conv_prev: torch.Tensor, w: torch.Tensor):
    """Reference: the window/unfold form of ReferenceModel._gated_deltanet."""
    K = w.shape[1]
    hist = torch.cat([conv_prev.to(u.dtype), u], dim=0)
    return F.silu((hist.unfold(0, K, 1) * w).sum(-1)), hist


# ---- per-token inputs -------------------------------------------------------------------------------
def gdn_inputs(y: torch.Tensor, alpha: torch.Tensor, beta_raw: torch.Tensor, dt_bias: torch.Tensor,
               ssm_a: torch.Tensor, Hk: int, Hv: int, S: int, eps: float):
    """y [n, conv_dim] (q | k | v after conv+SiLU), alpha/beta_raw [n, Hv] ->
    q, k [n, Hv, S] (normalised, K head h mod Hk per V head h), v [n, Hv, S], g, beta [n, Hv]."""
    n = y.shape[0]
    kd = Hk * S
    q = y[:, :kd].reshape(n, Hk, S)
    k = y[:, kd:2 * kd].reshape(n, Hk, S)
    v = y[:, 2 * kd:].reshape(n, Hv, S)
    q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + eps) * (S ** -0.5)
    k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)
    r = Hv // Hk
    g = F.softplus(alpha + dt_bias) * ssm_a
    return q.repeat(1, r, 1), k.repeat(1, r, 1), v, g, torch.sigmoid(beta_raw)


# ---- the recurrence -----------------------------------------------------------------------------
def gdn_recurrent_ref(q, k, v, g, beta, S0, keep: bool = False):
    """Token-by-token reference. q, k [n, H, Dk], v [n, H, Dv], g, beta [n, H], S0 [H, Dk, Dv].
    Returns (o [n, H, Dv], final state, list of states after each token if keep)."""
    st = S0.clone()
    out = torch.empty(v.shape, dtype=st.dtype, device=st.device)
    states = []
    for t in range(q.shape[0]):
        st = st * torch.exp(g[t])[:, None, None]
        kv = torch.einsum("hi,hij->hj", k[t], st)
        delta = beta[t][:, None] * (v[t] - kv)
        st = st + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hi,hij->hj", q[t], st)
        if keep:
            states.append(st.clone())
    return out, st, states


@dataclass
class KeptStates:
    """What a keep=True block needs to rebuild the state after any of its tokens."""
    starts: list          # state at each chunk start [H, Dk, Dv] (chunk 0: S0 itself, not a copy)
    k: torch.Tensor       # [H, N, C, Dk]
    u: torch.Tensor       # [H, N, C, Dv]
    G: torch.Tensor       # [H, N, C] cumulative log-decay inside each chunk
    chunk: int

    def state_at(self, j: int) -> torch.Tensor:
        """State after block token j (0-based)."""
        c, i = divmod(j, self.chunk)
        G = self.G[:, c, :i + 1]
        gl = G[:, -1]
        kd = self.k[:, c, :i + 1] * torch.exp(gl[:, None] - G)[..., None]
        return (torch.exp(gl)[:, None, None] * self.starts[c]
                + kd.transpose(-1, -2) @ self.u[:, c, :i + 1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.u, self.G))


def _chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[n, H, ...] -> [H, N, C, ...] zero-padded to N*C tokens."""
    n = x.shape[0]
    N = -(-n // C)
    x = x.transpose(0, 1)
    if N * C != n:
        pad = [0, 0] * (x.dim() - 2) + [0, N * C - n]
        x = F.pad(x, pad)
    return x.reshape(x.shape[0], N, C, *x.shape[2:])


def chunk_gdn_torch(q, k, v, g, beta, S0, chunk: int = DEFAULT_CHUNK, keep: bool = False):
    """Chunked gated delta rule (module docstring). Inputs as gdn_recurrent_ref; float32 math.
    Returns (o [n, H, Dv], final state [H, Dk, Dv], KeptStates or None)."""
    n, H, Dk = k.shape
    Dv = v.shape[-1]
    dt = torch.float32 if S0.dtype != torch.float64 else torch.float64
    C = max(1, min(int(chunk), n))
    qc, kc, vc = (_chunks(t.to(dt), C) for t in (q, k, v))       # padded tokens: q=k=v=0
    gc, bc = _chunks(g.to(dt), C), _chunks(beta.to(dt), C)        # g=0 (no decay), beta=0
    N = qc.shape[1]
    G = gc.cumsum(-1)                                             # [H, N, C]
    eG = torch.exp(G)
    ar = torch.arange(C, device=q.device)
    incl = ar[:, None] >= ar[None, :]
    ninf = torch.tensor(float("-inf"), dtype=dt, device=q.device)
    # one exp for both masks: D[t, s] = exp(G_t - G_s) for s <= t, 0 above; the strict part is
    # D with its unit diagonal ignored (solve_triangular(unitriangular=True) never reads it)
    D = torch.exp(torch.where(incl, G[..., :, None] - G[..., None, :], ninf))   # [H, N, C, C]
    A = ((kc * bc[..., None]) @ kc.transpose(-1, -2)) * D         # lower part = the A of the doc
    rhs = torch.cat([vc * bc[..., None], kc * (bc * eG)[..., None]], dim=-1)
    sol = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    Ub = sol[..., :Dv]
    P = (qc @ kc.transpose(-1, -2)) * D                           # [H, N, C, C]
    # the two products with the chunk's start state in one: [Q diag(Gamma); W] S
    QW = torch.cat([qc * eG[..., None], sol[..., Dv:]], dim=-2)   # [H, N, 2C, Dk]
    gl = G[..., -1]                                               # [H, N]
    KdT = (kc * torch.exp(gl[..., None] - G)[..., None]).transpose(-1, -2).contiguous()
    dec = torch.exp(gl)[..., None, None]                          # [H, N, 1, 1]
    S = S0.to(dt)
    O = torch.empty(H, N, C, Dv, dtype=dt, device=q.device)
    U = torch.empty_like(Ub) if keep else None
    starts = []
    for c in range(N):
        if keep:
            starts.append(S)
        QS = QW[:, c] @ S                                         # [H, 2C, Dv]
        Uc = Ub[:, c] - QS[:, C:]
        O[:, c] = torch.baddbmm(QS[:, :C], P[:, c], Uc)
        S = torch.baddbmm(dec[:, c] * S, KdT[:, c], Uc)
        if keep:
            U[:, c] = Uc
    o = O.reshape(H, N * C, Dv)[:, :n].transpose(0, 1)
    kept = KeptStates(starts, kc, U, G, C) if keep else None
    return o, S, kept


_FLA_STATE: dict = {"import": None, "failed": None}


def _fla_available() -> bool:
    if _FLA_STATE["import"] is None:
        try:
            import fla.ops.gated_delta_rule  # noqa: F401
            _FLA_STATE["import"] = True
        except Exception:  # noqa: BLE001
            _FLA_STATE["import"] = False
    return bool(_FLA_STATE["import"])


def _fla_kwargs(fn) -> dict:
    """Keyword arguments for this fla-core version, chosen from its signature. 0.6.0 (the wheel in
    .whl, read for this): chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
    output_final_state=False, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, ..., **kwargs), and it raises
    when `head_first` is passed at all. Older releases named `head_first` (default True in some):
    they get head_first=False. The flags that must be off for our inputs (q/k already L2-normalised
    and scaled, beta already a sigmoid, state [K, V]) are passed explicitly where named, so a
    release that flips a default cannot change the math silently."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    out = {"head_first": False} if "head_first" in params else {}
    for flag in ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "state_v_first",
                 "transpose_state_layout"):
        if flag in params:
            out[flag] = False
    return out


def chunk_gdn_fla(q, k, v, g, beta, S0):
    """fla-core's chunk_gated_delta_rule (GPU only); same contract as chunk_gdn_torch, keep=False.

    fla-core 0.6.0 API (checked against the wheel's source): q, k [B, T, H, K], v [B, T, HV, V],
    g [B, T, HV] natural-log decay (fla converts to log2 itself; use_gate_in_kernel off by
    default), beta [B, T, HV] post-sigmoid (use_beta_sigmoid_in_kernel=False), scale multiplies
    q (ours is already folded into q: scale=1.0; None would mean K^-0.5), no in-kernel L2 norm
    (ours is done in gdn_inputs with the model's eps), initial_state / final state [N, HV, K, V]
    fp32 in K-first layout (state_v_first=False), our [key, value] orientation; output o
    [B, T, HV, V] in q's dtype. Its GVA maps V head hv to q/k head hv // (HV / H) (grouped),
    while qwen35 tiles (hv mod Hk, gdn_inputs): q and k go in already expanded to HV heads, so
    H == HV here."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    if q.shape[1] != v.shape[1]:
        raise ValueError("chunk_gdn_fla: q/k must be expanded to the V heads (gdn_inputs)")
    o, st = chunk_gated_delta_rule(
        q[None].contiguous(), k[None].contiguous(), v[None].contiguous(),
        g[None].to(torch.float32).contiguous(), beta[None].contiguous(), scale=1.0,
        initial_state=S0[None].to(torch.float32).contiguous(), output_final_state=True,
        **_fla_kwargs(chunk_gated_delta_rule))
    return o[0].to(torch.float32), st[0].to(torch.float32), None


def gdn_backend(device: str | torch.device = "cuda") -> str:
    """'fla' or 'torch' for blocks on `device`. TIGHTFIT_GDN=torch forces the torch path;
    otherwise (unset, 'auto' or 'fla') fla-core is used on CUDA when it imports and has not
    failed in this process; the CPU always runs the torch path."""
    want = os.environ.get("TIGHTFIT_GDN", "auto").strip().lower()
    if want == "torch" or torch.device(device).type != "cuda":
        return "torch"
    if _FLA_STATE["failed"] is not None or not _fla_available():
        return "torch"
    return "fla"


def chunk_gdn(q, k, v, g, beta, S0, chunk: int = DEFAULT_CHUNK, keep: bool = False):
    """Chunked gated delta rule: fla-core on CUDA (gdn_backend) unless keep=True (per-position
    states need this module's KeptStates), else chunk_gdn_torch. A failing fla call (API drift,
    unsupported shape) is reported once and the process stays on the torch path."""
    if not keep and gdn_backend(q.device) == "fla":
        try:
            return chunk_gdn_fla(q, k, v, g, beta, S0)
        except Exception as e:  # noqa: BLE001 - fall back, do not fail the prefill
            import warnings
            _FLA_STATE["failed"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"fla-core chunk_gated_delta_rule failed ({_FLA_STATE['failed'][:200]});"
                          " using the torch chunked path from now on", RuntimeWarning)
    return chunk_gdn_torch(q, k, v, g, beta, S0, chunk=chunk, keep=keep)


def workspace_bytes(n: int, H: int, Dk: int, Dv: int, chunk: int = DEFAULT_CHUNK,
                    keep: bool = False) -> int:
    """fp32 temporaries of one chunk_gdn_torch call over n tokens (peak, roughly)."""
    N = math.ceil(n / max(1, chunk))
    C = min(chunk, n)
    per = H * N * C
    b = per * (3 * Dk + 3 * Dv + 2 * (Dv + Dk) + 4 * C + 6) * 4
    if keep:
        b += per * (Dk + Dv + 1) * 4 + N * H * Dk * Dv * 4
    return int(b)
