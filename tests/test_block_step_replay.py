"""The verify block's recurrent rollback by replay (tightfit.kernels.block_step, issue 10).

A partial accept of j < M block tokens rebuilds the SSM state after token j-1 from the state
before the block and the block's replay inputs (k, delta, decay per head and token). The oracle
is the block kernel itself run on the first j tokens only: it leaves the state after token j-1
in the staging bank by its own update, so the replayed state must equal it bit for bit (the
kernel rounds each update as one multiply and one fma, the replay repeats exactly that). Run on
the torch reference, on the Triton kernels under TRITON_INTERPRET=1, and compiled on a GPU.
Also the conv kernel's one-program-per-token grid against its reference."""
from __future__ import annotations

import pytest
import torch

import _interp

_interp.interpret_without_gpu()

from tightfit.kernels import block_step as BS  # noqa: E402

INTERP = _interp.interpreted("tightfit.kernels.block_step")
DEV = "cuda" if torch.cuda.is_available() and not INTERP else "cpu"


def _impls():
    out = [("ref", BS.gdn_block_ref, BS.commit_block_ref)]
    if INTERP or DEV == "cuda":
        out.append(("triton", BS.gdn_block, BS.commit_block))
    return out


def _problem(seed, M, n_rec=3, hk=2, hv=4, s=32, km1=3):
    g = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * s + hv * s
    r = lambda *sh: torch.randn(*sh, generator=g)                       # noqa: E731
    p = dict(y=r(M, conv_dim), alpha=r(M, hv), beta=r(M, hv), dtb=r(hv) * 0.5,
             ssma=-torch.rand(hv, generator=g) * 2, ssm=torch.zeros(2, n_rec, hv, s, s),
             conv=torch.zeros(2, n_rec, km1, conv_dim), rows=r(n_rec, M, conv_dim),
             rin=torch.full((n_rec, max(1, M - 1), hv, 2 * s + 1), float("nan")),
             hk=hk, hv=hv, s=s)
    p["ssm"][0] = r(n_rec, hv, s, s) * 0.3                              # active bank 0
    p["conv"][0] = r(n_rec, km1, conv_dim)
    return {k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in p.items()}


def _status(dev):
    return torch.tensor([0, 0, 7, 0], dtype=torch.int32, device=dev)


@pytest.mark.parametrize("name,gdn,commit", _impls(), ids=[i[0] for i in _impls()])
@pytest.mark.parametrize("M", [2, 5, 9])
def test_partial_commit_replays_the_blocks_own_state_bitwise(name, gdn, commit, M):
    slot = 1
    for j in range(1, M):
        p = _problem(100 + M, M)
        st = _status(DEV)
        o = torch.empty(M, p["hv"], p["s"], device=DEV)
        gdn(p["y"], p["alpha"], p["beta"], p["dtb"], p["ssma"], p["ssm"], p["rin"][slot], o, st,
            slot, p["hk"], 1e-6)
        before = p["ssm"][0].clone()
        commit(p["conv"], p["ssm"], p["rows"], p["rin"], st, j, M)
        assert int(st[0]) == 1 and int(st[2]) == 7 + j
        assert torch.equal(p["ssm"][0], before)          # the old bank is left as it was
        got = p["ssm"][1, slot].clone()

        q = _problem(100 + M, M)                          # same inputs, a block of j tokens only
        st2 = _status(DEV)
        o2 = torch.empty(j, q["hv"], q["s"], device=DEV)
        gdn(q["y"][:j], q["alpha"][:j], q["beta"][:j], q["dtb"], q["ssma"], q["ssm"],
            q["rin"][slot], o2, st2, slot, q["hk"], 1e-6)
        want = q["ssm"][1, slot]
        assert torch.isfinite(want).all()
        assert torch.equal(got, want), (name, M, j, (got - want).abs().max().item(),
                                        _which(p, slot, j, got, want))
        assert torch.equal(o[:j], o2)                     # the block's outputs do not depend on M


def _which(p, slot, j, got, want):
    """On a mismatch: how many elements of each side differ from the update emulated in float64
    from the replay inputs (one rounding for the decay product, one for the fma)."""
    S = p["s"]
    st = p["ssm"][0, slot].double()
    for t in range(j):
        r = p["rin"][slot, t].double()
        st = (st * r[:, 2 * S][:, None, None]).float().double()
        st = (r[:, :S][:, :, None] * r[:, S:2 * S][:, None, :] + st).float().double()
    st = st.float()
    return {"replay_off": int((got != st).sum()), "block_off": int((want != st).sum()),
            "n": st.numel()}


