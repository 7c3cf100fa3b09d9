"""Programmatic dependent launch (TIGHTFIT_PDL=1, tightfit/kernels/pdl.py) of the CUDA C++ kernels
on the device (sm_90 + cupy; skipped otherwise).

A chain of 16 dependent CUDA GEMVs (Q4_K / IQ4_XS / Q8_0 / Q5_K / Q6_K, 2048 <-> 4352 wide, some
square) with a Triton RMSNorm + activation quantization between them, captured in a CUDA graph with
PDL off and on, replayed on fresh inputs after every buffer was poisoned: every layer's output must
be bitwise equal to the eager, stream-ordered PDL-off run (the kernels are deterministic), and the
first GEMV within the device test's bounds of the float64 product (tests/test_gemv_cuda_device.py:
1e-4 relative vs the quantized x, 2e-2 vs the float x). The chain holds the hazards PDL could
break: read after a Triton write (every layer), a Triton write after a GEMV read of the same
buffer (square layers), two GEMVs writing one buffer back to back (a decoy before layer 5).
The CUDA quantized-KV attention (graph, q and status written inside it) is compared PDL on vs off
bitwise and against the float64 reference.

    python3 tests/test_pdl_device.py --bench    # back-to-back GEMV timing, PDL off vs on
"""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import os  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.quant.traits import traits  # noqa: E402
from _gpu_blocks import capture, gemv_errors, rand_weights  # noqa: E402
from _kv_cases import check_close, quant_kv_case  # noqa: E402

TYPES = (12, 23, 8, 13, 14)               # Q4_K IQ4_XS Q8_0 Q5_K Q6_K
NAMES = {12: "Q4_K", 23: "IQ4_XS", 8: "Q8_0", 13: "Q5_K", 14: "Q6_K"}
A, B = 2048, 4352                          # B >= gemv_cuda.V3_MIN_OUT: v3 runs at N >= 4
DIMS = [A, B, A, A, B, B, A, B, A, A, B, A, B, B, A, B, A]   # layer i: DIMS[i] -> DIMS[i + 1]
DECOY_LAYER = 5


def _device_ok() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability()[0] < 9:
        return "PDL needs sm_90"
    try:
        import cupy  # noqa: F401
    except Exception:  # noqa: BLE001
        return "no cupy"
    return None


# device-only tests: sm_90 + cupy (CUDA GEMV / attention kernels); skipped elsewhere
_WHY = _device_ok()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]


