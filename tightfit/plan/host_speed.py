"""How fast the host computes each weight format, and what a placement's host rows cost per token
(issue 5: the planner picks WHICH rows go to the host by this, tightfit.plan.rowsplit).

Figures are GB/s of weight bytes of the host GEMV kernels (tightfit.kernels.cpu_gemv) inside a
real decode step with 16 threads: the per-token host profile of the seed-mix 27B at 8 GiB
(`python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0`,
device run of 2026-11-29; 346.6 ms/token). In-model figures, not the isolated ones (80-90 GB/s
for IQ4_XS/Q5_K in bench/RESULTS.md, "host GEMV, 16 threads"), because the estimate is printed
beside a measured decode: threads share the memory bus with the device copies and pay a fixed
cost per call there. What the ORDER of the placer needs is only the ratio between classes, which
both measurements agree on: the AVX2/AVX-512 block kernels run 4-5x faster than the portable
low-bit kernels (isolated 80-90 vs 8-11 GB/s; in-model ~40 vs ~8).
"""
from __future__ import annotations

from typing import Mapping

from tightfit.plan.placement import Placement, TensorSpec, type_name

#: Speed classes, fastest first; the placer moves a whole class before the next. A class holds
#: formats whose figures (HOST_GBPS) sit within one profile's noise (39.1 vs 41.9 GB/s) or share
#: a kernel path: inside a class the placer keeps its layer rule instead of chasing the noise.
CLASSES: dict[str, tuple[str, ...]] = {
    # gemv_simd / gemv_avx512: explicit vpshufb/vpmaddubsw (VNNI) block code, grouped calls
    "simd": ("IQ4_XS", "Q4_K", "Q5_K", "Q6_K"),
    # the 32-element fp32 kernel, one call per matrix (outside the grouped loop)
    "fp32_q8": ("Q8_0",),
    # cpu_gemv_ternary's grouped kernel
    "ternary": ("TQ2_0", "TQ1_0"),
    # cpu_gemv_lowbit.gemv_lowbit_group (the portable gemv_int / gemv_iq row code), and Q4_0,
    # whose fp32 kernel runs about as fast
    "portable": ("IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "Q2_K", "Q3_K", "Q4_0"),
    # the fp32 kernel's IQ4_NL path (table lookups per element)
    "fp32_iq4nl": ("IQ4_NL",),
}
#: Anything else (F32, F16, BF16, IQ2_XXS, IQ1_S, ...) has no native host GEMV: the NumPy
#: dequantizer, a few rows at a time.
FALLBACK = "fallback"

#: GB/s per type. Measured in-model (profile above, "group:<type>" / "lowbit_group:<type>" rows):
#: Q5_K 39.1, IQ4_XS 40.5, Q6_K 41.9, IQ2_S 7.8, IQ3_XXS 9.0, IQ3_S 8.1, Q3_K 7.5. The others
#: take a conservative figure of their class, as noted.
HOST_GBPS: dict[str, float] = {
    "Q5_K": 39.1, "IQ4_XS": 40.5, "Q6_K": 41.9,
    "Q4_K": 39.1,        # same SIMD kernel as Q5_K (fewer bytes per block): the class's lowest
    "IQ2_S": 7.8, "IQ3_XXS": 9.0, "IQ3_S": 8.1, "Q3_K": 7.5,
    "IQ2_XS": 7.5, "Q2_K": 7.5,   # same lowbit_group code path, not profiled: the class's lowest
    # Not profiled on the device. One thread on the 2-core dev box (bench/cpu_gemv.py --rows 4096
    # --threads 1, two runs), relative to IQ4_XS's 14.3 GB/s there: Q8_0 0.54-0.63x, Q4_0 0.22x,
    # IQ4_NL 0.075x; scaled to IQ4_XS's in-model 40.5 and rounded down. (The portable low-bit
    # kernels read 0.13-0.14x there against 0.19-0.22x in-model: the scaling is conservative.)
    "Q8_0": 20.0, "Q4_0": 8.0, "IQ4_NL": 2.5,
    # 8 GiB ternary 27B (RESULTS.md, session call 4): 17.26 tok/s with 660 MB of TQ2_0 rows, so
    # the whole 58 ms step bounds them from below at 11.4 GB/s
    "TQ2_0": 11.0, "TQ1_0": 11.0,
}
#: NumPy dequantizer path: the ternary rows before their native kernel ran 660 MB in 6.5 s per
#: token (RESULTS.md, 8 GB profile, ternary 27B) = 0.1 GB/s
FALLBACK_GBPS = 0.1

#: The host embedding is decoded one row per token (decode_rows), not a GEMV over its rows.
EMBEDDING = "token_embd.weight"


def speed_class(qtype: int) -> str:
    name = type_name(qtype)
    for cls, types in CLASSES.items():
        if name in types:
            return cls
    return FALLBACK


def host_gbps(qtype: int) -> float:
    return HOST_GBPS.get(type_name(qtype), FALLBACK_GBPS)


def speed_rank(qtype: int) -> int:
    """0 for the fastest class, larger for slower ones: the placer moves rows in this order."""
    cls = speed_class(qtype)
    return len(CLASSES) if cls == FALLBACK else list(CLASSES).index(cls)


def host_ms(qtype: int, nbytes: int) -> float:
    """ms per token to read `nbytes` of this type on the host once (one decode token)."""
    return nbytes / (host_gbps(qtype) * 1e6)


def host_ms_by_type(placement: Placement, tensors: Mapping[str, TensorSpec]) -> dict[str, float]:
    """Estimated host GEMV ms per decode token of each type's host rows (embedding left out)."""
    out: dict[str, float] = {}
    for s in placement.host_segments():
        if s.tensor == EMBEDDING:
            continue
        t = tensors[s.tensor]
        name = type_name(t.qtype)
        out[name] = out.get(name, 0.0) + host_ms(t.qtype, s.nbytes)
    return out


def host_ms_per_token(placement: Placement, tensors: Mapping[str, TensorSpec]) -> float:
    """Sum over host rows of bytes / GB/s of their format: the host kernels' share of one decode
    token (not the transfers, the GPU part or the per-call overhead)."""
    return sum(host_ms_by_type(placement, tensors).values())
