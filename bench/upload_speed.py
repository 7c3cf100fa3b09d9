"""Upload throughput: GGUF file -> one arena through tightfit.plan.arena.upload, with the page
cache cold-ish and warm.

The plan and arena are built as the loader builds them (tightfit.model.placed.plan_for +
tightfit.plan.arena.Arena); the file, the page-cache drop and the RSS probe are bench/plan_vram.py's
(generate, drop_page_cache, proc_status). Per mode and repetition:

* cold: fsync + posix_fadvise DONTNEED on the whole file (as after a reboot, if the disk is the
  only copy), then upload;
* warm: the whole file is read once with preadv (page cache filled, as right after writing it),
  then upload. upload drops the pages it read, so each warm repetition re-reads the file first.

Reported: bytes, the upload's own seconds and GB/s (UploadReport), released bytes, how much of
the file is still in the page cache afterwards (mincore), peak host RSS during the call over the
RSS before it (VmHWM after clear_refs), and, on CUDA, a byte check of sampled segments against
the file. `--compare arena_old.py` runs the `upload` of another copy of tightfit/plan/arena.py
(e.g. the previous version) on the same arena and file, alternating, for an A/B on one machine.

Device run (wheels as in bench/e2e.py's docstring; the file as bench/plan_vram.py leaves it):
  PYTHONUNBUFFERED=1 timeout 580 python3 bench/upload_speed.py --path /tmp/seedmix.gguf
    --device cuda --out $OUT

Usage: python bench/upload_speed.py [--path /tmp/seedmix.gguf] [--layers N] [--device cpu|cuda]
       [--vram auto|16GiB] [--ctx 4096] [--modes warm,cold] [--reps 2] [--slot-mib 16]
       [--slots 12] [--readers 8] [--compare OTHER_ARENA.py] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_vram import drop_page_cache, generate, proc_status  # noqa: E402


def warm_page_cache(path: str, block: int = 64 << 20) -> float:
    """Read the whole file once (fills the page cache); returns seconds."""
    import numpy as np
    buf = memoryview(np.empty(block, dtype=np.uint8))
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    try:
        off = 0
        while True:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            off += n
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def cached_fraction(path: str) -> float | None:
    """Fraction of the file's pages resident in the page cache (mincore; touches no page)."""
    import ctypes
    import mmap

    import numpy as np
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            a = np.frombuffer(mm, np.uint8)
            n = (len(mm) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = np.zeros(n, dtype=np.uint8)
            rc = libc.mincore(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(len(mm)),
                              ctypes.c_void_p(vec.ctypes.data))
            frac = float((vec & 1).mean()) if rc == 0 else None
            del a
            return frac
    except (OSError, AttributeError, ValueError):
        return None


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def load_impl(path: str | None):
    """`upload` of tightfit.plan.arena, or of another copy of that module (for an A/B)."""
    if path is None:
        from tightfit.plan.arena import upload
        return upload
    import importlib.util
    spec = importlib.util.spec_from_file_location("arena_compare", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod    # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.upload


def verify(inv, placement, arena, n: int = 8) -> bool:
    """Sampled GPU segments (first, last, largest, random) equal the file's bytes."""
    import random
    segs = placement.gpu_segments()
    pick = {segs[0], segs[-1], max(segs, key=lambda s: s.nbytes)}
    pick |= set(random.Random(0).sample(segs, min(n, len(segs))))
    with open(inv.path, "rb") as f:
        for s in pick:
            f.seek(inv.tensors[s.tensor].offset + s.byte_start)
            want = f.read(s.nbytes)
            got = arena.weight(s.tensor).cpu().numpy().tobytes()
            if got != want:
                print(f"MISMATCH in {s.tensor}", flush=True)
                return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--layers", type=int, default=None, help="when generating the file")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vram", default=None, help="budget for the plan (default: auto on CUDA, "
                    "everything in the arena on the CPU)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--slot-mib", type=float, default=None)
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--readers", type=int, default=None)
    ap.add_argument("--compare", default=None, help="another arena.py whose upload runs too")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()

    import torch

    from tightfit.model.placed import plan_for
    from tightfit.plan import arena as A
    from tightfit.plan.budget import require_fit

    res: dict = {"args": vars(args)}
    res.update(generate(argparse.Namespace(path=args.path, layers=args.layers)))
    size = os.path.getsize(args.path)
    dev = torch.device(args.device)
    vram = args.vram or ("auto" if dev.type == "cuda" else 1 << 50)
    plan = require_fit(plan_for(args.path, args.ctx, vram, device=dev, check=False))
    inv = plan.inventory
    arena = A.Arena(plan, dev)
    arena.buffer.zero_()            # a CPU arena's pages are resident before the first RSS probe
    kw = {}
    if args.slot_mib:
        kw["slot_bytes"] = int(args.slot_mib * (1 << 20))
    if args.slots:
        kw["slots"] = args.slots
    impls = {"new": load_impl(None)}
    if args.readers:
        kw_new = dict(kw, readers=args.readers)
    else:
        kw_new = dict(kw)
    if args.compare:
        impls["compare"] = load_impl(args.compare)
    res.update(file_bytes=size, gpu_bytes=plan.placement.gpu_bytes,
               segments=len(plan.placement.gpu_segments()), device=str(dev),
               cpus=len(os.sched_getaffinity(0)),
               ring=dict(slot_bytes=kw.get("slot_bytes", A.RING_SLOT_BYTES),
                         slots=kw.get("slots", A.RING_SLOTS),
                         readers=kw_new.get("readers", A.UPLOAD_READERS)))
    print(f"{args.path}: {size / 1e9:.2f} GB, {res['gpu_bytes'] / 1e9:.2f} GB in "
          f"{res['segments']} segments to a {dev} arena; ring {res['ring']}", flush=True)
    runs = []
    for mode in args.modes.split(","):
        for rep in range(args.reps):
            for name, fn in impls.items():
                r: dict = {"impl": name, "mode": mode, "rep": rep}
                if mode == "cold":
                    drop_page_cache(args.path)
                elif mode == "warm":
                    r["warm_read_s"] = warm_page_cache(args.path)
                else:
                    raise SystemExit(f"unknown mode {mode!r}")
                r["cached_before"] = cached_fraction(args.path)
                rss0 = proc_status().get("VmRSS", 0)
                reset_peak_rss()
                t0 = time.perf_counter()
                up = fn(inv, plan.placement, arena, progress=args.progress,
                        **(kw_new if name == "new" else kw))
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                r["wall_s"] = time.perf_counter() - t0
                r.update(bytes=up.bytes, seconds=up.seconds, GBps=up.bytes / up.seconds / 1e9,
                         released=up.released_bytes, cached_after=cached_fraction(args.path),
                         peak_extra_rss=proc_status().get("VmHWM", 0) - rss0)
                if dev.type == "cuda" and rep == 0:
                    r["verified"] = verify(inv, plan.placement, arena)
                runs.append(r)
                cb, ca = r["cached_before"], r["cached_after"]
                print(f"{name:>8} {mode:>5} #{rep}: {up.bytes / 1e9:6.2f} GB in {up.seconds:6.2f} s "
                      f"= {r['GBps']:6.2f} GB/s  released {up.released_bytes / 1e9:6.2f} GB  "
                      f"cached {'?' if cb is None else f'{cb:.0%}'} -> "
                      f"{'?' if ca is None else f'{ca:.0%}'}  "
                      f"peak extra RSS {r['peak_extra_rss'] / 2**20:7.0f} MiB"
                      + (f"  verified={r['verified']}" if "verified" in r else ""), flush=True)
    res["runs"] = runs
    for name in impls:
        for mode in args.modes.split(","):
            xs = [r["GBps"] for r in runs if r["impl"] == name and r["mode"] == mode]
            if xs:
                print(f"best {name:>8} {mode:>5}: {max(xs):6.2f} GB/s", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "upload_speed.json").write_text(json.dumps(res, indent=1, default=str))
    return 0 if all(r.get("verified", True) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
