"""Device benchmark of decode attention on the quantized KV cache (issue 11), for the lead to run.

    python3 bench/kv_quant.py --ctx 8192,32768,131072 --types f16,q8_0,tq4,tq3,q8_0+tq3 --out $OUT
    python3 bench/kv_quant.py --ctx 32768 --types f16,q8_0,tq3,tq4 --extras old,new --pdl 0,1 \
        --pieces --out $OUT

One 27B attention block (24 query heads, 4 KV heads, head_dim 256), one decode token at T cached
positions. f16 runs tightfit/kernels/attn_decode.py; the others attn_decode_q.py (q rotation,
attention, merge + un-rotation + gate: 2-3 launches; --extras old,new also times the former
3-4 launches, TIGHTFIT_ATTNQ_EXTRAS=old). Split-K (chunk 512) above 1024 tokens, like the
executor. --pieces also times each launch of the quantized call alone (graphs of that launch
only: the attention kernel vs the work around it); --pdl 0,1 runs with and without programmatic
dependent launch (TIGHTFIT_PDL); --xcfg sweeps the new kernels' tiles (TIGHTFIT_ATTNQ_XCFG).
Per (type, T): median time from CUDA graphs replaying the step over S independent layer caches
(S chosen so the caches exceed 4x the L2, i.e. the time includes reading the cache from HBM),
the effective cache bandwidth, the quantize-on-write time of one token (torch path),
and the max error against float64 on the same quantized bytes (first layer only, T <= 32K).
JSON lines go to OUT/kv_quant.jsonl, a table to stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tightfit.kernels import attn_decode as A  # noqa: E402
from tightfit.kernels import attn_decode_q as AQ  # noqa: E402
from tightfit.kvquant.formats import get_format, split_kv_type  # noqa: E402
from tightfit.kvquant.reference import alloc_cache, attention_quant_f64, write_rows  # noqa: E402

H, HKV, D = 24, 4, 256
CHUNK = 512


def cache_bytes(kv_type: str, T: int) -> int:
    if kv_type == "f16":
        return 2 * T * HKV * D * 2
    kn, vn = split_kv_type(kv_type)
    return T * HKV * (get_format(kn).row_bytes(D) + get_format(vn).row_bytes(D))


def make_layer(kv_type: str, T: int, gen: torch.Generator, dev):
    k = torch.randn(T, HKV, D, generator=gen, device=dev)
    k[..., 3] = k[..., 3] * 12 + 6
    v = torch.randn(T, HKV, D, generator=gen, device=dev)
    if kv_type == "f16":
        return k.half(), v.half()
    kn, vn = split_kv_type(kv_type)
    kc, vc = alloc_cache(T, HKV, D, kn, dev), alloc_cache(T, HKV, D, vn, dev)
    for s in range(0, T, 8192):
        write_rows(kc, vc, s, k[s:s + 8192], v[s:s + 8192], kv_type)
    return kc, vc


def write_ms(kv_type: str, kc, vc, T: int, dev, gen, reps: int = 50) -> float:
    """Median ms of one decode step's q/K/V prep + K/V row write (the executor's op_qk), from a CUDA
    graph replaying it `reps` times (position T-1, a row inside the cache)."""
    from tightfit.kernels import kv_write_q as KW
    n_rot = 64
    qg = torch.randn(H, 2 * D, device=dev, generator=gen)
    k = torch.randn(HKV * D, device=dev, generator=gen)
    v = torch.randn(HKV * D, device=dev, generator=gen)
    nw = 1 + 0.1 * torch.randn(D, device=dev, generator=gen)
    cos, sin = A.rope_tables(T, n_rot, 1e7, device=dev)
    q_out = torch.zeros(H, D, device=dev)
    status = torch.tensor([0, 0, T - 1], dtype=torch.int32, device=dev)
    if kv_type == "f16":
        op = lambda: A.qk_prep(qg, k, v, nw, nw, cos, sin, kc, vc, q_out, status, 1e-6)  # noqa: E731
    else:
        ws = KW.make_write_workspace(kv_type, HKV, D, device=dev)
        op = lambda: KW.qk_prep_q(qg, k, v, nw, nw, cos, sin, kc, vc, q_out, status, 1e-6, ws)  # noqa: E731
    op()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            op()
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    return sorted(times)[len(times) // 2]


def sass_table(types: list[str], ctxs: list[int], bt: int, warps: int, stages: int = 1,
               chunk: int = CHUNK) -> None:
    """Offline: main-loop SASS of _attn_q_kernel (split-K variant) per cached element, shared
    memory, cp.async (LDGSTS) and local-memory counts, programs per SM (registers / shared
    limits) and waves at each context, and the instruction-issue estimate
    max(bytes / 4.28e12, warp instructions / 0.9e12). The issue estimate is only a floor: with
    few programs per SM the per-tile dependent chain (load -> decode -> dot -> softmax -> dot)
    dominates, time ~ tiles per program x chain x waves."""
    import re
    from collections import Counter
    from tightfit.kernels import gemv2_sass as S
    sig = {"q_ptr": "*fp32", "kc_ptr": "*u8", "vc_ptr": "*u8", "kcb_ptr": "*fp32",
           "vcb_ptr": "*fp32", "o_ptr": "*fp32", "m_ptr": "*fp32", "l_ptr": "*fp32",
           "acc_ptr": "*fp32", "status_ptr": "*i32", "Hkv": "i32", "NCH": "i32", "CHUNK": "i32",
           "qk_scale": "fp32"}
    S.ALIGNED_INTS = ("CHUNK",)
    print(f"{'type':>10} {'regs':>4} {'smemK':>5} {'cta/SM':>6} {'ldgsts':>6} {'ldl/stl':>7} "
          f"{'loop':>5} {'wi/elem':>8} " + " ".join(f"{'progs/waves@' + str(T // 1024) + 'K':>16}"
                                                    for T in ctxs)
          + " " + " ".join(f"{'est us @' + str(T // 1024) + 'K':>12}" for T in ctxs))
    for t in types:
        if t == "f16":
            continue
        kf, vf = (get_format(n) for n in split_kv_type(t))
        const = dict(D=D, GRP=H // HKV, GP=16, BT=bt, KB=kf.bits, KG=kf.group, VB=vf.bits,
                     VG=vf.group, SPLIT=True, MINR=AQ.MIN_CHUNK_ROWS)
        sass, regs, shared = S.compile_sass(AQ._attn_q_kernel, sig, const, warps, stages)
        ins = S.parse(sass)
        ops = Counter(op.split(".")[0] for _, op, _ in ins)
        c = S.classify(S.main_loop(ins))
        threads = 32 * warps
        cta = min(65536 // (((regs or 255) + 7) // 8 * 8 * threads), (228 << 10) // max(1, shared + 1024),
                  2048 // threads, 32)
        per = {k2: v2 * warps / (bt * D * 2) for k2, v2 in c.items()}
        ests = []
        for T in ctxs:
            by = cache_bytes(t, T)
            ests.append(max(by / 4.28e12, T * HKV * D * 2 * per["total"] / 0.9e12) * 1e6)
        pw = []
        for T in ctxs:
            nch = -(-T // chunk)
            progs = HKV * nch
            pw.append(f"{progs}/{progs / (132 * max(cta, 1)):.2f}")
        print(f"{t:>10} {regs:>4} {shared / 1024:>5.0f} {cta:>6} {ops['LDGSTS']:>6} "
              f"{ops['LDL'] + ops['STL']:>7} {c['total']:>5} {per['total']:>8.4f} "
              + " ".join(f"{x:>16}" for x in pw) + " "
              + " ".join(f"{e:>12.1f}" for e in ests), flush=True)
    for T in ctxs:
        print(f"f16 bytes floor @{T // 1024}K: {cache_bytes('f16', T) / 4.28e12 * 1e6:.1f} us")


def graph_ms(fns, reps: int = 20) -> float:
    """Median ms per callable of a CUDA graph that runs every callable of `fns` once."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / len(fns))
    return sorted(times)[len(times) // 2]


def bench_one(kv_type: str, T: int, dev, l2: int, bt: int, warps: int, stages: int = 1,
              chunk: int = CHUNK, backend: str | None = None, pieces: bool = False) -> dict:
    gen = torch.Generator(device=dev).manual_seed(T)
    per = cache_bytes(kv_type, T)
    S = max(1, min(16, math.ceil(4 * l2 / per)))
    layers = [make_layer(kv_type, T, gen, dev) for _ in range(S)]
    q = torch.randn(H, D, device=dev, generator=gen) * 0.3
    qg = torch.randn(H, 2 * D, device=dev, generator=gen)
    out = torch.zeros(H, D, device=dev)
    status = torch.tensor([0, 0, T - 1], dtype=torch.int32, device=dev)
    if kv_type == "f16":
        chunk = CHUNK                       # the FP16 baseline keeps the executor's chunk
    nch = -(-T // chunk) if T > AQ.SINGLE_PASS_MAX else 1
    if kv_type == "f16":
        ws = A.make_workspace(H, D, T, chunk, device=dev) if nch > 1 else None
        step = lambda kc, vc: A.attn_decode(q, kc, vc, qg, out, status, ws, nch, chunk)  # noqa: E731
    else:
        ws = AQ.make_workspace(kv_type, H, D, max(T, AQ.SINGLE_PASS_MAX + 1), chunk, device=dev)
        nl_env = int(os.environ.get("TIGHTFIT_ATTNQ_NL", "0") or 0)
        if nch > 1 and nl_env > ws.m.shape[1]:   # --attnq nl=...: room for more partials
            ws.m = torch.zeros(H, nl_env, device=dev)
            ws.l = torch.zeros(H, nl_env, device=dev)
            ws.acc = torch.zeros(H, nl_env, D, device=dev)
        step = lambda kc, vc: AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, nch, chunk,  # noqa: E731
                                              BT=bt, num_warps=warps, num_stages=stages,
                                              backend=backend)
    err = None
    if kv_type != "f16" and T <= 32768:
        step(*layers[0])
        torch.cuda.synchronize()
        ref = attention_quant_f64(q, layers[0][0], layers[0][1], T, kv_type, gate=qg[:, D:])
        err = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    for kc, vc in layers:                       # warm-up / compile
        step(kc, vc)
    t_ms = graph_ms([lambda kc=kc, vc=vc: step(kc, vc) for kc, vc in layers])
    piece_ms = {}
    if pieces and kv_type != "f16":
        # each launch alone over the S layers (inputs left by the calls above): the attention
        # kernel vs the work around it; sum(pieces) vs time_ms shows the gaps between launches
        per_layer = [AQ.attn_decode_q_pieces(q, kc, vc, qg, out, status, ws, nch, chunk, BT=bt,
                                             num_warps=warps, num_stages=stages, backend=backend)
                     for kc, vc in layers]
        for i, (name, _) in enumerate(per_layer[0]):
            piece_ms[name] = graph_ms([pl[i][1] for pl in per_layer])
    w_ms = write_ms(kv_type, layers[0][0], layers[0][1], T, dev, gen)
    from tightfit.kernels import attn_decode_q_cuda as C
    cfg = dict(C.last_config) if kv_type != "f16" else {}
    return {"kv_type": kv_type, "T": T, "layers_in_graph": S, "cache_bytes": per,
            "attnq": os.environ.get("TIGHTFIT_ATTNQ_CFG", ""), "cuda_cfg": cfg,
            "extras": "" if kv_type == "f16" else AQ.extras_mode(),
            "xcfg": os.environ.get(AQ.XCFG_ENV, ""), "pdl": os.environ.get("TIGHTFIT_PDL", "1"),
            "piece_ms": piece_ms,
            "time_ms": t_ms, "GBps": per / (t_ms * 1e-3) / 1e9, "max_rel_err_vs_f64": err,
            "write_one_token_ms": w_ms, "n_chunks": nch, "chunk": chunk, "bt": bt,
            "warps": warps, "stages": stages, "backend": _backend_used(kv_type, backend, q, layers)}


def _backend_used(kv_type: str, backend: str | None, q, layers) -> str:
    if kv_type == "f16":
        return "triton-f16"
    if backend:
        return backend
    from tightfit.kernels import attn_decode_q_cuda as C
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    return "cuda" if C.usable(q, kf, vf, layers[0][0].shape[1]) else "triton"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="8192,32768,131072")
    ap.add_argument("--types", default="f16,q8_0,tq4,tq3,tq3_128,q8_0+tq3,tq4+tq3")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bt", type=int, default=AQ.ATTN_BT, help="rows per tile (attn_decode_q BT)")
    ap.add_argument("--warps", type=int, default=AQ.ATTN_WARPS)
    ap.add_argument("--stages", type=int, default=AQ.ATTN_STAGES,
                    help="num_stages of the attention kernel (>1 reproduces the cp.async blow-up)")
    ap.add_argument("--chunk", type=int, default=CHUNK,
                    help="split-K rows per program for the quantized types (executor: 512)")
    ap.add_argument("--backend", default="auto", choices=("auto", "triton", "cuda"),
                    help="quantized attention kernel: auto (CUDA C++ via cupy when usable), "
                         "triton, cuda")
    ap.add_argument("--tag", default="", help="suffix of the jsonl name (several variants, one OUT)")
    ap.add_argument("--sass", action="store_true", help="offline SASS count + estimate, no GPU")
    ap.add_argument("--attnq", default="",
                    help="';'-separated CUDA-kernel configs to sweep for the quantized types, each "
                         "'key=val,...' with keys nw (warps per CTA, TIGHTFIT_ATTNQ_NW), nst "
                         "(ring stages, TIGHTFIT_ATTNQ_NST), nl (chunks launched, "
                         "TIGHTFIT_ATTNQ_NL); '' = the launcher's own choice, e.g. "
                         "--attnq ';nw=4;nl=132;nl=132,nw=8'")
    ap.add_argument("--extras", default="new",
                    help="comma list of old,new: the launches around the quantized attention "
                         "kernel (TIGHTFIT_ATTNQ_EXTRAS), one row each")
    ap.add_argument("--xcfg", default="",
                    help="';'-separated TIGHTFIT_ATTNQ_XCFG values to sweep for extras=new, e.g. "
                         "';obn=64,onw=8;rc=64;qbn=16' ('' = attn_decode_q.XCFG)")
    ap.add_argument("--pdl", default=os.environ.get("TIGHTFIT_PDL", "1"),
                    help="comma list of TIGHTFIT_PDL values (0,1), one row each")
    ap.add_argument("--pieces", action="store_true",
                    help="also time each launch of the quantized call alone (piece_ms)")
    a = ap.parse_args()
    if a.sass:
        sass_table(a.types.split(","), [int(x) for x in a.ctx.split(",")], a.bt, a.warps,
                   a.stages, a.chunk)
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with open(os.path.join(a.out, f"kv_quant{a.tag}.jsonl"), "w") as f:
        keys = {"nw": "TIGHTFIT_ATTNQ_NW", "nst": "TIGHTFIT_ATTNQ_NST", "nl": "TIGHTFIT_ATTNQ_NL"}
        cfgs = a.attnq.split(";") if a.attnq else [""]
        xcfgs = a.xcfg.split(";") if a.xcfg else [""]
        for T in [int(x) for x in a.ctx.split(",")]:
            for t in a.types.split(","):
                variants = [("", "", "", p) for p in a.pdl.split(",")] if t == "f16" else [
                    (cfg, ex, xc, p) for cfg in cfgs for ex in a.extras.split(",")
                    for xc in (xcfgs if ex == "new" else [""]) for p in a.pdl.split(",")]
                for cfg, ex, xc, p in variants:
                    for v in list(keys.values()) + ["TIGHTFIT_ATTNQ_CFG", AQ.EXTRAS_ENV,
                                                    AQ.XCFG_ENV]:
                        os.environ.pop(v, None)
                    for kv in filter(None, cfg.split(",")):
                        k, v = kv.split("=")
                        os.environ[keys[k.strip()]] = v.strip()
                    os.environ["TIGHTFIT_ATTNQ_CFG"] = cfg
                    os.environ["TIGHTFIT_PDL"] = p
                    if ex:
                        os.environ[AQ.EXTRAS_ENV] = ex
                    if xc:
                        os.environ[AQ.XCFG_ENV] = xc
                    try:
                        r = bench_one(t, T, dev, l2, a.bt, a.warps, a.stages, a.chunk,
                                      None if a.backend == "auto" else a.backend, a.pieces)
                    except Exception as e:          # keep the other rows
                        r = {"kv_type": t, "T": T, "attnq": cfg, "extras": ex, "xcfg": xc,
                             "pdl": p, "error": f"{type(e).__name__}: {e}"}
                    rows.append(r)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    print(json.dumps(r), flush=True)
                    torch.cuda.empty_cache()
    print(f"\nbt={a.bt} warps={a.warps} stages={a.stages} chunk={a.chunk} backend={a.backend}")
    print(f"{'type':>10} {'T':>7} {'ex':>3} {'pdl':>3} {'MiB':>8} {'ms':>8} {'GB/s':>7} "
          f"{'vs f16':>7} {'err':>8} {'write ms':>8} {'attn us':>7} {'rest us':>7}"
          f"  pieces us / xcfg / attnq / build (NW NST MINB regs smem grid)")
    base = {(r["T"], r.get("pdl")): r["time_ms"] for r in rows
            if r.get("kv_type") == "f16" and "time_ms" in r}
    for r in rows:
        if "error" in r:
            print(f"{r['kv_type']:>10} {r['T']:>7} {r.get('extras', ''):>3} {r.get('pdl', ''):>3} "
                  f"[{r.get('attnq', '')}] [{r.get('xcfg', '')}] {r['error']}")
            continue
        pm = r.get("piece_ms") or {}
        # attn us: the attention kernel alone; rest us: the whole call minus it (the launches
        # around it and the gaps between them)
        at = f"{pm['attn'] * 1e3:>7.1f}" if "attn" in pm else f"{'':>7}"
        rest = f"{(r['time_ms'] - pm['attn']) * 1e3:>7.1f}" if "attn" in pm else f"{'':>7}"
        pcs = " ".join(f"{k}={v * 1e3:.1f}" for k, v in pm.items())
        pcs = (pcs + f" [{r.get('xcfg', '')}] ") if (pcs or r.get("xcfg")) else ""
        c = r.get("cuda_cfg") or {}
        build = (f"[{r.get('attnq', '')}] NW={c.get('NW')} NST={c.get('NST')} MINB={c.get('MINB')} "
                 f"regs={c.get('regs')} smem={c.get('smem')} grid={c.get('grid')}") if c else ""
        b = base.get((r["T"], r.get("pdl")))
        rel = r["time_ms"] / b if b else float("nan")
        err = "" if r["max_rel_err_vs_f64"] is None else f"{r['max_rel_err_vs_f64']:.1e}"
        wr = "" if r["write_one_token_ms"] is None else f"{r['write_one_token_ms']:.4f}"
        print(f"{r['kv_type']:>10} {r['T']:>7} {r.get('extras', ''):>3} {r.get('pdl', ''):>3} "
              f"{r['cache_bytes'] / 2**20:>8.1f} {r['time_ms']:>8.4f} "
              f"{r['GBps']:>7.0f} {rel:>7.2f} {err:>8} {wr:>8} {at} {rest}  {pcs}{build}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
