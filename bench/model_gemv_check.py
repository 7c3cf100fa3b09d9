"""The model's own weight tensors through every GEMV route, column by column (issue 10 diagnosis).

    python3 bench/model_gemv_check.py [--path /tmp/seedmix.gguf] [--n 5] [--layers 0,3,63]

For each quantized matrix of the chosen layers and the output head, as the GPU executor holds it
(`model.lin[name].raw`): x random [n, n_in], quantized once (quantize_act layout 0); then
gemv_cuda with all n columns, gemv_cuda one column at a time (the decode step's N = 1), and
gemv_mma (when it supports the type), each against a float64 reference built from the same
int8 activations and gguf-py's dequantization of a few sampled rows. Prints one line per matrix
and route: relative error vs the reference; 'zero' when a column came back all zeros.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from spec import build_model, load  # noqa: E402


def ref_rows(raw: torch.Tensor, qtype: int, n_out: int, n_in: int, rows: np.ndarray) -> np.ndarray:
    from gguf.quants import dequantize
    from tightfit.quant.traits import traits
    tr = traits(qtype)
    rb = n_in // tr.block_size * tr.type_size
    w = raw.view(n_out, rb)[torch.as_tensor(rows, device=raw.device)].cpu().numpy()
    return np.asarray(dequantize(w, qtype), np.float64).reshape(len(rows), n_in)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default=None)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--layers", default="0,3,63")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--variants", action="store_true", help="also a copy of the weights")
    a = ap.parse_args()
    path = build_model(argparse.Namespace(model=None, seedmix=True, path=a.path, mtp=False, layers=None))
    from tightfit.kernels import gemv_cuda as gc, gemv_mma as gmm
    from tightfit.kernels.quantize_act import quantize_act
    engine = load(path, "cuda", a.n_ctx)
    m = engine.model
    names = [n for n in m.lin if any(n.startswith(f"blk.{i}.") for i in a.layers.split(","))]
    names += ["output.weight"]
    rng = np.random.default_rng(0)
    print(f"{'matrix':28s} {'type':>4s} {'n_in':>6s} {'n_out':>6s}  route      rel.err  note", flush=True)
    for name in names:
        L = m.lin.get(name)
        if L is None or L.kind != "quant" or not gc.supported(int(L.qtype)):
            continue
        t, n_in, n_out = int(L.qtype), int(L.n_in), int(L.n_out)
        x = torch.randn(a.n, n_in, device="cuda")
        qa = quantize_act(x, 0)
        xq = (qa.q.float().view(a.n, n_in // 32, 32) * qa.d.view(a.n, -1, 1)).view(a.n, n_in)
        rows = np.unique(np.r_[rng.integers(0, n_out, 6), n_out - 1])
        want = xq.double().cpu().numpy() @ ref_rows(L.raw, t, n_out, n_in, rows).T   # [n, rows]
        routes = {}
        y = torch.full((a.n, n_out), float("nan"), device="cuda")
        routes["cuda N"] = gc.gemv_cuda(qa, L.raw, t, n_out, y).clone()
        if a.variants:      # the same product on a fresh copy of the weights (another address)
            wc = L.raw.clone()
            y = torch.full((a.n, n_out), float("nan"), device="cuda")
            routes["cuda N cp"] = gc.gemv_cuda(qa, wc, t, n_out, y).clone()
            del wc
            print(f"{name}: weights at 0x{L.raw.data_ptr():x} (mod 256 = {L.raw.data_ptr() % 256}), "
                  f"{L.raw.numel()} bytes, stride {L.raw.stride()}, shape {tuple(L.raw.shape)}",
                  flush=True)
        y1 = torch.empty(a.n, n_out, device="cuda")
        for c in range(a.n):
            q1 = quantize_act(x[c:c + 1], 0)
            o = torch.full((1, n_out), float("nan"), device="cuda")
            y1[c] = gc.gemv_cuda(q1, L.raw, t, n_out, o)[0]
        routes["cuda 1x"] = y1
        if gmm.supported(t):
            y = torch.full((a.n, n_out), float("nan"), device="cuda")
            routes["mma"] = gmm.gemv_mma(qa, L.raw, t, n_out, y).clone()
            y = torch.full((a.n, n_out), float("nan"), device="cuda")
            again = gmm.gemv_mma(qa, L.raw, t, n_out, y).clone()
            dd = float((again - routes["mma"]).abs().max() / (routes["mma"].abs().max() + 1e-30))
            print(f"{name}: mma run twice, max |diff| / max |y| = {dd:.2e}", flush=True)
        for r, yy in routes.items():
            got = yy[:, torch.as_tensor(rows, device="cuda")].double().cpu().numpy()
            err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) + 1e-30))
            zc = [c for c in range(a.n) if not bool(yy[c].abs().max() > 0)]
            nan = bool(torch.isnan(yy).any())
            print(f"{name:28s} {t:4d} {n_in:6d} {n_out:6d}  {r:8s} {err:9.2e}  "
                  f"{'zero cols ' + str(zc) if zc else ''}{' NaN' if nan else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
