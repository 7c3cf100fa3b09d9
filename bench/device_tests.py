"""Device correctness of the GPU executor (run on the GPU machine; see bench/e2e.py for speed).

1. GPU logits vs the CPU ReferenceModel on small generated models of several quant types
   (uniform Q8_0 / Q4_K / Q6_K / IQ4_XS and the 15-format 'cover' mix), relative max error and
   argmax agreement (activations are int8-quantized by the GEMV, so ~1 % is expected).
2. Greedy 128 tokens on the tiny F32 model: token ids identical to the reference, once in the
   default modes and once with the split-K attention forced from position 48 (chunk 16).
3. NaN injection: NonFiniteError, the position and the recurrent state unchanged, then recovery.
4. Attention at 8K and 32K cached tokens vs a float64 reference on random data (single pass
   and split-K), and the kernel time per layer for a few chunk sizes.

Usage: python bench/device_tests.py [--out DIR]   (writes device_tests.json there)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.kernels import attn_decode as A  # noqa: E402
from tightfit.model.executor import GPUModel  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402
from tightfit.runtime.state import NonFiniteError  # noqa: E402

RES: dict = {}


def rel_err(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / (b.abs().max() + 1e-12))


def check_quant_types(tmp: Path) -> None:
    cases = [("small", "Q8_0", None), ("small", "Q4_K", None), ("small", "Q6_K", None),
             ("small", "IQ4_XS", None), ("small", None, "cover"), ("small-odd", "Q5_K", None)]
    rng = np.random.default_rng(1)
    for preset, qt, mix in cases:
        name = f"{preset}-{qt or mix}"
        try:
            p = tmp / f"{name}.gguf"
            make_model(p, preset=preset, qtype=qt, mix=mix, seed=3)
            mf = open_model(p)
            ref = ReferenceModel.from_model_file(mf)
            exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=256)
            prompt = rng.integers(0, mf.config.n_vocab, 12).tolist()
            lg = exe.forward(prompt, exe.new_state(), logits="all")
            lr = ref.forward(prompt, ref.new_state(256), logits="all")
            agree = float((lg.argmax(-1).cpu() == lr.argmax(-1)).float().mean())
            RES[f"logits/{name}"] = {"rel_err": rel_err(lg, lr), "argmax_agree": agree,
                                     "ok": rel_err(lg, lr) < 0.05}
            mf.close()
        except Exception as e:  # noqa: BLE001
            RES[f"logits/{name}"] = {"ok": False, "error": repr(e)[:300]}
            traceback.print_exc()


def greedy(exe, ref, n: int, first: int = 1) -> tuple[list[int], list[int], float]:
    gs, rs = exe.new_state(), ref.new_state(exe.n_ctx)
    tg = tr = first
    out_g, out_r, worst = [], [], 0.0
    for _ in range(n):
        lg = exe.forward([tg], gs, logits="last")
        lr = ref.forward([tr], rs, logits="last")
        worst = max(worst, rel_err(lg, lr))
        tg, tr = int(lg.argmax()), int(lr.argmax())
        out_g.append(tg)
        out_r.append(tr)
    return out_g, out_r, worst


def check_greedy(tmp: Path) -> None:
    p = tmp / "tiny-F32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=11)
    mf = open_model(p)
    ref = ReferenceModel.from_model_file(mf)
    for label, kw, spm in [("default", {}, None), ("split", {"chunk": 16}, 48)]:
        old = A.SINGLE_PASS_MAX
        try:
            if spm:
                A.SINGLE_PASS_MAX = spm
            exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=160, **kw)
            g, r, worst = greedy(exe, ref, 128)
            same = sum(int(a == b) for a, b in zip(g, r))
            RES[f"greedy128/{label}"] = {"identical": g == r, "same_tokens": same,
                                         "max_rel_err": worst, "ok": g == r}
        except Exception as e:  # noqa: BLE001
            RES[f"greedy128/{label}"] = {"ok": False, "error": repr(e)[:300]}
            traceback.print_exc()
        finally:
            A.SINGLE_PASS_MAX = old
    # NaN injection
    try:
        exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=64)
        gs, rs = exe.new_state(), ref.new_state(64)
        exe.forward([1, 2, 3], gs, logits="none")
        ref.forward([1, 2, 3], rs, logits="none")
        snap = gs.snapshot()
        w = exe.vec["output_norm.weight"]
        keep = w[0].item()
        w[0] = float("nan")
        raised = False
        try:
            exe.forward([4], gs, logits="last")
        except NonFiniteError:
            raised = True
        after = gs.snapshot()
        same = all(torch.equal(a, b) for a, b in zip(snap.ssm + snap.conv, after.ssm + after.conv))
        w[0] = keep
        e = rel_err(exe.forward([4], gs, logits="last"), ref.forward([4], rs, logits="last"))
        RES["nonfinite"] = {"raised": raised, "pos": gs.pos, "state_unchanged": same,
                            "recovered_rel_err": e, "ok": raised and same and e < 1e-3}
    except Exception as e:  # noqa: BLE001
        RES["nonfinite"] = {"ok": False, "error": repr(e)[:300]}
        traceback.print_exc()
    mf.close()


def check_attention() -> None:
    H, Hkv, D = 24, 4, 256
    g = torch.Generator(device="cuda").manual_seed(0)
    cap = 32768
    kc = torch.randn(cap, Hkv, D, device="cuda", generator=g).half()
    vc = torch.randn(cap, Hkv, D, device="cuda", generator=g).half()
    q = torch.randn(H, D, device="cuda", generator=g) * 2.0
    qg = torch.randn(H, 2 * D, device="cuda", generator=g)
    out = torch.empty(H, D, device="cuda")
    for T in (1000, 8192, 32768):
        st = torch.tensor([0, 0, T - 1, 0], dtype=torch.int32, device="cuda")
        want = A.attention_f64(q, kc[:T], vc[:T], qg[:, D:])
        row = {}
        for chunk in (256, 512, 1024):
            ws = A.make_workspace(H, D, cap, chunk, device="cuda")
            nch = A.n_chunks_for(cap, chunk)
            A.attn_decode(q, kc, vc, qg, out, st, ws, n_chunks=nch, chunk=chunk)
            err = rel_err(out, want)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(20):
                A.attn_decode(q, kc, vc, qg, out, st, ws, n_chunks=nch, chunk=chunk)
            ev[1].record()
            torch.cuda.synchronize()
            row[f"split{chunk}"] = {"rel_err": err, "us": ev[0].elapsed_time(ev[1]) / 20 * 1e3}
        if T <= A.SINGLE_PASS_MAX:
            A.attn_decode(q, kc, vc, qg, out, st)
            row["single"] = {"rel_err": rel_err(out, want)}
        row["ok"] = all(v["rel_err"] < 1e-4 for v in row.values() if isinstance(v, dict))
        RES[f"attention/T={T}"] = row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        for fn in (lambda: check_attention(), lambda: check_greedy(Path(d)),
                   lambda: check_quant_types(Path(d))):
            try:
                fn()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    RES["wall_s"] = time.time() - t0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "device_tests.json").write_text(json.dumps(RES, indent=1))
    print("\n== device tests ==")
    for k, v in RES.items():
        if isinstance(v, dict):
            print(f"{'PASS' if v.get('ok') else 'FAIL'} {k}: "
                  + ", ".join(f"{a}={b:.3g}" if isinstance(b, float) else f"{a}={b}"
                              for a, b in v.items() if a != "ok" and not isinstance(b, dict))
                  + "".join(f" {a}:err={b['rel_err']:.2g},{b.get('us', 0):.0f}us"
                            for a, b in v.items() if isinstance(b, dict)))
    print(f"wall {RES['wall_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
