"""Named geometries, quant-mix recipes and weight-init rules for synthetic qwen35 files.

The generator (tightfit.model.generate) asks this module three questions about every tensor:
which geometry, which GGML type, and what the random values should look like. Keeping the
answers here, as plain data, lets `plan_model_bytes` size the 16 GB benchmark file without
writing it and lets tests check the recipe against the byte facts of seed 000.
"""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import Callable, Mapping

from tightfit.errors import UserError
from tightfit.model.config import QWEN35_27B, TINY, Qwen35Config, _geom

# ---- geometries ------------------------------------------------------------------------------
# Rules a tiny geometry must follow so that llama.cpp accepts it (spec/gguf-synthetic-traps.md §8):
# at least one full-attention block (n_layer >= 4 with interval 4), rope sections summing to
# n_rot/2 (otherwise IMROPE silently leaves pairs unrotated), ssm.inner_size = Hv*S.
# K/IQ types need every row length (E, n_ff, H*D, Hv*S) to be a multiple of 256.

#: The spec's tiny oracle geometry (spec/gguf-synthetic-traps.md §5): every row a multiple of 256.
SMALL = _geom(n_embd=256, n_ff=768, n_layer=8, n_head=6, n_head_kv=2, head_dim=128, n_rot=32,
              rope_sections=(6, 5, 5, 0), ssm_state=128, ssm_k_heads=2, ssm_v_heads=6,
              ssm_inner=768, n_vocab=1000, n_ctx_train=4096)

#: 12 layers, Hv == Hk (no V-head tiling at all), one KV head (MQA), head dim 64.
SMALL_MQA = _geom(n_embd=256, n_ff=512, n_layer=12, n_head=4, n_head_kv=1, head_dim=64, n_rot=16,
                  rope_sections=(3, 3, 2, 0), ssm_state=64, ssm_k_heads=4, ssm_v_heads=4,
                  ssm_inner=256, n_vocab=1000, n_ctx_train=4096)

#: 8 layers, plain MHA (H == Hkv), Hv/Hk = 4, full rope on a 64-dim head, wider hidden.
SMALL_MHA = _geom(n_embd=512, n_ff=1024, n_layer=8, n_head=8, n_head_kv=8, head_dim=64, n_rot=64,
                  rope_sections=(11, 11, 10, 0), ssm_state=64, ssm_k_heads=2, ssm_v_heads=8,
                  ssm_inner=512, n_vocab=1000, n_ctx_train=4096)

#: 9 layers (the last block recurrent), GQA 8:2 with head dim 32, Hv/Hk = 2.
SMALL_ODD = _geom(n_embd=256, n_ff=256, n_layer=9, n_head=8, n_head_kv=2, head_dim=32, n_rot=8,
                  rope_sections=(2, 1, 1, 0), ssm_state=32, ssm_k_heads=4, ssm_v_heads=8,
                  ssm_inner=256, n_vocab=1000, n_ctx_train=4096)

GEOMETRIES: dict[str, Qwen35Config] = {
    "tiny": TINY,             # E=64: only types with 32-element blocks fit
    "small": SMALL,
    "small-mqa": SMALL_MQA,
    "small-mha": SMALL_MHA,
    "small-odd": SMALL_ODD,
    "qwen3.8-27b-seedmix": QWEN35_27B,
    "qwen3.8-27b-ternary": QWEN35_27B,   # the 8 GB card (seed 004): every matrix ternary
    "27b": QWEN35_27B,
}

#: Presets whose default is the seed-mix quant recipe and the real 248,320-token vocabulary.
SEEDMIX_PRESETS = {"qwen3.8-27b-seedmix"}
#: Preset -> its default mix (and the real vocabulary).
PRESET_MIX = {"qwen3.8-27b-seedmix": "seedmix", "qwen3.8-27b-ternary": "ternary"}


