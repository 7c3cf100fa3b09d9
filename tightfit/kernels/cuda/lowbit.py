"""Low-bit formats of gemv_fmt_lowbit.cuh: GGML type id -> struct name (mirrors the header's
TF_LOWBIT_FORMATS X-macro; tests check that the two agree)."""
from __future__ import annotations

LOWBIT_FORMATS = {
    10: "F_Q2_K", 11: "F_Q3_K", 16: "F_IQ2_XXS", 17: "F_IQ2_XS", 22: "F_IQ2_S",
    18: "F_IQ3_XXS", 21: "F_IQ3_S", 34: "F_TQ1_0", 35: "F_TQ2_0", 41: "F_Q1_0", 42: "F_Q2_0",
}
