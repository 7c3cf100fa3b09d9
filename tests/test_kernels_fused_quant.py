"""The producer kernels of norm.py with the activation quantization fused in (`quant_out=`):
add+RMSNorm, SwiGLU and the gated RMSNorm write the float output AND q / d / s16 bit-identical to
running the unfused kernel and then tightfit.kernels.quantize_act.quantize_act on its output (the
`*_ref(..., quant_out=)` references are exactly that pair). Fresh random inputs, the decode step's
sizes (5120, 6144, 17408) and tiny ones, under TRITON_INTERPRET=1 on the CPU or on a GPU."""
from __future__ import annotations

import torch

import _interp

# interpreted on the CPU only when there is no GPU: Triton fixes the mode at import, and on the
# device the compiled kernels are what must be bit-identical (Triton 3.6's interpreter also
# rejects these launches with "only 0-dimensional arrays can be converted to Python scalars")
_interp.interpret_without_gpu()          # tests/_interp.py has the rule

import pytest  # noqa: E402

from tightfit.kernels import norm as N  # noqa: E402
from tightfit.kernels.quantize_act import QuantAct, quantize_act  # noqa: E402

# the device follows how the kernels were built (possibly by an earlier test module), not the
# environment now: interpreted kernels take CPU tensors, compiled ones CUDA tensors
INTERP = _interp.interpreted(N, "tightfit.kernels.quantize_act")
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
DEV = "cpu" if INTERP else "cuda"