@pytest.mark.skipif(not (INTERP or DEV == "cuda"), reason="needs TRITON_INTERPRET=1 or CUDA")
@pytest.mark.parametrize("M", [1, 4])
def test_kernels_match_references(M):
    """The Triton block kernels against their torch references on fresh random inputs: outputs,
    replay inputs, the committed state."""
    a, b = _problem(7 + M, M), _problem(7 + M, M)
    sa, sb = _status(DEV), _status(DEV)
    oa = torch.empty(M, a["hv"], a["s"], device=DEV)
    ob = torch.empty_like(oa)
    BS.gdn_block(a["y"], a["alpha"], a["beta"], a["dtb"], a["ssma"], a["ssm"], a["rin"][2], oa,
                 sa, 2, a["hk"], 1e-6)
    BS.gdn_block_ref(b["y"], b["alpha"], b["beta"], b["dtb"], b["ssma"], b["ssm"], b["rin"][2],
                     ob, sb, 2, b["hk"], 1e-6)
    torch.testing.assert_close(oa, ob, rtol=1e-5, atol=1e-5)
    if M > 1:
        torch.testing.assert_close(a["rin"][2, :M - 1], b["rin"][2, :M - 1], rtol=1e-5, atol=1e-5)
    j = max(1, M - 1)
    BS.commit_block(a["conv"], a["ssm"], a["rows"], a["rin"], sa, j, M)
    BS.commit_block_ref(b["conv"], b["ssm"], b["rows"], b["rin"], sb, j, M)
    torch.testing.assert_close(a["ssm"][1, 2], b["ssm"][1, 2], rtol=1e-5, atol=1e-5)
    assert torch.equal(a["conv"][1], b["conv"][1])

    C = a["y"].shape[1]
    ya, yb = torch.empty(M, C, device=DEV), torch.empty(M, C, device=DEV)
    w = torch.randn(C, 4, generator=torch.Generator().manual_seed(M)).to(DEV)
    st = _status(DEV)
    BS.conv_block(a["rows"][1, :M], a["conv"], w, ya, st, 1)
    BS.conv_block_ref(a["rows"][1, :M], a["conv"], w, yb, st, 1)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,gdn,commit", _impls(), ids=[i[0] for i in _impls()])
@pytest.mark.parametrize("M", [1, 5])
def test_gates_as_halves_of_one_merged_product(name, gdn, commit, M):
    """beta and alpha as the column halves of one [M, 2 Hv] product (ssm_beta + ssm_alpha in one
    launch, the verify block with merged gates) give the block exactly what two contiguous
    buffers give it: outputs, replay inputs, the staged state."""
    a, b = _problem(40 + M, M), _problem(40 + M, M)
    ba = torch.cat([b["beta"], b["alpha"]], 1)        # row t = [beta_t, alpha_t]
    hv = b["hv"]
    beta, alpha = ba[:, :hv], ba[:, hv:]
    assert beta.stride(0) == 2 * hv and torch.equal(alpha, a["alpha"])
    oa = torch.empty(M, a["hv"], a["s"], device=DEV)
    ob = torch.empty_like(oa)
    gdn(a["y"], a["alpha"], a["beta"], a["dtb"], a["ssma"], a["ssm"], a["rin"][0], oa,
        _status(DEV), 0, a["hk"], 1e-6)
    gdn(b["y"], alpha, beta, b["dtb"], b["ssma"], b["ssm"], b["rin"][0], ob, _status(DEV), 0,
        b["hk"], 1e-6)
    assert torch.equal(oa, ob)
    assert torch.equal(a["ssm"][1, 0], b["ssm"][1, 0])
    if M > 1:
        assert torch.equal(a["rin"][0, :M - 1], b["rin"][0, :M - 1])
    # and the references agree with the kernel on the strided inputs
    c = _problem(40 + M, M)
    oc = torch.empty_like(oa)
    BS.gdn_block_ref(c["y"], c["alpha"], c["beta"], c["dtb"], c["ssma"], c["ssm"], c["rin"][0],
                     oc, _status(DEV), 0, c["hk"], 1e-6)
    torch.testing.assert_close(ob, oc, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("V", [1000, 4096 * 3 + 17])
def test_argmax_rows_first_index_and_status_words(V):
    """The verify block's in-graph argmax against torch.argmax (first index of the max on ties,
    maxima placed in different first-stage blocks), and the status words it copies beside."""
    impls = [BS.argmax_rows_ref] + ([BS.argmax_rows] if INTERP or DEV == "cuda" else [])
    g = torch.Generator().manual_seed(V)
    M = 5
    x = torch.randn(M, V, generator=g)
    x[1, [3, V - 1]] = 9.0                          # a tie: the first index wins
    x[2, [V // 2, 7]] = 11.0
    x[3, :] = -2.0                                  # all equal: index 0
    x = x.to(DEV)
    vs = torch.tensor([0, 1, 0, 0], dtype=torch.int32, device=DEV)
    ss = torch.tensor([1, 0, 42, 0], dtype=torch.int32, device=DEV)
    nb = BS.argmax_parts(V)
    for f in impls:
        out = torch.full((M + 3,), -1, dtype=torch.int64, device=DEV)
        f(x, torch.empty(M * nb, device=DEV), torch.empty(M * nb, dtype=torch.int32, device=DEV),
          out, vs, ss)
        got = out.tolist()
        assert got[:M] == torch.argmax(x, dim=-1).tolist()
        assert got[1] == 3 and got[2] == 7 and got[3] == 0
        assert got[M:] == [1, 0, 42]
