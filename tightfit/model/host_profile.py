"""Per-token wall-time breakdown of the placed decode step (issue 5), opt-in with
TIGHTFIT_HOST_PROFILE=1: GPUModel.host_profile times each uncaptured step_token in disjoint buckets
(embedding, x to the host, the wait for it, x quantization, the numba kernels, copies back, the GPU
tail, the rest) and keeps one record per host call; bench/plan_vram.py prints `HostProfile.table`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch


# ---- per-token host profile (TIGHTFIT_HOST_PROFILE=1) ---------------------------------------
#: Read ONCE, at import. Off (the default): GPUModel creates no HostProfile, its step and host
#: branch test one attribute against None and make no timing call; cpu_gemv's hooks test one
#: module global against None.
HOST_PROFILE = os.environ.get("TIGHTFIT_HOST_PROFILE", "").strip() not in ("", "0")

#: Disjoint per-token buckets of the placed decode step's wall time (GPUModel.step_token entry to
#: the step's completion sync); `other` is the rest of the wall time.
#:   embed      _load_embedding: host row decode (+ copy into pinned memory + H2D enqueue), or
#:              the token id fill on the device-embedding path
#:   x_d2h      to_host_async of x: pinned buffer (waits for its previous copy) + D2H enqueue
#:   x_wait     the event synchronize: waiting for x on the host, i.e. for every GPU op queued
#:              before it (the GPU time between host calls shows up here)
#:   x_quant    x quantized to int8 on the CPU (Group.gemv, once per group)
#:   kernel     the numba kernel calls (grouped SIMD / ternary kernels; the per-matrix `gemv`
#:              calls of the types the grouped kernels do not run, their own x quantization
#:              included)
#:   gemv_other the rest of HostGroup.gemv (Python, thread count / chunk size settings)
#:   copy_back  output buffer (waits for its previous copy) + host -> pinned -> device enqueues
#:   replay     segment graph launches + event records (tightfit.model.segments, the
#:              TIGHTFIT_HOST_GRAPHS path; 0 on the eager path, where x_d2h and copy_back are the
#:              eager copies that the graphs hold as memcpy nodes)
#:   gpu_tail   from the end of the step's last host call (or of the embedding when it has none)
#:              to the completion sync: the launches after it and the GPU work behind them
#:   other      the rest: Python and launch overhead of the eager GPU ops before the last host
#:              call, the host-group lookup (on the segment path: the Python loop between
#:              replays)
MEASURED = ("embed", "x_d2h", "x_wait", "x_quant", "kernel", "gemv_other", "copy_back",
            "replay", "gpu_tail")
BUCKETS = MEASURED + ("other",)


def _qname(qt: int) -> str:
    try:
        from tightfit.plan.placement import type_name
        return str(type_name(int(qt)))
    except Exception:  # noqa: BLE001 - a label only
        return str(qt)


class HostProfile:
    """Per-token wall-time breakdown of the placed decode step (GPUModel.host_profile, created
    only with TIGHTFIT_HOST_PROFILE=1). `tokens` holds one record per profiled step_token:
    wall ns, the buckets (ns), each host call (group names, weight bytes, kernel ns, call ns)
    and the kernel calls by label (kind, ggml types) -> [calls, bytes, ns]. `summary()` averages
    them per token; `reset()` drops them (e.g. after a warm-up)."""

    now = staticmethod(time.perf_counter_ns)

    def __init__(self) -> None:
        self.tokens: list[dict] = []
        self._cur: dict | None = None

    def reset(self) -> None:
        self.tokens.clear()

    # -- one token (GPUModel.step_token)
    def step(self, exe: Any, tok: Any, st: Any, mode: str, head: bool, feed: bool,
             run: Any = None) -> None:
        """Time one step: the embedding, then `run()` (default: the eager exe._step; the
        segment-graph path passes its replay), then the completion sync."""
        from tightfit.kernels import cpu_gemv
        now = self.now
        cur = self._cur = {"t0": now(), "b": dict.fromkeys(MEASURED, 0), "calls": [],
                           "kern": {}, "cq": 0, "ck": 0}
        t = now()
        exe._load_embedding(tok)
        cur["last"] = self.lap("embed", t)
        cpu_gemv.set_profile(self)
        try:
            if run is None:
                exe._step(st, mode, head, feed)
            else:
                run()
        except BaseException:
            self._cur = None
            raise
        finally:
            cpu_gemv.set_profile(None)
        t_launched = now()
        if exe.device.type == "cuda":
            torch.cuda.synchronize(exe.device)
        t_end = now()
        b = cur["b"]
        b["gpu_tail"] = t_end - cur["last"]
        wall = t_end - cur["t0"]
        b["other"] = wall - sum(b[k] for k in MEASURED)
        self.tokens.append({"wall": wall, "b": b, "calls": cur["calls"], "kern": cur["kern"],
                            "final_sync": t_end - t_launched})
        self._cur = None

    def lap(self, bucket: str, t0: int) -> int:
        """Add now - t0 to `bucket` of the current token; returns now."""
        t = self.now()
        if self._cur is not None:
            self._cur["b"][bucket] += t - t0
        return t

    def host_call(self, names: tuple, nbytes: int, t0: int) -> int:
        """One HostGroup.gemv that started at t0 just ended: its quantization and kernel time
        (reported by cpu_gemv meanwhile) go to their buckets, the rest to gemv_other."""
        t = self.now()
        cur = self._cur
        if cur is not None:
            q, k = cur["cq"], cur["ck"]
            b = cur["b"]
            b["x_quant"] += q
            b["kernel"] += k
            b["gemv_other"] += max(0, t - t0 - q - k)
            cur["calls"].append((names, int(nbytes), k, t - t0))
            cur["cq"] = cur["ck"] = 0
        return t

    def host_done(self, t: int) -> None:
        """The end of a host call (copies back enqueued): gpu_tail is measured from here."""
        if self._cur is not None:
            self._cur["last"] = t

    # -- cpu_gemv's sink (set only inside a profiled step)
    def gemv_quant(self, t0: int) -> int:
        t = self.now()
        if self._cur is not None:
            self._cur["cq"] += t - t0
        return t

    def gemv_kernel(self, label: tuple, nbytes: int, t0: int) -> int:
        t = self.now()
        cur = self._cur
        if cur is not None:
            cur["ck"] += t - t0
            k = cur["kern"].setdefault(label, [0, 0, 0])
            k[0] += 1
            k[1] += int(nbytes)
            k[2] += t - t0
        return t

    # -- report
    def summary(self, skip: int = 0) -> dict:
        """Means per token over the recorded tokens after the first `skip`."""
        toks = self.tokens[skip:]
        n = len(toks)
        if not n:
            return {"tokens": 0}
        ms = 1e-6
        wall = sum(t["wall"] for t in toks) / n
        buckets = {k: sum(t["b"][k] for t in toks) / n * ms for k in BUCKETS}
        calls = [c for t in toks for c in t["calls"]]
        host_bytes = sum(c[1] for c in calls) / n
        kern_ns = sum(t["b"]["kernel"] for t in toks) / n
        out: dict = {
            "tokens": n,
            "wall_ms": wall * ms,
            "buckets_ms": buckets,
            "buckets_pct": {k: 100 * v / (wall * ms) if wall else 0.0 for k, v in buckets.items()},
            "final_sync_ms": sum(t["final_sync"] for t in toks) / n * ms,
            "host_calls_per_token": len(calls) / n,
            "host_bytes_per_token": host_bytes,
            "kernel_only_GBps": host_bytes / kern_ns if kern_ns else None,
            "host_call_GBps": (host_bytes / sum(c[3] for c in calls) * n) if calls else None,
        }
        if calls:
            nb = np.array([c[1] for c in calls], np.float64)
            gbs = np.array([c[1] / c[2] if c[2] else np.nan for c in calls], np.float64)
            out["call_bytes"] = {"min": float(nb.min()), "median": float(np.median(nb)),
                                 "max": float(nb.max())}
            ok = gbs[np.isfinite(gbs)]
            if ok.size:
                out["call_kernel_GBps"] = {
                    "min": float(ok.min()), "p10": float(np.percentile(ok, 10)),
                    "median": float(np.median(ok)), "p90": float(np.percentile(ok, 90)),
                    "max": float(ok.max())}
            # kernel time by call size: do small calls waste the threads?
            small = nb < (4 << 20)
            kt = np.array([c[2] for c in calls], np.float64)
            out["small_calls"] = {"limit_bytes": 4 << 20, "count_per_token": float(small.sum() / n),
                                  "kernel_ms_per_token": float(kt[small].sum() / n * ms),
                                  "bytes_per_token": float(nb[small].sum() / n)}
            per: dict = {}                 # host group -> [calls, bytes, kernel ns, call ns]
            for c in calls:
                e = per.setdefault(c[0], [0, 0, 0, 0])
                e[0] += 1
                e[1] += c[1]
                e[2] += c[2]
                e[3] += c[3]
            slow = sorted(per.items(), key=lambda kv: kv[1][1] / kv[1][2] if kv[1][2] else 0.0)
            out["slowest_calls"] = [
                {"names": list(k), "bytes": b / c, "kernel_ms": kn / c * ms, "call_ms": cn / c * ms,
                 "GBps": b / kn if kn else 0.0} for k, (c, b, kn, cn) in slow[:6]]
        by: dict = {}
        for t in toks:
            for (kind, qts), (c, b, ns) in t["kern"].items():
                lab = f"{kind}:" + "+".join(sorted({_qname(q) for q in qts}))
                e = by.setdefault(lab, [0, 0, 0])
                e[0] += c
                e[1] += b
                e[2] += ns
        out["by_kernel"] = {lab: {"calls_per_token": c / n, "MB_per_token": b / n / 1e6,
                                  "ms_per_token": ns / n * ms, "GBps": b / ns if ns else None}
                            for lab, (c, b, ns) in sorted(by.items(), key=lambda kv: -kv[1][2])}
        return out

    @staticmethod
    def table(s: dict) -> str:
        """The summary as a printable table (ms per token, % of the token)."""
        if not s.get("tokens"):
            return "host profile: no profiled token"
        lines = [f"host profile: {s['tokens']} tokens, {s['wall_ms']:.1f} ms/token, "
                 f"{s['host_calls_per_token']:.0f} host calls/token, "
                 f"{s['host_bytes_per_token'] / 1e9:.3f} GB host rows/token",
                 f"{'bucket':<11} {'ms/token':>9} {'%':>6}"]
        for k in BUCKETS:
            lines.append(f"{k:<11} {s['buckets_ms'][k]:>9.2f} {s['buckets_pct'][k]:>6.1f}")
        g = s.get("kernel_only_GBps")
        lines.append(f"kernel-only GB/s (host bytes / kernel time): "
                     f"{'n/a' if g is None else f'{g:.1f}'}; whole host calls: "
                     f"{s['host_call_GBps'] or 0:.1f} GB/s; final sync {s['final_sync_ms']:.2f} ms")
        if "call_bytes" in s:
            cb, cg = s["call_bytes"], s.get("call_kernel_GBps", {})
            lines.append(f"bytes/call min {cb['min'] / 1e6:.2f} MB, median {cb['median'] / 1e6:.2f},"
                         f" max {cb['max'] / 1e6:.2f}; kernel GB/s per call min "
                         f"{cg.get('min', 0):.1f} p10 {cg.get('p10', 0):.1f} median "
                         f"{cg.get('median', 0):.1f} p90 {cg.get('p90', 0):.1f} max "
                         f"{cg.get('max', 0):.1f}")
            sc = s["small_calls"]
            lines.append(f"calls < {sc['limit_bytes'] >> 20} MiB: {sc['count_per_token']:.0f}/token,"
                         f" {sc['kernel_ms_per_token']:.2f} ms kernel, "
                         f"{sc['bytes_per_token'] / 1e6:.1f} MB")
        lines.append(f"{'kernel':<28} {'calls':>6} {'MB/tok':>8} {'ms/tok':>8} {'GB/s':>7}")
        for lab, e in s["by_kernel"].items():
            lines.append(f"{lab:<28} {e['calls_per_token']:>6.1f} {e['MB_per_token']:>8.1f} "
                         f"{e['ms_per_token']:>8.2f} {e['GBps'] or 0:>7.1f}")
        for c in s.get("slowest_calls", []):
            lines.append(f"slow call {'+'.join(n.split('.weight')[0] for n in c['names'])}: "
                         f"{c['bytes'] / 1e6:.1f} MB, kernel {c['kernel_ms']:.2f} ms "
                         f"({c['GBps']:.1f} GB/s), call {c['call_ms']:.2f} ms")
        return "\n".join(lines)