def geometry(preset: str, *, layers: int | None = None, n_vocab: int | None = None,
             mtp: bool = False, tied: bool = False) -> Qwen35Config:
    """The Qwen35Config of `preset`, optionally sliced to `layers` trunk blocks."""
    if preset not in GEOMETRIES:
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(GEOMETRIES)}")
    cfg = GEOMETRIES[preset]
    changes: dict = {"nextn_layers": 1 if mtp else 0, "tied_output": bool(tied)}
    if layers is not None:
        if layers < cfg.full_attention_interval:
            # llama.cpp builds a KV cache with zero layers and aborts (traps §8).
            raise UserError(f"--layers {layers}: need at least {cfg.full_attention_interval} layers "
                            "so that one block is full attention")
        changes["n_layer"] = int(layers)
    if n_vocab is not None:
        changes["n_vocab"] = int(n_vocab)
    cfg = dataclasses.replace(cfg, **changes)
    cfg.validate()
    return cfg


# ---- quant-mix recipes -------------------------------------------------------------------------
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")

#: GGML types the generator can produce (block-domain sampler or float path).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                   "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                   "IQ1_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")


def _in(il: int, *ranges: tuple[int, int]) -> bool:
    return any(a <= il <= b for a, b in ranges)


def seedmix_type(name: str, cfg: Qwen35Config) -> str:
    """Type of one matrix in the benchmark recipe (shared/bench/seed-mix.md, table verbatim)."""
    if name == "token_embd.weight":
        return "Q3_K"
    if name == "output.weight":
        return "Q6_K"
    m = _BLK.match(name)
    if not m:
        raise KeyError(name)
    il, t = int(m.group(1)), m.group(2)
    if il >= cfg.n_layer:
        # MTP block: seed 000 only says its ffn_down is a 73.1 MB Q6_K matrix; the rest follows
        # the attention-block defaults, eh_proj is our choice (Q6_K, like the output head).
        if t in ("ffn_down.weight", "nextn.eh_proj.weight"):
            return "Q6_K"
        il = -1  # no per-layer exception applies
    table: dict[str, Callable[[int], str]] = {
        "attn_qkv.weight": lambda i: "IQ4_XS",
        "attn_gate.weight": lambda i: "IQ4_XS",
        "ssm_alpha.weight": lambda i: "Q8_0",
        "ssm_beta.weight": lambda i: "Q8_0",
        "ssm_out.weight": lambda i: "Q5_K",
        "attn_q.weight": lambda i: {3: "IQ4_NL", 15: "Q2_K"}.get(i, "IQ4_XS"),
        "attn_k.weight": lambda i: "Q6_K",
        "attn_v.weight": lambda i: "Q6_K" if i in (23, 63) else "Q5_K",
        "attn_output.weight": lambda i: "Q5_K",
        "ffn_gate.weight": lambda i: ("IQ2_XS" if i in (0, 12) else "Q3_K" if i == 13
                                      else "IQ2_S" if _in(i, (14, 17)) else "IQ4_XS"),
        "ffn_up.weight": lambda i: ("Q4_K" if _in(i, (1, 7)) else "Q3_K" if i == 13
                                    else "IQ2_S" if _in(i, (14, 17)) else "IQ3_S" if _in(i, (18, 19))
                                    else "Q5_K" if _in(i, (36, 56)) else "IQ4_XS"),
        "ffn_down.weight": lambda i: ("Q3_K" if i == 13 else "IQ3_XXS" if _in(i, (14, 17))
                                      else "Q6_K" if _in(i, (56, 63)) else "Q5_K"),
    }
    if t not in table:
        raise KeyError(name)
    return table[t](il)


#: A mixed recipe for tiny files: every block gets a different type per matrix, cycling through
#: the K/IQ set, so one small file covers many formats (needs rows that are multiples of 256).
COVER_CYCLE = ("Q4_K", "IQ4_XS", "Q5_K", "Q6_K", "Q3_K", "IQ2_XS", "IQ3_S", "Q2_K", "IQ2_S",
               "IQ3_XXS", "IQ4_NL", "Q8_0", "IQ2_XXS", "Q4_0", "Q5_0")


