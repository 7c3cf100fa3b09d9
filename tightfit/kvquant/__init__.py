"""Quantized KV cache (issue 11): q8_0 and TurboQuant-style tq2/tq3/tq4 formats.

* `formats`   — format table, exact byte accounting, rotation, Lloyd-Max codebooks;
* `reference` — torch quantize / dequantize, quantize-on-write, float64 attention oracle, the
  `kv_roundtrip` hook / `RoundtripKVState` for the CPU ReferenceModel;
* `quality`   — measurements against the FP16 cache;
* kernel: tightfit/kernels/attn_decode_q.py.

Importing this package registers every format (and the mixed K/V types of `formats.MIXED`)
with the planner, `tightfit.plan.budget.register_kv_format`, so that `--kv-type tq3` is priced.
"""
from __future__ import annotations

import math

from tightfit.kvquant.formats import (FORMATS, MIXED, KVQuantFormat, get_format,  # noqa: F401
                                      kv_bytes_per_token, split_kv_type)

# The planner has one `runtime` flag per format: can the executors read this cache? They can: the
# CPU path (ReferenceModel + State, `--kv-type tq3 --device cpu`) and the GPU executor, legacy and
# placed (`GPUModel(kv_type=)`, `--vram`: the cache is a region of the plan's arena, priced by this
# format's bytes) quantize on write (kv_write_q) and attend over the codes (attn_decode_q). On the
# H200 (bench/RESULTS.md, session 3 call 4) the CUDA attention kernel matches float64 on the same
# codes to ~5e-4; per layer at 32K q8_0 takes 0.91x the f16 time and tq3/tq4 1.8-1.9x (the Triton
# fallback 2-3x); each format's note says so (`tightfit plan --kv-type tq3` prints it).
RUNTIME = True
CPU_NOTE = ("; runs on the CPU and GPU paths (GPU decode attention per layer at 32K on the H200, "
            "CUDA kernel: q8_0 0.91x the f16 time, tq3/tq4 1.8-1.9x; Triton fallback 2-3x)")


def planner_format(kv_type: str):
    """The planner's KVFormat for kv_type ('tq3' or '<k>+<v>'). The planner prices K and V with
    one (block, block_bytes) pair; for a mixed type the block is the lcm of the two groups
    (doubled when needed) and block_bytes the mean of the K and V bytes of that block, which is
    exact whenever n_head_kv * head_dim is a multiple of the block (every geometry here)."""
    from tightfit.plan.budget import KVFormat
    kn, vn = split_kv_type(kv_type)
    kf, vf = get_format(kn), get_format(vn)
    block = kf.group * vf.group // math.gcd(kf.group, vf.group)
    both = kf.bytes_for(block) + vf.bytes_for(block)
    if both % 2:
        block, both = 2 * block, 2 * both
    name = kn if kn == vn else f"{kn}+{vn}"
    if kn == vn:
        note = (f"{kf.bits}-bit codes + fp16 scale per {kf.group}: {kf.block_bytes} B/{kf.group} "
                f"values, {kf.bits_per_value:g} bpv" + (" (rotated, Lloyd-Max)" if kf.rotate else ""))
    else:
        note = f"K {kn} ({kf.bits_per_value:g} bpv) + V {vn} ({vf.bits_per_value:g} bpv)"
    return KVFormat(name, block, both // 2, runtime=RUNTIME, note=note + CPU_NOTE)


def register_planner_formats() -> list[str]:
    from tightfit.plan.budget import KV_FORMATS, register_kv_format
    names = []
    for kv_type in (*FORMATS, *MIXED):
        fmt = planner_format(kv_type)
        if kv_type == "q8_0" and "q8_0" in KV_FORMATS:
            old = KV_FORMATS["q8_0"]
            assert (old.block, old.block_bytes) == (fmt.block, fmt.block_bytes)
            note = old.note if CPU_NOTE in old.note else old.note + CPU_NOTE
            fmt = type(old)(old.name, old.block, old.block_bytes, runtime=RUNTIME, note=note)
        register_kv_format(fmt)
        names.append(fmt.name)
    return names


register_planner_formats()
