"""Outside oracle: a small random transformers `Qwen3_5ForCausalLM` and its conversion to GGUF
conventions, written from spec/qwen35.md §2.5 (what llama.cpp's converter does), not from
tightfit's reader or forward.

The conversion is the bridge between the two worlds and has to be right for the comparison to
mean anything, so it is kept explicit: names, `1 + w` on zero-centred norms (not on
`linear_attn.norm`), `A_log -> -exp(A_log)`, conv squeeze, and the V-head permutation from HF's
grouped order to GGUF's tiled order on every V-indexed tensor. `grouped_v=True` skips the
permutation: a deliberately wrong conversion for negative controls.
"""
from __future__ import annotations

from typing import Sequence

import torch

from tightfit.model.config import Qwen35Config


def make_hf_model(*, vocab: int = 300, hidden: int = 64, ffn: int = 96, n_layer: int = 4,
                  n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32,
                  rotary_factor: float = 0.25, mrope_section: Sequence[int] = (2, 1, 1),
                  rope_theta: float = 1.0e4, k_heads: int = 2, v_heads: int = 6,
                  ssm_head_dim: int = 16, conv_kernel: int = 4,
                  layer_types: Sequence[str] | None = None, tied: bool = False,
                  eps: float = 1e-6, seed: int = 0, dtype: torch.dtype = torch.float64):
    """A random Qwen3_5ForCausalLM on CPU. Every parameter, norms included, is randomized (HF
    initialises the zero-centred norms to 0, which would hide a missing or doubled +1)."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    if layer_types is None:
        layer_types = ["linear_attention" if (i + 1) % 4 else "full_attention"
                       for i in range(n_layer)]
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=n_head_kv, head_dim=head_dim,
        linear_key_head_dim=ssm_head_dim, linear_value_head_dim=ssm_head_dim,
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
        linear_conv_kernel_dim=conv_kernel, layer_types=list(layer_types),
        rms_norm_eps=eps, tie_word_embeddings=tied, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                         "partial_rotary_factor": rotary_factor,
                         "mrope_section": list(mrope_section), "mrope_interleaved": True})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)

    def rnd(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) * std

    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                prm.copy_(rnd(prm.shape, 1.0))
            elif name.endswith("linear_attn.norm.weight"):
                prm.copy_(1.0 + rnd(prm.shape, 0.2))          # gated norm: plain weight around 1
            elif name.endswith("norm.weight"):
                prm.copy_(rnd(prm.shape, 0.2))                # zero-centred: HF multiplies 1 + w
            elif name.endswith("A_log"):
                prm.copy_(torch.log(torch.rand(prm.shape, generator=g, dtype=torch.float64) * 4
                                    + 0.1).to(dtype))
            elif name.endswith("dt_bias"):
                prm.copy_(rnd(prm.shape, 1.0))
            elif name.endswith("conv1d.weight"):
                prm.copy_(rnd(prm.shape, 0.5))
            elif prm.dim() == 2:
                fan_in = prm.shape[1]
                writer = any(name.endswith(s) for s in ("o_proj.weight", "out_proj.weight",
                                                        "down_proj.weight"))
                prm.copy_(rnd(prm.shape, (0.5 if writer else 1.0) / fan_in ** 0.5))
            else:
                prm.copy_(rnd(prm.shape, 0.5))
    if tied:
        model.tie_weights()
    return model


def v_perm(k_heads: int, v_heads: int) -> torch.Tensor:
    """perm[h] = HF V-head feeding GGUF V-head h. HF groups V heads by K head (index g·r + j),
    GGUF tiles them (index j·Hk + g), spec §2.5 item 5."""
    r = v_heads // k_heads
    return torch.tensor([(h % k_heads) * r + h // k_heads for h in range(v_heads)])


def _permute_heads(t: torch.Tensor, perm: torch.Tensor, head_size: int, dim: int = 0) -> torch.Tensor:
    shape = list(t.shape)
    n = shape[dim] // head_size
    t = t.movedim(dim, 0).reshape(n, head_size, *[s for i, s in enumerate(shape) if i != dim])
    t = t[perm].reshape(n * head_size, *[s for i, s in enumerate(shape) if i != dim])
    return t.movedim(0, dim).contiguous()


def hf_to_gguf(model, grouped_v: bool = False) -> tuple[Qwen35Config, dict[str, torch.Tensor]]:
    """Convert an HF Qwen3_5ForCausalLM to (Qwen35Config, GGUF-named numpy-shaped tensors)."""
    c = model.config
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
    S = c.linear_key_head_dim
    assert c.linear_value_head_dim == S
    key_dim = Hk * S
    perm = torch.arange(Hv) if grouped_v else v_perm(Hk, Hv)
    rp = c.rope_parameters
    n_rot = int(c.head_dim * rp.get("partial_rotary_factor", 1.0))
    sections = list(rp.get("mrope_section", [11, 11, 10]))
    sections = (sections + [0, 0, 0, 0])[:4]
    recurrent = tuple(t == "linear_attention" for t in c.layer_types)
    tied = "lm_head.weight" not in sd or bool(getattr(c, "tie_word_embeddings", False))
    cfg = Qwen35Config(
        n_embd=c.hidden_size, n_ff=c.intermediate_size, n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads, n_head_kv=c.num_key_value_heads, head_dim=c.head_dim,
        n_rot=n_rot, rope_sections=tuple(sections), rope_freq_base=float(rp["rope_theta"]),
        rms_eps=float(c.rms_norm_eps), ssm_conv_kernel=c.linear_conv_kernel_dim, ssm_state=S,
        ssm_k_heads=Hk, ssm_v_heads=Hv, ssm_inner=Hv * S, n_vocab=c.vocab_size,
        n_ctx_train=4096, recurrent_layers=recurrent, tied_output=tied)
    cfg.validate()

    out: dict[str, torch.Tensor] = {"token_embd.weight": sd["model.embed_tokens.weight"],
                                    "output_norm.weight": 1.0 + sd["model.norm.weight"]}
    if not tied:
        out["output.weight"] = sd["lm_head.weight"]
    for il in range(c.num_hidden_layers):
        h, p = f"model.layers.{il}.", f"blk.{il}."
        out[p + "attn_norm.weight"] = 1.0 + sd[h + "input_layernorm.weight"]
        out[p + "post_attention_norm.weight"] = 1.0 + sd[h + "post_attention_layernorm.weight"]
        out[p + "ffn_gate.weight"] = sd[h + "mlp.gate_proj.weight"]
        out[p + "ffn_up.weight"] = sd[h + "mlp.up_proj.weight"]
        out[p + "ffn_down.weight"] = sd[h + "mlp.down_proj.weight"]
        if recurrent[il]:
            la = h + "linear_attn."
            qkv = sd[la + "in_proj_qkv.weight"]
            qkv = torch.cat([qkv[:2 * key_dim], _permute_heads(qkv[2 * key_dim:], perm, S)])
            out[p + "attn_qkv.weight"] = qkv
            out[p + "attn_gate.weight"] = _permute_heads(sd[la + "in_proj_z.weight"], perm, S)
            out[p + "ssm_beta.weight"] = sd[la + "in_proj_b.weight"][perm]
            out[p + "ssm_alpha.weight"] = sd[la + "in_proj_a.weight"][perm]
            conv = sd[la + "conv1d.weight"].squeeze(1)                 # [conv_dim, K]
            conv = torch.cat([conv[:2 * key_dim], _permute_heads(conv[2 * key_dim:], perm, S)])
            out[p + "ssm_conv1d.weight"] = conv
            out[p + "ssm_dt.bias"] = sd[la + "dt_bias"][perm]
            out[p + "ssm_a"] = -torch.exp(sd[la + "A_log"])[perm]
            out[p + "ssm_norm.weight"] = sd[la + "norm.weight"]         # no +1 (gated norm)
            out[p + "ssm_out.weight"] = _permute_heads(sd[la + "out_proj.weight"], perm, S, dim=1)
        else:
            sa = h + "self_attn."
            out[p + "attn_q.weight"] = sd[sa + "q_proj.weight"]
            out[p + "attn_k.weight"] = sd[sa + "k_proj.weight"]
            out[p + "attn_v.weight"] = sd[sa + "v_proj.weight"]
            out[p + "attn_output.weight"] = sd[sa + "o_proj.weight"]
            out[p + "attn_q_norm.weight"] = 1.0 + sd[sa + "q_norm.weight"]
            out[p + "attn_k_norm.weight"] = 1.0 + sd[sa + "k_norm.weight"]
    return cfg, {k: v.contiguous() for k, v in out.items()}


def hf_logits(model, tokens: Sequence[int]) -> torch.Tensor:
    """Logits of every position from one uncached HF forward over the whole sequence."""
    with torch.no_grad():
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        return model(input_ids=ids, use_cache=False).logits[0]