@lru_cache(maxsize=16)
def _matrix_order(cfg: Qwen35Config) -> dict[str, int]:
    names = [n for n in cfg.tensor_shapes(include_mtp=True) if not cfg.is_vector_tensor(n)]
    return {n: i for i, n in enumerate(names)}


def cover_type(name: str, cfg: Qwen35Config) -> str:
    """Matrices in file order take the types of COVER_CYCLE in turn: with 7 matrices per block
    and 15 types, every type lands on several different matrix kinds and sizes."""
    if name == "token_embd.weight":
        return "Q6_K"
    if name == "output.weight":
        return "Q8_0"
    return COVER_CYCLE[_matrix_order(cfg)[name] % len(COVER_CYCLE)]


def ternary_type(name: str, cfg: Qwen35Config) -> str:
    from tightfit.tools.ternary_preset import ternary_type as t
    return t(name, cfg)


MIXES: dict[str, Callable[[str, Qwen35Config], str]] = {"seedmix": seedmix_type, "cover": cover_type,
                                                        "ternary": ternary_type}


def tensor_types(cfg: Qwen35Config, *, qtype: str | None = None, mix: str | Mapping[str, str] | None = None,
                 default: str = "F32") -> dict[str, str]:
    """GGML type name for every tensor of `cfg` (file order). Vector tensors (norms, ssm_a,
    ssm_dt, conv1d) are always F32: llama.cpp aborts at decode otherwise (traps §8).

    `mix` is a recipe name ("seedmix", "cover") or a dict of exact tensor name or glob-ish regex
    -> type, applied over `qtype` (or `default`)."""
    if qtype is not None and mix is not None and not isinstance(mix, Mapping):
        raise UserError("give either a uniform --qtype or a --mix recipe, not both")
    recipe = None
    if isinstance(mix, str):
        if mix not in MIXES:
            raise UserError(f"unknown mix {mix!r}; choose one of {', '.join(MIXES)}")
        recipe = MIXES[mix]
    base = (qtype or default).upper()
    out: dict[str, str] = {}
    for name in cfg.tensor_shapes(include_mtp=True):
        if cfg.is_vector_tensor(name):
            out[name] = "F32"
            continue
        t = base
        if recipe is not None:
            t = recipe(name, cfg)
        elif isinstance(mix, Mapping):
            for pat, mt in mix.items():
                if pat == name or re.fullmatch(pat, name):
                    t = mt
                    break
        t = t.upper()
        if t not in SUPPORTED_TYPES:
            raise UserError(f"type {t} for {name} is not supported; choose one of {', '.join(SUPPORTED_TYPES)}")
        out[name] = t
    return out


# ---- weight-init rules -------------------------------------------------------------------------
# spec/gguf-synthetic-traps.md §6: std 0.02 everywhere makes a random 8-layer net nearly chaotic;
# embeddings at 0.2 and residual writers at 0.01 keep quantization noise from being amplified.
RESIDUAL_WRITERS = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")


def init_rule(name: str) -> tuple[str, float]:
    """(kind, scale) for a tensor. Kinds: 'normal' (matrix, std), 'norm' (1 + N(0, s), +1 baked
    in as the converter does), 'ssm_a' (-U(1, 16): -exp(A_log) with HF's A ~ U(0,16) init kept
    away from 0), 'dt_bias' (inverse softplus of dt ~ logU(1e-3, 1e-1), HF init), 'conv'
    (U(-s, s), kaiming bound 1/sqrt(K) for K=4)."""
    if name == "token_embd.weight":
        return "normal", 0.2
    if name.endswith("ssm_a"):
        return "ssm_a", 0.0
    if name.endswith("ssm_dt.bias"):
        return "dt_bias", 0.0
    if name.endswith("ssm_conv1d.weight"):
        return "conv", 0.5
    if name.endswith("norm.weight"):
        return "norm", 0.1
    if name.endswith(RESIDUAL_WRITERS):
        return "normal", 0.01
    return "normal", 0.02
