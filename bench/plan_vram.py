"""Placed loading of the seed-mix 27B under VRAM budgets (issue 5): one arena from the plan, host
rows from the mmap. For each budget (default 16, 12, 8 GiB), in a fresh child process:

* torch.cuda.set_per_process_memory_fraction(budget / device total): the caching allocator may not
  take more than the budget (the CUDA context itself is outside torch's count);
* the file's pages are dropped from the page cache first (fsync + posix_fadvise DONTNEED), so the
  load is from disk, as after a reboot;
* plan (tightfit.model.placed.plan_for, MTP excluded), GPUModel(plan=...) = arena + upload;
* reported: planned bill (total, arena, reserve) vs measured peak VRAM (torch max_memory_reserved,
  which includes the arena, and max_memory_allocated; device used from mem_get_info, which adds
  the CUDA context), load wall time and upload GB/s, peak host RSS (VmHWM) and anonymous RSS
  (RssAnon: must stay far below the file size: no second copy of the weights), a 32-token prefill
  through the batched path, greedy decode tok/s (no CUDA graph when any rows are on the host);
* the host-RAM roofline: host bytes read per token (host suffix rows + the embedding row) over the
  host read bandwidth measured in the same child: the best of a numba parallel sum and a torch
  sum over 2 GiB (all threads, best of 5 passes each), before the load and after the decode
  (`host_bw_all`); ratio = measured tok/s / (bandwidth / host bytes per token). llama.cpp partial offload of the
  same model: 5.0 tok/s (figure given with the issue), printed beside it.
* host profile (issue 5; the child sets TIGHTFIT_HOST_PROFILE=1 unless it is set to 0): after the
  headline decode (not profiled), `--profile-tokens` more steps per thread count of
  `--profile-threads` (0 = numba's pool, -1 = pool - 1, ...), each after one warm-up step, with
  tightfit.model.placed.HostProfile: per token ms and % in embed / x_d2h / x_wait / x_quant /
  kernel / gemv_other / copy_back / gpu_tail / other, host calls and bytes per call, kernel GB/s
  per call and by kernel type, "kernel-only GB/s" (host bytes / kernel time); getrusage and
  cgroup cpu.stat deltas (context switches, page faults, throttling) over the profiled steps;
  threading facts (numba layer and threads, torch threads, OMP/MKL/... env, cpu count, affinity,
  cgroup cpu.max, SMT siblings, transparent huge pages). All in the JSON ("host_profile"), the
  tables printed. (An A/B of host rows in the mapping vs an anonymous huge-page copy ran until
  session 8: no gain in the full decode, RESULTS.md.)

Device run (wheels as in bench/e2e.py's docstring):
  run(carry=[".whl"]): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
    PYTHONUNBUFFERED=1 timeout 580 python3 bench/plan_vram.py --out $OUT

Usage: python bench/plan_vram.py [--budgets 16GiB,12GiB,8GiB] [--ctx 4096] [--tokens 16]
       [--layers N] [--path /tmp/seedmix.gguf] [--out DIR] [--profile-tokens 6]
       [--profile-threads 0,-1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LLAMA_PARTIAL_TOK_S = 5.0


def proc_status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def host_read_bw(n: int = 2 << 30) -> float:
    import numpy as np
    from numba import njit, prange

    @njit(parallel=True, cache=False)
    def _sum(a):
        s = 0
        for i in prange(a.size):
            s += a[i]
        return s
    a = np.ones(n // 8, dtype=np.uint64)
    _sum(a[:1024])
    best = float("inf")               # the best of 5 passes: the roofline is what the host CAN
    for _ in range(5):                # read (session 12: 93-124 GB/s on one device host)
        t0 = time.perf_counter()
        _sum(a)
        best = min(best, time.perf_counter() - t0)
    return n / best


def host_read_bw_torch(n: int = 2 << 30) -> float:
    """Host read bandwidth as ../shared/bench measured it (torch, all threads): best of 5 sums."""
    import torch
    x = torch.ones(n // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return n / best


ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NUMBA_", "TIGHTFIT_", "TORCH_",
                "CUDA_", "PYTORCH_")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cgroup_cpu_stat() -> dict[str, int]:
    out: dict[str, int] = {}
    txt = _read("/sys/fs/cgroup/cpu.stat") or ""
    for line in txt.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def rusage() -> dict[str, float]:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"utime_s": r.ru_utime, "stime_s": r.ru_stime, "minflt": r.ru_minflt,
            "majflt": r.ru_majflt, "nvcsw": r.ru_nvcsw, "nivcsw": r.ru_nivcsw}


def threading_facts() -> dict:
    """Contention suspects: who else runs threads in this process, and on how many CPUs."""
    import numba
    import torch
    from tightfit.kernels import cpu_gemv
    f: dict = {"numba_layer": numba.threading_layer(), "numba_threads": numba.get_num_threads(),
               "numba_pool": numba.config.NUMBA_NUM_THREADS, "cpu_gemv_threads": cpu_gemv.n_threads(),
               "cpu_gemv_avx512": bool(cpu_gemv._A.ENABLED), "cpu_gemv_simd": list(cpu_gemv.SIMD),
               "torch_threads": torch.get_num_threads(),
               "torch_interop_threads": torch.get_num_interop_threads(),
               "os_cpu_count": os.cpu_count(), "affinity_cpus": len(os.sched_getaffinity(0)),
               "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max"),
               "smt_siblings_cpu0": _read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list"),
               "numa_nodes": _read("/sys/devices/system/node/online"),
               "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
               "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}}
    try:
        f["torch_parallel_info"] = torch.__config__.parallel_info()
    except Exception:  # noqa: BLE001
        pass
    try:
        f["process_threads"] = len(os.listdir("/proc/self/task"))
    except OSError:
        pass
    return f


def _decode(exe, st, n: int, tok: int = 3) -> float:
    """n greedy steps as the headline loop runs them; seconds per token."""
    import torch
    if exe.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        exe.step_token(tok, st, head=True)
        tok = int(torch.argmax(exe.logits[0]))
    st.sync()
    return (time.perf_counter() - t0) / n


def host_profile_runs(exe, st, args) -> dict:
    """The profiled decode (see the module docstring)."""
    from tightfit.kernels import cpu_gemv
    from tightfit.model.placed import HostProfile
    prof = exe.host_profile
    res: dict = {"facts": threading_facts(), "runs": []}
    pool = cpu_gemv.n_threads()
    want = []
    for v in str(args.profile_threads).split(","):
        n = int(v)
        n = pool if n == 0 else (pool + n if n < 0 else n)
        if 1 <= n and n not in want:
            want.append(n)
    exe.host_profile = prof
    try:
        for n in want:
            cpu_gemv.set_threads(n)
            _decode(exe, st, 1)                    # warm-up (the group plans of this count)
            prof.reset()
            ru0, cg0 = rusage(), cgroup_cpu_stat()
            sec = _decode(exe, st, args.profile_tokens)
            ru1, cg1 = rusage(), cgroup_cpu_stat()
            k = max(1, len(prof.tokens))
            s = prof.summary()
            s.update(threads=n, ms_per_token_outside=sec * 1e3,
                     rusage_per_token={key: (ru1[key] - ru0[key]) / k for key in ru0},
                     cgroup_cpu_stat_delta={key: cg1[key] - cg0.get(key, 0) for key in cg1})
            s["table"] = f"[{n} threads, {sec * 1e3:.1f} ms/token measured outside]\n" + \
                HostProfile.table(s)
            res["runs"].append(s)
            print(s["table"], flush=True)
            print(f"per token: {s['rusage_per_token']}; cgroup: {s['cgroup_cpu_stat_delta']}",
                  flush=True)
    finally:
        cpu_gemv.set_threads(pool)
        exe.host_profile = None
    return res


def drop_page_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one(args: argparse.Namespace) -> dict:
    """One budget, in this (fresh) process."""
    # read once when tightfit.model.placed is imported (below): the executor then holds a
    # HostProfile, attached only for the profiled decode after the headline one
    os.environ.setdefault("TIGHTFIT_HOST_PROFILE", "1")
    import torch

    from tightfit.api import open_model
    from tightfit.errors import PlanError
    from tightfit.model.executor import GPUModel
    from tightfit.model.placed import plan_for, vram_bytes
    from tightfit.plan.budget import require_fit

    budget = vram_bytes(args.one)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    r: dict = {"budget": args.one, "budget_bytes": budget, "ctx": args.ctx}
    plan = plan_for(args.path, args.ctx, budget, device="cuda", check=False)
    r.update(planned_total=plan.total_bytes, planned_arena=plan.arena_bytes,
             planned_reserve=plan.line("reserve").bytes, fits=plan.fits,
             host_embd=plan.host_embd, gpu_weight_bytes=plan.placement.gpu_bytes,
             host_weight_bytes=plan.placement.host_bytes,
             split_tensors=len(plan.placement.split_tensors()),
             max_ctx_same_placement=plan.max_ctx_same_placement,
             split_order=plan.options.split_order,
             # the planner's host GEMV estimate (tightfit.plan.host_speed), printed beside the
             # measured ms/token and the profile's kernel time
             host_ms_est=plan.host_ms_per_token, host_ms_by_type_est=plan.host_ms_by_type())
    try:
        require_fit(plan)
    except PlanError as e:
        r["error"] = str(e)
        return r
    if plan.placement.host_segments():
        from tightfit.model.placed import passive_host_threads
        passive_host_threads()      # before host_read_bw starts numba's thread pool
    # the roofline's bandwidth: the best of numba's and torch's reads, before the load and after
    # the decode (session 12: 89.6-119.3 GB/s by method and moment on one host; the best is
    # the roofline, so the ratio is the conservative one)
    bws = {"numba_before": host_read_bw(), "torch_before": host_read_bw_torch()}
    import numba
    r.update(numba_threads=numba.get_num_threads(), numba_layer=numba.threading_layer(),
             cpus=len(os.sched_getaffinity(0)))
    drop_page_cache(args.path)
    mf = open_model(args.path)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=args.ctx, plan=plan, lazy_check=True,
                                   progress=False)
    prof, exe.host_profile = exe.host_profile, None     # the headline decode is not profiled
    torch.cuda.synchronize()
    r["load_s"] = time.perf_counter() - t0
    up = exe.placed.upload
    r.update(upload_bytes=up.bytes, upload_s=up.seconds, upload_GBps=up.bytes / up.seconds / 1e9,
             released_bytes=up.released_bytes, graphs=exe.use_graphs,
             executor_workspace=exe.workspace_bytes())
    st = exe.new_state(args.ctx)
    V = exe.config.n_vocab
    prompt = [(i * 7919) % V for i in range(32)]
    t0 = time.perf_counter()
    exe.forward(prompt, st, logits="last")
    st.sync()
    r["prefill_tok_s"] = len(prompt) / (time.perf_counter() - t0)
    exe.forward([1], st, logits="last")          # graph capture / warm-up of the step path
    st.sync()
    wall = _decode(exe, st, args.tokens)
    emb = mf.gguf.tensors["token_embd.weight"]
    host_bytes = exe.host_weight_bytes + (emb.row_bytes if plan.host_embd else 0)
    r.update(tok_s=1 / wall, ms_per_token=wall * 1e3, host_bytes_per_token=host_bytes,
             peak_reserved=torch.cuda.max_memory_reserved(),
             peak_allocated=torch.cuda.max_memory_allocated(),
             arena_bytes=exe.placed.arena.nbytes, extra_states=exe.placed.extra_states)
    free, dtotal = torch.cuda.mem_get_info()
    r["device_used"] = dtotal - free
    bws.update(numba_after=host_read_bw(), torch_after=host_read_bw_torch())
    r["host_bw_all"] = bws
    r["host_bw"] = bw = max(bws.values())
    if host_bytes:
        r["host_roofline_tok_s"] = bw / host_bytes
        r["host_roofline_ratio"] = r["tok_s"] / r["host_roofline_tok_s"]
    if prof is not None and exe.hostw and args.profile_tokens > 0:
        exe.host_profile = prof
        try:
            r["host_profile"] = host_profile_runs(exe, st, args)
        except Exception as e:  # noqa: BLE001 - keep the headline figures
            import traceback
            traceback.print_exc()
            r["host_profile"] = {"error": f"{type(e).__name__}: {e}"}
    else:
        r["host_profile"] = {"skipped": "no host rows" if prof is not None else
                             "TIGHTFIT_HOST_PROFILE=0", "facts": threading_facts()}
    r.update(proc_status())
    r["file_bytes"] = os.path.getsize(args.path)
    return r


def generate(args: argparse.Namespace) -> dict:
    from tightfit.model.generate import make_model
    res: dict = {}
    if Path(args.path).exists():
        return res
    t0 = time.time()
    try:
        make_model(args.path, preset="qwen3.8-27b-seedmix", layers=args.layers)
        res["vocab"] = "real"
    except Exception as e:  # noqa: BLE001 - the real vocabulary needs an extra package
        print(f"real vocabulary unavailable ({e}); synthetic 248320-token vocabulary", flush=True)
        make_model(args.path, preset="qwen3.8-27b-seedmix", layers=args.layers,
                   vocab="small:248320")
        res["vocab"] = "small:248320"
    res["generate_s"] = time.time() - t0
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="16GiB,12GiB,8GiB")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile-tokens", type=int, default=6,
                    help="profiled decode steps per thread count (0: no host profile)")
    ap.add_argument("--profile-threads", default="0,-1",
                    help="host thread counts of the profiled decode: 0 = numba's pool, -1 = pool-1")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        try:
            r = one(args)
        except Exception as e:  # noqa: BLE001 - report, do not lose the other budgets
            import traceback
            traceback.print_exc()
            r = {"budget": args.one, "error": f"{type(e).__name__}: {e}"}
        Path(args.child_out).write_text(json.dumps(r, default=str))
        return 0
    res = generate(args)
    print(f"model {args.path}: {os.path.getsize(args.path) / 1e9:.2f} GB", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res["runs"] = []
    for b in args.budgets.split(","):
        child = out / f"plan_vram_{b}.json"
        cmd = [sys.executable, __file__, "--one", b, "--ctx", str(args.ctx), "--tokens",
               str(args.tokens), "--path", args.path, "--child-out", str(child),
               "--profile-tokens", str(args.profile_tokens),
               "--profile-threads", args.profile_threads]
        t0 = time.time()
        subprocess.run(cmd, check=False)
        r = json.loads(child.read_text()) if child.exists() else {"budget": b, "error": "no result"}
        r["child_wall_s"] = time.time() - t0
        res["runs"].append(r)
        print(json.dumps(r, default=str), flush=True)
    (out / "plan_vram.json").write_text(json.dumps(res, indent=1, default=str))
    G = 2 ** 30
    print(f"\n== placed load + decode, seed-mix 27B, ctx {args.ctx} ==")
    print(f"{'budget':>7} {'plan GiB':>8} {'arena':>6} {'resv GiB':>8} {'alloc':>6} {'dev used':>8} "
          f"{'host GB':>7} {'load s':>6} {'up GB/s':>7} {'RSS GiB':>7} {'anon':>5} {'tok/s':>6} "
          f"{'roof':>5} {'llama.cpp':>9} {'ms/tok':>7} {'host est':>8}")
    for r in res["runs"]:
        if "tok_s" not in r:
            print(f"{r['budget']:>7}  {r.get('error', '?')}")
            continue
        print(f"{r['budget']:>7} {r['planned_total'] / G:>8.2f} {r['arena_bytes'] / G:>6.2f} "
              f"{r['peak_reserved'] / G:>8.2f} {r['peak_allocated'] / G:>6.2f} "
              f"{r['device_used'] / G:>8.2f} {r['host_weight_bytes'] / 1e9:>7.2f} "
              f"{r['load_s']:>6.1f} {r['upload_GBps']:>7.2f} {r.get('VmHWM', 0) / G:>7.2f} "
              f"{r.get('RssAnon', 0) / G:>5.2f} {r['tok_s']:>6.2f} "
              f"{r.get('host_roofline_ratio', float('nan')):>5.2f} {LLAMA_PARTIAL_TOK_S:>9.1f} "
              f"{r['ms_per_token']:>7.1f} {r.get('host_ms_est', float('nan')):>8.1f}")
    for r in res["runs"]:
        hp = r.get("host_profile") or {}
        for run in hp.get("runs", []):
            print(f"\n== host profile, {r['budget']} ==\n{run['table']}")
        if r.get("host_ms_by_type_est"):
            by = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["host_ms_by_type_est"].items(),
                                                             key=lambda kv: -kv[1]))
            print(f"planned host GEMV estimate ({r.get('split_order')} order): "
                  f"{r['host_ms_est']:.1f} ms/token ({by}); measured "
                  f"{r.get('ms_per_token', float('nan')):.1f} ms/token in all")
        if hp.get("facts"):
            f = hp["facts"]
            print(f"threads: numba {f['numba_layer']} {f['numba_threads']} (pool {f['numba_pool']}),"
                  f" torch {f['torch_threads']}, cpus {f['os_cpu_count']} (affinity "
                  f"{f['affinity_cpus']}, cgroup {f['cgroup_cpu_max']}), env {f['env']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
