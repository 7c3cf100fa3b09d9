"""Fused activation quantization on the device: the captured decode step with the producers
writing the int8 GEMV inputs (GPUModel.fuse_quant, TIGHTFIT_FUSE_QUANT) against the separate
quantize launches, on one loaded model: logits must be bit-identical, and the step time of each.

    python3 bench/fuse_quant_check.py [--path /tmp/seedmix.gguf] [--tokens 16] [--steps 64]

Prints one JSON line: identical (bool), max |diff|, ms per step unfused / fused.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tightfit.api import open_model  # noqa: E402
from tightfit.model.executor import GPUModel  # noqa: E402


def run(exe, fuse: bool, toks: list[int], steps: int):
    exe.fuse_quant = fuse
    st = exe.new_state(len(toks) + steps + 8)       # a fresh state: fresh graph captures
    outs = []
    with torch.no_grad():
        for t in toks:
            exe.step_token(t, st, head=True)
            outs.append(exe.logits.clone())
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(steps):
            exe.step_token(toks[i % len(toks)], st, head=True)
        b.record()
        torch.cuda.synchronize()
    st.sync()
    return torch.cat(outs), a.elapsed_time(b) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    mf = open_model(args.path)
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=args.tokens + args.steps + 8,
                                   lazy_check=True)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, mf.config.n_vocab, (args.tokens,), generator=g).tolist()
    a, ms0 = run(exe, False, toks, args.steps)
    b, ms1 = run(exe, True, toks, args.steps)
    a2, ms0b = run(exe, False, toks, args.steps)                  # run-to-run determinism
    print(json.dumps({"identical": bool(torch.equal(a, b)),
                      "max_abs_diff": float((a - b).abs().max()),
                      "unfused_deterministic": bool(torch.equal(a, a2)),
                      "ms_step_unfused": [round(ms0, 4), round(ms0b, 4)],
                      "ms_step_fused": round(ms1, 4)}))


if __name__ == "__main__":
    main()
