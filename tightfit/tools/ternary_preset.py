"""Proposed preset `qwen3.8-27b-ternary`: the 27B geometry with ternary matrices, as PrismML's
Ternary-Bonsai 27B ships it (spec/quant-formats.md §5.2: every matrix low-bit, embeddings and LM
head included; only the recurrent-state path and the norms stay in higher precision, ~0.1 % of
the parameters). Here: `ssm_alpha`/`ssm_beta` Q8_0 (23.6 M parameters, 0.09 %), vectors F32 (the
generator's rule), every other matrix ternary.

For tightfit/model/presets.py (owner: the generator): register `ternary_type` as
`MIXES["ternary"]`, add `"qwen3.8-27b-ternary": QWEN35_27B` to GEOMETRIES and make `--mix ternary
--vocab real` its default (as SEEDMIX_PRESETS does for the seed mix). The matrix type is TQ2_0,
the 2-bit container the generator can write (gguf-py quantizes it exactly from ternary values),
which `tightfit repack` turns into T3_256; Q2_0 (PrismML's mainline container) is sized too.

`preset_bytes(matrix_type)` gives exact data-section bytes (32-byte padding after each tensor,
as the generator writes), without writing anything.
"""
from __future__ import annotations

import re

from tightfit.model.config import QWEN35_27B, Qwen35Config
from tightfit.tools import gguf_rewrite as G

PRESET = "qwen3.8-27b-ternary"
_HIGH = re.compile(r"^blk\.\d+\.ssm_(alpha|beta)\.weight$")
_IDS = {"F32": 0, "Q8_0": 8, "TQ1_0": 34, "TQ2_0": 35, "Q2_0": 42,
        "TF_T3_64": 3064, "TF_T3_256": 3256}


def ternary_type(name: str, cfg: Qwen35Config, matrix_type: str = "TQ2_0") -> str:
    """Type of one matrix in the ternary recipe (same signature as presets.seedmix_type)."""
    if _HIGH.match(name):
        return "Q8_0"
    return matrix_type


def tensor_types(cfg: Qwen35Config = QWEN35_27B, matrix_type: str = "TQ2_0") -> dict[str, str]:
    return {n: ("F32" if cfg.is_vector_tensor(n) else ternary_type(n, cfg, matrix_type))
            for n in cfg.tensor_shapes(include_mtp=True)}


def preset_bytes(matrix_type: str = "TQ2_0", cfg: Qwen35Config = QWEN35_27B) -> dict[str, int]:
    """Exact data bytes of the preset with `matrix_type` for the ternary matrices, per type and
    in total (each tensor padded to 32 bytes)."""
    out: dict[str, int] = {}
    total = 0
    for name, tname in tensor_types(cfg, matrix_type).items():
        nb = G.tensor_nbytes(cfg.tensor_shapes(include_mtp=True)[name], _IDS[tname])
        out[tname] = out.get(tname, 0) + nb
        total += nb + (-nb) % 32
    out["total_padded"] = total
    return out
