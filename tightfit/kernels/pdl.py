"""Programmatic dependent launch (PDL, sm_90+): one switch for every kernel of the decode step.

A kernel launched with the PDL attribute may start while the kernel before it on the stream is
still running; it must execute `griddepcontrol.wait` (Triton: `tl.extra.cuda.gdc_wait()`) before
it reads anything an earlier kernel wrote or writes anything an earlier kernel may still read.
What it does before the wait (address arithmetic, loads of weights, which no kernel of the step
writes) overlaps the previous kernel's tail and the launch latency. A kernel that signals
`griddepcontrol.launch_dependents` lets the next PDL kernel be scheduled before it finishes.

Rules every kernel launched through this switch follows:
  * only immutable inputs (weights, codebooks, rotation matrices) are touched before the wait;
  * every program executes the wait (also programs that exit early);
  * launch_dependents is a hint and never replaces the wait in the next kernel.
Kernels launched without the attribute keep full stream order, so the switch can be applied
kernel by kernel.

On by default on sm_90+ (the seed-mix 27B decodes 125.4 -> 132.1 tok/s at depth 0 and 114.7 ->
121.3 at 32K with bitwise-identical logits, bench/RESULTS.md session 6); TIGHTFIT_PDL=0 turns it
off, TIGHTFIT_PDL_OFF=<name>[,<name>] only for the named launches (a diagnosis switch). Never under
TRITON_INTERPRET or below sm_90.

A grid that fits more CTAs per SM than its even share can come out slower with PDL: placed while
the kernels before it still hold SMs, it may stack CTAs on some SMs and leave others short
(the quantized-KV attention: 36 -> 71 us per layer at 32K, session 9). Such a launch caps its
residency at ceil(grid / SMs) (attn_decode_q_cuda.spread_smem).
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch


def _env_on() -> bool:
    return os.environ.get("TIGHTFIT_PDL", "1").strip() not in ("", "0", "false", "off", "no")


@lru_cache(maxsize=None)
def _capable(device_index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available():
        return False
    major, _minor = torch.cuda.get_device_capability(device_index)
    return major >= 9


def _off_for(name: str | None) -> bool:
    """TIGHTFIT_PDL_OFF=name[,name]: kernels launched without PDL while the rest keep it (a
    diagnosis switch: which launch loses the overlap). Names: attnq_cuda."""
    if not name:
        return False
    return name in {n.strip() for n in os.environ.get("TIGHTFIT_PDL_OFF", "").split(",")}


def enabled(device=None, name: str | None = None) -> bool:
    """True when kernels on `device` (torch.device, index or None = current) launch with PDL
    (`name`: the launch's name for TIGHTFIT_PDL_OFF)."""
    if not _env_on() or _off_for(name):
        return False
    if device is None:
        idx = torch.cuda.current_device() if torch.cuda.is_available() else 0
    elif isinstance(device, torch.device):
        if device.type != "cuda":
            return False
        idx = device.index if device.index is not None else torch.cuda.current_device()
    else:
        idx = int(device)
    return _capable(idx)


def triton_launch_kwargs(device=None) -> dict:
    """Extra launch keyword arguments for a Triton kernel that honours the rules above (it takes
    a `PDL: tl.constexpr` and calls gdc_wait when it is set): {"launch_pdl": True} or {}."""
    return {"launch_pdl": True} if enabled(device) else {}
