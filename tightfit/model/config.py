"""Typed configuration of a `qwen35` model (spec/qwen35.md §1–§2).

One dataclass holds the geometry; everything else (state sizes, tensor inventory, which blocks
are recurrent) is derived from it so that the planner, the generator, the reader and the forward
pass can never disagree about a shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Any, Mapping

ARCH = "qwen35"


class ConfigError(ValueError):
    """A model's metadata does not describe a valid qwen35 model."""


@dataclass(frozen=True)
class Qwen35Config:
    n_embd: int                 # E
    n_ff: int
    n_layer: int                # trunk blocks (MTP excluded)
    n_head: int                 # H (full-attention query heads)
    n_head_kv: int              # Hkv
    head_dim: int               # D (key_length == value_length)
    n_rot: int                  # rotated dims per head (first n_rot of D)
    rope_sections: tuple[int, int, int, int]
    rope_freq_base: float
    rms_eps: float
    ssm_conv_kernel: int        # K
    ssm_state: int              # S (head_k_dim == head_v_dim)
    ssm_k_heads: int            # Hk  (ssm.group_count)
    ssm_v_heads: int            # Hv  (ssm.time_step_rank)
    ssm_inner: int              # Hv * S
    n_vocab: int
    n_ctx_train: int = 262144
    nextn_layers: int = 0       # MTP blocks after the trunk
    full_attention_interval: int = 4
    recurrent_layers: tuple[bool, ...] | None = None   # per block_count entry, if stored
    tied_output: bool = False

    # ---- derived geometry -------------------------------------------------------------------
    @property
    def block_count(self) -> int:
        return self.n_layer + self.nextn_layers

    def is_recurrent(self, il: int) -> bool:
        if il >= self.n_layer:
            return False
        if self.recurrent_layers is not None:
            return bool(self.recurrent_layers[il])
        return (il + 1) % self.full_attention_interval != 0

    @property
    def recurrent_ids(self) -> list[int]:
        return [i for i in range(self.n_layer) if self.is_recurrent(i)]

    @property
    def attention_ids(self) -> list[int]:
        return [i for i in range(self.n_layer) if not self.is_recurrent(i)]

    @property
    def key_dim(self) -> int:          # Hk * S
        return self.ssm_k_heads * self.ssm_state

    @property
    def value_dim(self) -> int:        # Hv * S
        return self.ssm_v_heads * self.ssm_state

    @property
    def conv_dim(self) -> int:         # q | k | v channels through the causal conv
        return 2 * self.key_dim + self.value_dim

    @property
    def kv_dim(self) -> int:           # Hkv * D
        return self.n_head_kv * self.head_dim

    # ---- state sizes (elements, per sequence) -----------------------------------------------
    @property
    def conv_state_elems(self) -> int:     # llama.cpp n_embd_r(): (K-1) * conv_dim
        return (self.ssm_conv_kernel - 1) * self.conv_dim

    @property
    def ssm_state_elems(self) -> int:      # llama.cpp n_embd_s(): S * d_inner
        return self.ssm_state * self.ssm_inner

    def recurrent_state_bytes_per_layer(self, dtype_bytes: int = 4) -> int:
        return (self.conv_state_elems + self.ssm_state_elems) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: float = 2) -> int:
        """K and V of every full-attention block, for one token position."""
        return int(2 * self.kv_dim * len(self.attention_ids) * dtype_bytes)

    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ConfigError(what)
        for name in ("n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "head_dim", "ssm_state",
                     "ssm_k_heads", "ssm_v_heads", "ssm_conv_kernel", "n_vocab"):
            need(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        need(self.n_head % self.n_head_kv == 0,
             f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        need(self.ssm_v_heads % self.ssm_k_heads == 0,
             f"ssm.time_step_rank {self.ssm_v_heads} is not a multiple of ssm.group_count {self.ssm_k_heads}")
        need(self.ssm_inner == self.ssm_v_heads * self.ssm_state,
             f"ssm.inner_size {self.ssm_inner} != time_step_rank*state_size "
             f"{self.ssm_v_heads * self.ssm_state}")
        need(0 < self.n_rot <= self.head_dim and self.n_rot % 2 == 0,
             f"rope.dimension_count {self.n_rot} must be even and in (0, {self.head_dim}]")
        need(len(self.rope_sections) == 4, "rope.dimension_sections must have exactly 4 entries")
        need(self.ssm_conv_kernel >= 2, "ssm.conv_kernel must be >= 2")
        need(self.full_attention_interval >= 1, "full_attention_interval must be >= 1")
        need(self.n_layer <= 4096, f"block_count {self.block_count} is implausibly large")
        if self.recurrent_layers is not None:
            need(len(self.recurrent_layers) == self.block_count,
                 f"attention.recurrent_layers has {len(self.recurrent_layers)} entries, "
                 f"expected block_count={self.block_count}")

    # ---- tensor inventory -------------------------------------------------------------------
    def tensor_shapes(self, include_mtp: bool = True) -> dict[str, tuple[int, ...]]:
        """Expected GGUF `ne` shape (ne0 first) of every tensor of the model, in file order."""
        E, V = self.n_embd, self.n_vocab
        out: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, V)}
        blocks = range(self.block_count if include_mtp else self.n_layer)
        for il in blocks:
            out.update(self.block_tensor_shapes(il))
        out["output_norm.weight"] = (E,)
        if not self.tied_output:
            out["output.weight"] = (E, V)
        return out

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        E, p = self.n_embd, f"blk.{il}."
        s: dict[str, tuple[int, ...]] = {p + "attn_norm.weight": (E,)}
        if self.is_recurrent(il):
            s[p + "attn_qkv.weight"] = (E, self.conv_dim)
            s[p + "attn_gate.weight"] = (E, self.value_dim)
            s[p + "ssm_beta.weight"] = (E, self.ssm_v_heads)
            s[p + "ssm_alpha.weight"] = (E, self.ssm_v_heads)
            s[p + "ssm_conv1d.weight"] = (self.ssm_conv_kernel, self.conv_dim)
            s[p + "ssm_dt.bias"] = (self.ssm_v_heads,)
            s[p + "ssm_a"] = (self.ssm_v_heads,)
            s[p + "ssm_norm.weight"] = (self.ssm_state,)
            s[p + "ssm_out.weight"] = (self.value_dim, E)
        else:
            H, D = self.n_head, self.head_dim
            s[p + "attn_q.weight"] = (E, 2 * H * D)
            s[p + "attn_k.weight"] = (E, self.kv_dim)
            s[p + "attn_v.weight"] = (E, self.kv_dim)
            s[p + "attn_output.weight"] = (H * D, E)
            s[p + "attn_q_norm.weight"] = (D,)
            s[p + "attn_k_norm.weight"] = (D,)
        s[p + "post_attention_norm.weight"] = (E,)
        s[p + "ffn_gate.weight"] = (E, self.n_ff)
        s[p + "ffn_up.weight"] = (E, self.n_ff)
        s[p + "ffn_down.weight"] = (self.n_ff, E)
        if il >= self.n_layer:  # MTP (nextn) block: a full-attention block plus its own inputs
            s[p + "nextn.eh_proj.weight"] = (2 * E, E)
            s[p + "nextn.enorm.weight"] = (E,)
            s[p + "nextn.hnorm.weight"] = (E,)
            s[p + "nextn.shared_head_norm.weight"] = (E,)
        return s

    def is_mtp_tensor(self, name: str) -> bool:
        """A tensor of an MTP (nextn) block blk.<n_layer>+ (the trunk's steps never read it)."""
        parts = name.split(".")
        return len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() and \
            int(parts[1]) >= self.n_layer

    @staticmethod
    def is_vector_tensor(name: str) -> bool:
        """Tensors that must stay F32 in a qwen35 GGUF (norms, conv kernel, ssm scalars)."""
        return (name.endswith("norm.weight") or name.endswith("ssm_a") or name.endswith("ssm_dt.bias")
                or name.endswith("ssm_conv1d.weight"))

    def n_params(self, include_mtp: bool = False) -> int:
        total = 0
        for shape in self.tensor_shapes(include_mtp=include_mtp).values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    # ---- metadata (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rope_sections"] = list(self.rope_sections)
        if self.recurrent_layers is not None:
            d["recurrent_layers"] = list(self.recurrent_layers)
        return d

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], n_vocab: int | None = None,
                      has_output: bool = True) -> "Qwen35Config":
        """Build from a dict of GGUF key -> python value (see tightfit.gguf.reader.metadata)."""
        arch = md.get("general.architecture")
        if arch != ARCH:
            raise ConfigError(f"general.architecture is {arch!r}, tightfit runs only {ARCH!r}")

        def key(name: str, default: Any = ..., kind: type | None = None) -> Any:
            full = f"{ARCH}.{name}"
            if full not in md:
                if default is ...:
                    raise ConfigError(f"missing required metadata key {full}")
                return default
            return md[full]

        def scalar(name: str, default: Any = ...) -> int:
            v = key(name, default)
            if isinstance(v, (list, tuple)):
                vals = set(int(x) for x in v[: n_layer_all_hint()])
                if len(vals) != 1:
                    raise ConfigError(f"{ARCH}.{name}: per-layer values {sorted(vals)} are not supported")
                v = vals.pop()
            return int(v)

        def n_layer_all_hint() -> int:
            return int(md.get(f"{ARCH}.block_count", 0)) - int(md.get(f"{ARCH}.nextn_predict_layers", 0))

        block_count = int(key("block_count"))
        nextn = int(key("nextn_predict_layers", 0))
        if nextn < 0 or nextn >= block_count:
            raise ConfigError(f"nextn_predict_layers {nextn} inconsistent with block_count {block_count}")
        n_head = scalar("attention.head_count")
        key_len = int(key("attention.key_length", 0)) or None
        val_len = int(key("attention.value_length", 0)) or None
        E = int(key("embedding_length"))
        D = key_len or (E // n_head)
        if val_len is not None and val_len != D:
            raise ConfigError(f"attention.value_length {val_len} != key_length {D}")
        sections = key("rope.dimension_sections")
        sections = tuple(int(x) for x in sections) if isinstance(sections, (list, tuple)) else (int(sections),)
        if len(sections) != 4:
            raise ConfigError(f"{ARCH}.rope.dimension_sections must have exactly 4 entries, got {len(sections)}")
        recurrent = key("attention.recurrent_layers", None)
        if recurrent is not None:
            recurrent = tuple(bool(x) for x in recurrent)
        if n_vocab is None:
            toks = md.get("tokenizer.ggml.tokens")
            n_vocab = len(toks) if toks is not None else 0
        cfg = cls(
            n_embd=E,
            n_ff=scalar("feed_forward_length"),
            n_layer=block_count - nextn,
            n_head=n_head,
            n_head_kv=scalar("attention.head_count_kv", n_head),
            head_dim=D,
            n_rot=int(key("rope.dimension_count", D)),
            rope_sections=sections,  # type: ignore[arg-type]
            rope_freq_base=float(key("rope.freq_base", 10000.0)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            ssm_conv_kernel=int(key("ssm.conv_kernel")),
            ssm_state=int(key("ssm.state_size")),
            ssm_k_heads=int(key("ssm.group_count")),
            ssm_v_heads=int(key("ssm.time_step_rank")),
            ssm_inner=int(key("ssm.inner_size")),
            n_vocab=int(n_vocab),
            n_ctx_train=int(key("context_length")),
            nextn_layers=nextn,
            full_attention_interval=int(key("full_attention_interval", 4)),
            recurrent_layers=recurrent,
            tied_output=not has_output,
        )
        cfg.validate()
        return cfg

    def to_metadata(self) -> dict[str, tuple[Any, str]]:
        """GGUF key -> (value, gguf value type name) exactly as llama.cpp expects them
        (spec/gguf-synthetic-traps.md: scalar types are checked exactly)."""
        a = ARCH + "."
        md: dict[str, tuple[Any, str]] = {
            "general.architecture": (ARCH, "STRING"),
            a + "context_length": (self.n_ctx_train, "UINT32"),
            a + "embedding_length": (self.n_embd, "UINT32"),
            a + "block_count": (self.block_count, "UINT32"),
            a + "feed_forward_length": (self.n_ff, "UINT32"),
            a + "attention.head_count": (self.n_head, "UINT32"),
            a + "attention.head_count_kv": (self.n_head_kv, "UINT32"),
            a + "attention.key_length": (self.head_dim, "UINT32"),
            a + "attention.value_length": (self.head_dim, "UINT32"),
            a + "attention.layer_norm_rms_epsilon": (self.rms_eps, "FLOAT32"),
            a + "rope.dimension_count": (self.n_rot, "UINT32"),
            a + "rope.freq_base": (self.rope_freq_base, "FLOAT32"),
            a + "rope.dimension_sections": (list(self.rope_sections), "ARRAY_INT32"),
            a + "ssm.conv_kernel": (self.ssm_conv_kernel, "UINT32"),
            a + "ssm.state_size": (self.ssm_state, "UINT32"),
            a + "ssm.group_count": (self.ssm_k_heads, "UINT32"),
            a + "ssm.time_step_rank": (self.ssm_v_heads, "UINT32"),
            a + "ssm.inner_size": (self.ssm_inner, "UINT32"),
            a + "full_attention_interval": (self.full_attention_interval, "UINT32"),
        }
        if self.nextn_layers:
            md[a + "nextn_predict_layers"] = (self.nextn_layers, "UINT32")
        return md


# ---- named geometries -----------------------------------------------------------------------
def _geom(**kw: Any) -> Qwen35Config:
    base = dict(rms_eps=1e-6, rope_freq_base=1.0e7, ssm_conv_kernel=4, full_attention_interval=4)
    base.update(kw)
    cfg = Qwen35Config(**base)
    cfg.validate()
    return cfg


#: The real 27B geometry (spec/qwen35.md §0, shared/bench/seed-mix.md).
QWEN35_27B = _geom(n_embd=5120, n_ff=17408, n_layer=64, n_head=24, n_head_kv=4, head_dim=256,
                   n_rot=64, rope_sections=(11, 11, 10, 0), ssm_state=128, ssm_k_heads=16,
                   ssm_v_heads=48, ssm_inner=6144, n_vocab=248320, n_ctx_train=262144)

#: Tiny geometry in the 27B's ratios (3 V heads per K head, rope on 1/4 of D, attention every 4th).
TINY = _geom(n_embd=64, n_ff=96, n_layer=8, n_head=4, n_head_kv=2, head_dim=32, n_rot=8,
             rope_sections=(2, 1, 1, 0), ssm_state=16, ssm_k_heads=2, ssm_v_heads=6, ssm_inner=96,
             n_vocab=1000, n_ctx_train=4096)