def _bufs(rows, k, junk=True):
    """q / d / s16 for [rows, k], filled with junk so that unwritten entries show."""
    q = torch.full((rows, k), 99 if junk else 0, dtype=torch.int8, device=DEV)
    d = torch.full((rows, k // 32), -7.0 if junk else 0.0, dtype=torch.float32, device=DEV)
    s = torch.full((rows, k // 16), 12345 if junk else 0, dtype=torch.int32, device=DEV)
    return q, d, s


def _unfused_quant(out, rows, k, layout):
    """quantize_act after the unfused kernel, the oracle of the fused write."""
    q, d, s = _bufs(rows, k, junk=False)
    quantize_act(out.reshape(rows, k), layout, out=QuantAct(q, d, s, layout, rows, k))
    return q, d, s


def _same(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), \
            (x.dtype, (x.cpu() != y.cpu()).sum().item())


def _rand(shape, g, scale=1.0):
    x = torch.randn(*shape, generator=g) * scale
    # a few exact zeros and an all-zero 32-block (amax = 0: d = 0, q = 0)
    flat = x.view(-1)
    flat[:: 97] = 0.0
    flat[32:64] = 0.0
    return x.to(DEV)


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("rows,n,delta", [(1, 5120, True), (1, 6144, False), (1, 17408, True),
                                          (2, 64, True), (1, 96, False)])
def test_add_rmsnorm_quant(rows, n, delta, layout):
    g = torch.Generator().manual_seed(n + rows + 7 * layout)
    x = _rand((rows, n), g, 3.0)
    dl = _rand((rows, n), g) if delta else None
    w = torch.randn(n, generator=g).to(DEV)
    x_u, x_f = x.clone(), x.clone()
    o_u, o_f = torch.empty_like(x), torch.empty_like(x)
    N.add_rmsnorm(x_u, dl, w, 1e-6, o_u)                     # unfused kernel ...
    want = _unfused_quant(o_u, rows, n, layout)              # ... then quantize_act
    got = _bufs(rows, n)
    N.add_rmsnorm(x_f, dl, w, 1e-6, o_f, quant_out=got, quant_layout=layout)
    assert torch.equal(x_f.cpu(), x_u.cpu()) and torch.equal(o_f.cpu(), o_u.cpu())
    _same(got, want)
    # the reference pair through the same API
    ref = _bufs(rows, n)
    N.add_rmsnorm_ref(x.clone(), dl, w, 1e-6, torch.empty_like(x), quant_out=ref,
                      quant_layout=layout)
    assert (ref[0].cpu().float() - got[0].cpu().float()).abs().max() <= 1


@pytest.mark.parametrize("layout", [0, 3])
@pytest.mark.parametrize("n", [17408, 6144, 5120, 64, 1056])
def test_swiglu_quant(n, layout):
    g = torch.Generator().manual_seed(n + 11 * layout)
    a, b = _rand((1, n), g, 4.0), _rand((1, n), g, 2.0)
    o_u, o_f = torch.empty_like(a), torch.empty_like(a)
    N.swiglu(a, b, o_u)
    want = _unfused_quant(o_u, 1, n, layout)
    got = _bufs(1, n)
    N.swiglu(a, b, o_f, quant_out=got, quant_layout=layout)
    assert torch.equal(o_f.cpu(), o_u.cpu())
    _same(got, want)
    ref = _bufs(1, n)
    N.swiglu_ref(a, b, torch.empty_like(a), quant_out=ref, quant_layout=layout)
    assert (ref[0].cpu().float() - got[0].cpu().float()).abs().max() <= 1


@pytest.mark.parametrize("quant", [False, True])
def test_swiglu_on_the_halves_of_a_merged_product(quant):
    """g and u as the column halves of one [rows, 2W] buffer (a merged gate + up product in the
    verify block): bitwise what the kernel gives on contiguous copies, fused quantization too;
    a view with another layout is refused."""
    rows, w = 5, 1056
    g = torch.Generator().manual_seed(7 + quant)
    gu = _rand((rows, 2 * w), g, 4.0)
    a, b = gu[:, :w], gu[:, w:]
    o_s, o_c = torch.empty(rows, w, device=gu.device), torch.empty(rows, w, device=gu.device)
    q_s, q_c = (_bufs(rows, w), _bufs(rows, w)) if quant else (None, None)
    N.swiglu(a, b, o_s, quant_out=q_s)
    N.swiglu(a.contiguous(), b.contiguous(), o_c, quant_out=q_c)
    assert torch.equal(o_s.cpu(), o_c.cpu())
    if quant:
        _same(q_s, q_c)
    ref = N.swiglu_ref(a, b, torch.empty_like(o_c))
    assert torch.allclose(ref.cpu(), o_c.cpu(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        N.swiglu(gu[:, ::2], b, o_s)              # columns 2 apart
    with pytest.raises(ValueError):
        N.swiglu(a, b.contiguous(), o_s)          # two row strides


@pytest.mark.parametrize("quant", [False, True])
def test_gated_rmsnorm_on_the_tail_of_a_merged_product(quant):
    """z as the last value columns of one [tokens, conv + value] buffer (a merged qkv + gate
    product in the verify block): bitwise what the kernel gives on a contiguous copy."""
    t, hv, s_ = 3, 4, 64
    g = torch.Generator().manual_seed(3 + quant)
    rows = _rand((t, 320 + hv * s_), g, 2.0)
    z = rows[:, 320:].view(t, hv, s_)
    o = _rand((t, hv, s_), g, 1.0)
    w = _rand((s_,), g, 1.0)
    out_s, out_c = torch.empty_like(o), torch.empty_like(o)
    q_s, q_c = (_bufs(1, t * hv * s_), _bufs(1, t * hv * s_)) if quant else (None, None)
    N.gated_rmsnorm(o, z, w, 1e-6, out_s, quant_out=q_s)
    N.gated_rmsnorm(o, z.contiguous(), w, 1e-6, out_c, quant_out=q_c)
    assert torch.equal(out_s.cpu(), out_c.cpu())
    ref = N.gated_rmsnorm_ref(o, z, w, 1e-6, torch.empty_like(o))   # torch on the strided view
    assert torch.allclose(ref.cpu(), out_s.cpu(), rtol=1e-5, atol=1e-6)
    if quant:
        _same(q_s, q_c)
    with pytest.raises(ValueError):               # heads not contiguous
        N.gated_rmsnorm(o, torch.zeros(t, s_, hv, device=o.device).transpose(1, 2), w, 1e-6,
                        out_s)


@pytest.mark.parametrize("layout", [0, 2])
@pytest.mark.parametrize("rows,S", [(48, 128), (6, 128), (4, 64), (3, 32), (2, 96)])
def test_gated_rmsnorm_quant(rows, S, layout):
    g = torch.Generator().manual_seed(rows * S + layout)
    o, z = _rand((rows, S), g, 2.0), _rand((rows, S), g, 3.0)
    w = torch.randn(S, generator=g).to(DEV)
    o_u, o_f = torch.empty_like(o), torch.empty_like(o)
    N.gated_rmsnorm(o, z, w, 1e-6, o_u)
    k = rows * S                                  # the consumer reads all heads as one vector
    want = _unfused_quant(o_u, 1, k, layout)
    got = _bufs(1, k)
    N.gated_rmsnorm(o, z, w, 1e-6, o_f, quant_out=got, quant_layout=layout)
    assert torch.equal(o_f.cpu(), o_u.cpu())
    _same(got, want)
    ref = _bufs(1, k)
    N.gated_rmsnorm_ref(o, z, w, 1e-6, torch.empty_like(o), quant_out=ref, quant_layout=layout)
    assert (ref[0].cpu().float() - got[0].cpu().float()).abs().max() <= 1


def test_quant_out_checks():
    x = torch.randn(1, 48, device=DEV)
    w = torch.ones(48, device=DEV)
    with pytest.raises(ValueError, match="32-blocks"):
        N.add_rmsnorm(x, None, w, 1e-6, torch.empty_like(x), quant_out=_bufs(1, 48))
    x = torch.randn(1, 64, device=DEV)
    with pytest.raises(ValueError, match="layout"):
        N.add_rmsnorm(x, None, torch.ones(64, device=DEV), 1e-6, torch.empty_like(x),
                      quant_out=_bufs(1, 64), quant_layout=7)
    with pytest.raises(ValueError, match="do not match"):
        N.swiglu(x, x, torch.empty_like(x), quant_out=_bufs(1, 32))


def _pairs_oracle(out, rows, k):
    """bf16 of the output (torch's round to nearest even), element 32b + i at half 2i of block b
    and element 32b + 16 + i at half 2i + 1 (i < 16): the pair words gemv_mmh's "foldp" reads."""
    y = out.reshape(rows, k // 32, 32).cpu().to(torch.bfloat16)
    pk = torch.empty_like(y)
    pk[:, :, 0::2] = y[:, :, :16]
    pk[:, :, 1::2] = y[:, :, 16:]
    return pk.reshape(rows, k)


@pytest.mark.parametrize("rows,n,delta", [(1, 5120, True), (5, 5120, True), (2, 64, False)])
def test_add_rmsnorm_packed_pairs(rows, n, delta):
    """quant_layout=PACK_LAYOUT: the float output as before, and its bf16 pairs instead of int8."""
    g = torch.Generator().manual_seed(3 * n + rows)
    x = _rand((rows, n), g, 3.0)
    dl = _rand((rows, n), g) if delta else None
    w = torch.randn(n, generator=g).to(DEV)
    x_u, x_f = x.clone(), x.clone()
    o_u, o_f = torch.empty_like(x), torch.empty_like(x)
    N.add_rmsnorm(x_u, dl, w, 1e-6, o_u)
    pk = torch.full((rows, n), 77.0, dtype=torch.bfloat16, device=DEV)
    N.add_rmsnorm(x_f, dl, w, 1e-6, o_f, quant_out=(pk,), quant_layout=N.PACK_LAYOUT)
    assert torch.equal(x_f.cpu(), x_u.cpu()) and torch.equal(o_f.cpu(), o_u.cpu())
    want = _pairs_oracle(o_u, rows, n)
    assert torch.equal(pk.cpu(), want)
    ref = torch.zeros_like(pk)
    N.add_rmsnorm_ref(x.clone(), dl, w, 1e-6, torch.empty_like(x), quant_out=(ref,),
                      quant_layout=N.PACK_LAYOUT)
    assert (ref.cpu().float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    with pytest.raises(ValueError, match="bf16 buffer"):
        N.add_rmsnorm(x.clone(), dl, w, 1e-6, torch.empty_like(x),
                      quant_out=(torch.empty(rows, n, device=DEV),), quant_layout=N.PACK_LAYOUT)


@pytest.mark.parametrize("layout", [0, 1])
def test_add_rmsnorm_int8_and_packed_pairs_together(layout):
    """pack_out beside quant_out: the int8 copy exactly as alone, and the pairs exactly as alone
    (one launch writes both, for an input whose consumers want both)."""
    rows, n = 5, 5120
    g = torch.Generator().manual_seed(40 + layout)
    x = _rand((rows, n), g, 3.0)
    dl = _rand((rows, n), g)
    w = torch.randn(n, generator=g).to(DEV)
    o_u = torch.empty_like(x)
    N.add_rmsnorm(x.clone(), dl, w, 1e-6, o_u)
    want_q = _unfused_quant(o_u, rows, n, layout)
    got_q = _bufs(rows, n)
    pk = torch.full((rows, n), 77.0, dtype=torch.bfloat16, device=DEV)
    o_f = torch.empty_like(x)
    N.add_rmsnorm(x.clone(), dl, w, 1e-6, o_f, quant_out=got_q, quant_layout=layout, pack_out=pk)
    assert torch.equal(o_f.cpu(), o_u.cpu())
    _same(got_q, want_q)
    assert torch.equal(pk.cpu(), _pairs_oracle(o_u, rows, n))
    ref_q, ref_pk = _bufs(rows, n), torch.zeros_like(pk)
    N.add_rmsnorm_ref(x.clone(), dl, w, 1e-6, torch.empty_like(x), quant_out=ref_q,
                      quant_layout=layout, pack_out=ref_pk)
    assert (ref_q[0].cpu().float() - got_q[0].cpu().float()).abs().max() <= 1
    want = _pairs_oracle(o_u, rows, n).float()
    assert (ref_pk.cpu().float() - want).abs().max() <= 2 ** -7 * want.abs().max()