class Chain:
    """Buffers, weights and the launch sequence of the 16-layer chain for N columns."""

    def __init__(self, n: int, seed: int = 0):
        from tightfit.kernels.quantize_act import QuantAct
        self.n = n
        dev = "cuda"
        self.x = torch.empty(n, DIMS[0], device=dev)
        self.layers = [(TYPES[i % len(TYPES)], rand_weights(TYPES[i % len(TYPES)], DIMS[i + 1],
                                                            DIMS[i], seed + i), DIMS[i], DIMS[i + 1])
                       for i in range(len(DIMS) - 1)]
        t5, _, i5, o5 = self.layers[DECOY_LAYER]
        self.decoy = rand_weights(t5, o5, i5, seed + 1000)
        self.y = [torch.empty(n, o, device=dev) for (_, _, _, o) in self.layers]
        self.h = {d: torch.empty(n, d, device=dev) for d in (A, B)}
        self.norm_w = {d: 1 + 0.1 * torch.randn(d, device=dev) for d in (A, B)}
        self.act = {d: QuantAct(torch.empty(n, d, dtype=torch.int8, device=dev),
                                torch.empty(n, d // 32, device=dev),
                                torch.empty(n, d // 16, dtype=torch.int32, device=dev), 0, n, d)
                    for d in (A, B)}

    def poison(self):
        for t in self.y + list(self.h.values()):
            t.fill_(float("nan"))
        for a in self.act.values():
            a.q.fill_(-128)
            a.d.fill_(float("nan"))
            a.s16.fill_(-(2 ** 31))

    def run(self):
        from tightfit.kernels import gemv_cuda as gc
        from tightfit.kernels.norm import add_rmsnorm
        from tightfit.kernels.quantize_act import quantize_act
        quantize_act(self.x, 0, out=self.act[DIMS[0]])
        for i, (t, w, n_in, n_out) in enumerate(self.layers):
            if i == DECOY_LAYER:      # WAW: the real GEMV below must land after this one
                gc.gemv_cuda(self.act[n_in], self.decoy, t, n_out, self.y[i])
            gc.gemv_cuda(self.act[n_in], w, t, n_out, self.y[i])
            a = self.act[n_out]
            add_rmsnorm(self.y[i], None, self.norm_w[n_out], 1e-6, self.h[n_out],
                        quant_out=(a.q, a.d, a.s16))

    def outputs(self):
        return [y.clone() for y in self.y]


@pytest.mark.parametrize("n", [1, 4, 16])
def test_gemv_chain_pdl_graph(n, monkeypatch):
    from tightfit.kernels import gemv_cuda as gc
    if not gc.available():
        pytest.skip("CUDA GEMV disabled (TIGHTFIT_GEMV)")
    ch = Chain(n, seed=17 * n)
    xs = [torch.randn(n, DIMS[0], device="cuda") for _ in range(2)]

    monkeypatch.setenv("TIGHTFIT_PDL", "0")
    want = []
    for x in xs:                                 # eager, stream-ordered: the oracle
        ch.x.copy_(x)
        ch.poison()
        ch.run()
        want.append(ch.outputs())
    for y in want[1]:
        assert not torch.isnan(y).any()
    from tightfit.kernels.quantize_act import quantize_act
    t0, w0, _, n_out0 = ch.layers[0]
    eq, ef = gemv_errors(w0, t0, n_out0, ch.x, quantize_act(ch.x, 0), want[1][0], seed=1)
    assert eq < 1e-4, f"layer 0 ({NAMES[ch.layers[0][0]]}): {eq:.2e} vs quantized-x reference"
    assert ef < 2e-2, f"layer 0: {ef:.2e} vs float reference"

    for mode in ("0", "1"):
        monkeypatch.setenv("TIGHTFIT_PDL", mode)
        if mode == "1":                          # eager PDL launches on the stream
            ch.x.copy_(xs[0])
            ch.poison()
            ch.run()
            for i, (a, b) in enumerate(zip(ch.outputs(), want[0])):
                assert torch.equal(a, b), f"eager PDL: layer {i} differs"
        g = capture(ch.run)
        for rep in (1, 0, 1):                    # new inputs every replay, all buffers poisoned
            ch.x.copy_(xs[rep])
            ch.poison()
            torch.cuda.synchronize()
            g.replay()
            torch.cuda.synchronize()
            for i, (a, b) in enumerate(zip(ch.outputs(), want[rep])):
                assert torch.equal(a, b), (f"PDL={mode} graph N={n}: layer {i} "
                                           f"({NAMES[ch.layers[i][0]]}) differs from eager")
        del g


@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "q8_0+tq3"])
def test_attn_q_cuda_pdl_graph(kv_type, monkeypatch):
    from tightfit.kernels import attn_decode_q as AQ
    from tightfit.kernels import attn_decode_q_cuda as C
    if not C.available():
        pytest.skip("no cupy")
    H, Hkv, D, T = 24, 4, 256, 1500
    q, kc, vc, qg, ref = quant_kv_case(kv_type, H, Hkv, D, T, seed=7)
    ws = AQ.make_workspace(kv_type, H, D, 4096, 256, device="cuda")
    q_src, kc, vc, qg = (t.cuda() for t in (q, kc, vc, qg))
    st_src = torch.tensor([0, 0, T - 1], dtype=torch.int32, device="cuda")
    q_in = torch.empty_like(q_src)
    st = torch.empty_like(st_src)
    for n_chunks in (1, 16):
        out = torch.empty(H, D, device="cuda")

        def step():                              # inputs written inside the graph, then read
            q_in.copy_(q_src)
            st.copy_(st_src)
            AQ.attn_decode_q(q_in, kc, vc, qg, out, st, ws, n_chunks=n_chunks, chunk=256,
                             backend="cuda")
        res = {}
        for mode in ("0", "1"):
            monkeypatch.setenv("TIGHTFIT_PDL", mode)
            g = capture(step)
            assert C.last_config.get("pdl") == (mode == "1")
            for _ in range(2):
                q_in.fill_(float("nan"))
                st.fill_(-1)
                out.fill_(float("nan"))
                torch.cuda.synchronize()
                g.replay()
                torch.cuda.synchronize()
            res[mode] = out.clone()
            del g
        assert not torch.isnan(res["1"]).any()
        assert torch.equal(res["0"], res["1"]), f"{kv_type} n_chunks={n_chunks}: PDL changes o"
        check_close(res["1"], ref)


# ---------------------------------------------------------------- timing (not a test)
def bench(shapes=((5120, 1024), (5120, 17408), (17408, 5120)), types=(23, 13, 14), ns=(1, 8),
          min_bytes=1.0e9, with_quant=(False, True), reps=20):
    """us per GEMV of a graph of S back-to-back GEMVs on S weight sets (S * bytes > min_bytes, far
    over L2), PDL off vs on; with_quant: a Triton activation quantization before every GEMV (the
    model's pattern, bench/gemv.py's too) or the activations quantized once (GEMV after GEMV)."""
    from tightfit.kernels import gemv_cuda as gc
    from tightfit.kernels.quantize_act import quantize_act
    print(f"{'type':7s} {'shape':>12s} {'N':>2s} {'quant':>5s} {'sets':>4s} "
          f"{'us PDL=0':>9s} {'us PDL=1':>9s} {'gain':>6s}")
    for t in types:
        for n_in, n_out in shapes:
            nbytes = n_out * n_in // traits(t).block_size * traits(t).type_size
            sets = max(8, int(min_bytes // nbytes))
            ws = [rand_weights(t, n_out, n_in, s) for s in range(sets)]
            for n in ns:
                x = torch.randn(n, n_in, device="cuda")
                outs = [torch.empty(n, n_out, device="cuda") for _ in range(sets)]
                act = quantize_act(x, 0)
                for wq in with_quant:
                    def f():
                        for w, o in zip(ws, outs):
                            gc.gemv_cuda(quantize_act(x, 0, out=act) if wq else act, w, t, n_out, o)
                    us = {}
                    for mode in ("0", "1"):
                        os.environ["TIGHTFIT_PDL"] = mode
                        g = capture(f)
                        g.replay()
                        ts = []
                        for _ in range(reps):
                            a = torch.cuda.Event(enable_timing=True)
                            b = torch.cuda.Event(enable_timing=True)
                            a.record()
                            g.replay()
                            b.record()
                            b.synchronize()
                            ts.append(a.elapsed_time(b))
                        us[mode] = float(np.median(ts)) * 1e3 / sets
                        del g
                    print(f"{NAMES[t]:7s} {f'{n_in}x{n_out}':>12s} {n:>2d} {str(wq):>5s} "
                          f"{sets:>4d} {us['0']:>9.2f} {us['1']:>9.2f} "
                          f"{us['0'] / us['1']:>5.2f}x", flush=True)
            ws = outs = None                     # free the sets before the next shape
            torch.cuda.empty_cache()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--types", default="IQ4_XS,Q5_K,Q6_K")
    ap.add_argument("--ns", default="1,8")
    a = ap.parse_args()
    if a.bench:
        why = _device_ok()
        if why:
            raise SystemExit(why)
        ids = {v: k for k, v in NAMES.items()}
        bench(types=tuple(ids[s] for s in a.types.split(",")),
              ns=tuple(int(v) for v in a.ns.split(",")))
