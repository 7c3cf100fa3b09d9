"""Why two batched prefills differ with the tensor-core GEMV on (issue 10, session 10's open question).

    python3 bench/mma_bisect.py [--path /tmp/seedmix.gguf] [--out $OUT]

One process, one loaded seed-mix model, the short PROSE prompt (<= 16 tokens: every matrix goes
through model/batch.py's GEMV route, gemv_route.gemv_cuda_direct). Runs two prefills per
configuration and prints their logits' relative L2 difference:
  off         TIGHTFIT_GEMV_MMA=0 (expected bitwise repeatable)
  on          TIGHTFIT_GEMV_MMA=1
  on+sync     on, torch.cuda.synchronize() after every GEMV (a stream-order race would vanish)
  on+nopdl    on, TIGHTFIT_PDL=0 (no programmatic dependent launch anywhere)
  on+nopipe   on, TIGHTFIT_MMA_PIPE=0
  only:T      on for ggml type T only (one run per type the model routes)
Then one prefill with every routed call checked in place: the same quantized activations through
gemv_mma twice and through gemv_cuda; prints the calls whose mma output leaves gemv_cuda's by more
than 1e-4 (relative L2) or differs between the two mma runs by more than 1e-5.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from spec import PROSE, build_model, load  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (a.norm() + 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default=None)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    a = ap.parse_args()
    path = build_model(argparse.Namespace(model=None, seedmix=True, path=a.path, mtp=False, layers=None))
    import tightfit.kernels.gemv_route as gr
    from tightfit.kernels import gemv_cuda as gc, gemv_mma as gmm
    from tightfit.kernels.quantize_act import quantize_act
    engine = load(path, "cuda", a.n_ctx)
    m = engine.model
    ids = engine.encode_prompt(PROSE)
    print(f"prompt {len(ids)} tokens", flush=True)

    def prefill() -> torch.Tensor:
        st = engine.new_state()
        st.reset()
        with torch.no_grad():
            return m.forward(ids, st, logits="last")[0].float().clone()

    orig_direct = gr.gemv_cuda_direct
    orig_min = dict(gr.MMA_MIN_N)
    results = []

    def run(name: str, env: dict, sync: bool = False, only: int | None = None):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        if only is not None:
            gr.MMA_MIN_N.clear()
            gr.MMA_MIN_N[only] = orig_min[only]
        if sync:
            def direct(*args, **kw):
                y = orig_direct(*args, **kw)
                torch.cuda.synchronize()
                return y
            gr.gemv_cuda_direct = direct
        try:
            t = time.time()
            la, lb = prefill(), prefill()
            r = rel(la, lb)
            row = dict(config=name, rel=r, argmax_same=bool(la.argmax() == lb.argmax()),
                       s=round(time.time() - t, 2))
        except Exception as e:  # noqa: BLE001 - a diagnosis: report and go on
            row = dict(config=name, error=f"{type(e).__name__}: {e}")
        finally:
            gr.gemv_cuda_direct = orig_direct
            gr.MMA_MIN_N.clear()
            gr.MMA_MIN_N.update(orig_min)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(json.dumps(row), flush=True)
        results.append(row)

    types = sorted({int(L.qtype) for L in m.lin.values() if getattr(L, "kind", None) == "quant"
                    and int(L.qtype) in orig_min})
    run("off", {"TIGHTFIT_GEMV_MMA": "0"})
    run("on", {"TIGHTFIT_GEMV_MMA": "1"})
    run("on again", {"TIGHTFIT_GEMV_MMA": "1"})
    run("on+sync", {"TIGHTFIT_GEMV_MMA": "1"}, sync=True)
    run("on+nopdl", {"TIGHTFIT_GEMV_MMA": "1", "TIGHTFIT_PDL": "0"})
    run("on+nopipe", {"TIGHTFIT_GEMV_MMA": "1", "TIGHTFIT_MMA_PIPE": "0"})
    run("on+nofill", {"TIGHTFIT_GEMV_MMA": "1", "TIGHTFIT_MMA_FILL": "0"})
    for t in types:
        run(f"only:{t}", {"TIGHTFIT_GEMV_MMA": "1"}, only=t)

    # every routed call checked in place
    calls = []

    def checked(x, w, qtype, n_out):
        y = orig_direct(x, w, qtype, n_out)
        if y is not None and gr.mma_routed(qtype, int(x.shape[0]), w):
            qa = quantize_act(x.to(torch.float32).contiguous(), 0)
            y1 = gmm.gemv_mma(qa, w, int(qtype), int(n_out),
                              torch.empty(x.shape[0], int(n_out), device=x.device))
            y2 = gmm.gemv_mma(qa, w, int(qtype), int(n_out),
                              torch.empty(x.shape[0], int(n_out), device=x.device))
            yc = gc.gemv_cuda(qa, w, int(qtype), int(n_out),
                              torch.empty(x.shape[0], int(n_out), device=x.device))
            calls.append(dict(i=len(calls), qtype=int(qtype), n=int(x.shape[0]), n_in=int(x.shape[1]),
                              n_out=int(n_out), in_model_vs_cuda=rel(yc, y), mma_vs_cuda=rel(yc, y1),
                              mma_twice=rel(y1, y2), x_finite=bool(torch.isfinite(x).all())))
        return y

    os.environ["TIGHTFIT_GEMV_MMA"] = "1"
    gr.gemv_cuda_direct = checked
    try:
        prefill()
    finally:
        gr.gemv_cuda_direct = orig_direct
        os.environ["TIGHTFIT_GEMV_MMA"] = "0"
    bad = [c for c in calls if c["in_model_vs_cuda"] > 1e-4 or c["mma_vs_cuda"] > 1e-4
           or c["mma_twice"] > 1e-5]
    print(f"{len(calls)} routed calls checked, {len(bad)} off", flush=True)
    worst = sorted(calls, key=lambda c: -c["in_model_vs_cuda"])[:12]
    for c in (bad[:20] or worst):
        print(json.dumps(c), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "mma_bisect.json"), "w") as f:
            json.dump(dict(prompt=len(ids), configs=results, calls=calls), f)
    print(f"{'config':14s} {'rel L2 A vs B':>14s}  argmax")
    for r in results:
        print(f"{r['config']:14s} " + (f"{r['rel']:14.2e}  {'same' if r['argmax_same'] else 'CHANGED'}"
                                       if "rel" in r else r["error"][:80]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
