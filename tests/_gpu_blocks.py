"""Shared by the GEMV device tests (gemv_cuda, gemv_mma, PDL chains): random raw GGUF blocks on a
torch device (random bytes with every fp16 scale field set to 1e-3..1e-2, so outputs stay finite),
the float64 oracle on sampled rows, and CUDA-graph capture on a side stream."""
from __future__ import annotations

import numpy as np
import torch

from tightfit.quant.traits import F16_SCALE_OFFSETS as F16_FIELDS, traits


def rand_weights(t: int, n_out: int, n_in: int, seed: int, device: str = "cuda",
                 scale: tuple[float, float] = (0.001, 0.01)) -> torch.Tensor:
    """n_out rows of n_in weights of GGML type t as one flat uint8 tensor; the fp16 block scales
    uniform in `scale` (the default is normal fp16; (3e-6, 5e-5) makes most of them fp16
    subnormals, as the seed-mix 27B's IQ4_XS / Q5_K / Q6_K scales are)."""
    tr = traits(t)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    raw = torch.randint(0, 256, (n_out * (n_in // tr.block_size), tr.type_size), dtype=torch.uint8,
                        device=device, generator=g)
    for off in F16_FIELDS[t]:
        lo, hi = scale
        sc = (torch.rand(raw.shape[0], device=device, generator=g) * (hi - lo) + lo).half()
        raw[:, off:off + 2] = sc.view(torch.uint8).view(-1, 2)
    return raw.view(-1)


def dequant_rows(raw: np.ndarray, t: int, n_rows: int, n_in: int) -> np.ndarray:
    """float64 rows: gguf-py's dequantizer where the installed version has the type, else
    tightfit's reference (checked against gguf-py wherever gguf-py has the type, in CI)."""
    if traits(t).gguf_dequant:
        import gguf
        from gguf.quants import dequantize as gg_dequantize
        w = gg_dequantize(raw, gguf.GGMLQuantizationType(t))
    else:
        from tightfit.quant.dequant import dequantize
        w = dequantize(raw.reshape(-1), t, (n_rows, n_in))
    return np.asarray(w, np.float64).reshape(n_rows, n_in)


def gemv_errors(w: torch.Tensor, t: int, n_out: int, x: torch.Tensor, act, y,
                seed: int = 0, tail: int = 3) -> tuple[float, float]:
    """Relative errors (Frobenius, on 48 random rows plus the last `tail`: the tails) of a GEMV
    output y [N, n_out] computed from act = quantize_act(x, 0): vs the float64 product on the
    SAME int8 x the kernel saw (the device may round an exact tie one step apart from the NumPy
    quantizer, ~1e-4 of the result, so that quantizer is only checked to within one step), and
    vs the float64 product on the float x."""
    from tightfit.kernels.quantize_act import quantize_act_ref
    n, n_in = x.shape
    rb = n_in // traits(t).block_size * traits(t).type_size
    rng = np.random.default_rng(seed)
    sel = np.unique(np.concatenate([rng.choice(n_out, size=min(48, n_out), replace=False),
                                    np.arange(max(0, n_out - tail), n_out)]))
    wsel = w.view(n_out, rb)[torch.from_numpy(sel).to(w.device)].cpu().numpy()
    W = dequant_rows(wsel, t, len(sel), n_in)
    q = act.q.cpu().numpy().astype(np.float64).reshape(n, n_in // 32, 32)
    d = act.d.cpu().numpy().astype(np.float64).reshape(n, n_in // 32)
    xn = x.cpu().numpy()
    q_ref, _, _ = quantize_act_ref(xn)
    assert np.abs(q_ref.reshape(q.shape) - q).max() <= 1, "device quantize_act drifted"
    refq = (q * d[..., None]).reshape(n, n_in) @ W.T
    ref = xn.astype(np.float64) @ W.T
    ys = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)[:, sel]
    return (float(np.linalg.norm(ys - refq) / np.linalg.norm(refq)),
            float(np.linalg.norm(ys - ref) / np.linalg.norm(ref)))


def capture(fn) -> "torch.cuda.CUDAGraph":
    """fn() once eagerly (modules compiled, geometry cached), then captured on a side stream."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def check_graph_replay(gemv, t: int, n: int, n_in: int = 5120, n_out: int = 1024,
                       atomic: bool = False) -> None:
    """Activation quantization + `gemv(act, w, t, n_out, out)` captured in a CUDA graph and
    replayed on fresh x (output poisoned before each replay) equals the eager call bitwise;
    atomic=True (kernels that add split tiles atomically: the fp32 summation order differs
    between runs): within 1e-5 relative and 1e-5 of max |out|."""
    from tightfit.kernels.quantize_act import quantize_act
    w = rand_weights(t, n_out, n_in, 11)
    x = torch.randn(n, n_in, device="cuda")
    qa = quantize_act(x, 0)
    out = torch.full((n, n_out), float("nan"), device="cuda")
    g = capture(lambda: (quantize_act(x, 0, out=qa), gemv(qa, w, t, n_out, out)))
    for _ in range(2):
        x.copy_(torch.randn(n, n_in, device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = gemv(quantize_act(x, 0), w, t, n_out, torch.empty(n, n_out, device="cuda"))
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        if atomic:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
        else:
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
