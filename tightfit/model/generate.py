"""Synthetic qwen35 GGUF generator (`tightfit make-model`).

Writes a valid `qwen35` file with random but sane weights, tensor by tensor, never holding the
whole file in memory. Same arguments -> same bytes: every (tensor, chunk) draws from its own
NumPy PCG64 stream seeded by (seed, sha256(tensor name), chunk index), so chunks can be produced
in any order by a process pool and written in place with pwrite.

How values are made (see presets.init_rule for the scales):
* F32/F16/BF16 tensors are Gaussian floats (cast with numpy / gguf-py for BF16).
* Quantized matrices are drawn directly in the block domain: random bytes for every code, sign
  and sub-scale field, then sane fp16 super-scales written over the scale fields (`_FIELDS`).
  Every byte pattern of these fields is a valid block (grids are fully indexed by their codes),
  so the blocks are valid by construction; the fp16 scale is calibrated per type so the
  dequantized matrix has the requested std (and zero mean: scale-only types get a random sign
  per block, types with mins get min = scale * mean code). This is fast enough for the 16 GB
  benchmark file and does not depend on any quantizer, so the golden files' bytes cannot move
  when tightfit.quant's quantizer changes. TQ1_0/TQ2_0/MXFP4 go through gguf-py's quantizer.
* The optional F32 twin holds gguf-py's dequantization of exactly the bytes written.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from tightfit.errors import UserError
from tightfit.model import presets
from tightfit.model.config import ARCH, Qwen35Config

ALIGNMENT = 32                  # GGUF default (general.alignment not written)
CHUNK_BYTES = 32 << 20          # rows per RNG stream; fixed so output never depends on workers
REPO_ROOT = Path(__file__).resolve().parents[2]
_VT = GGUFValueType

# ---- vocabulary ------------------------------------------------------------------------------
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5


def shared_file(rel: str, env: str | None = None) -> Path | None:
    """A file from the project's shared folder (or an override env var); None if absent."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    for p in (REPO_ROOT / "tightfit" / "data" / Path(rel).name, REPO_ROOT.parent / "shared" / rel):
        if p.exists():
            return p
    return None


def _read_gguf_string_arrays(path: Path, keys: set[str]) -> dict[str, Any]:
    """Minimal KV-section parser for the vocab fixture. gguf-py's GGUFReader builds a numpy view
    per string and needs ~10 s for this 300k-string file; this loop needs a fraction of that.
    (tests/test_generate.py checks it against GGUFReader.)"""
    buf = path.read_bytes()
    if buf[:4] != b"GGUF":
        raise UserError(f"{path}: not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    out: dict[str, Any] = {}

    def read_str(p: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, p)
        return buf[p + 8:p + 8 + n].decode("utf-8"), p + 8 + n

    def read_val(t: int, p: int, keep: bool) -> tuple[Any, int]:
        if t == 8:
            return read_str(p)
        if t == 9:
            st, n = struct.unpack_from("<IQ", buf, p)
            p += 12
            if st == 8:
                items = []
                for _ in range(n):
                    (ln,) = struct.unpack_from("<Q", buf, p)
                    if keep:
                        items.append(buf[p + 8:p + 8 + ln].decode("utf-8"))
                    p += 8 + ln
                return items, p
            sz = struct.calcsize(scalar[st])
            vals = list(struct.unpack_from(f"<{n}{scalar[st]}", buf, p)) if keep else None
            return vals, p + n * sz
        (v,) = struct.unpack_from("<" + scalar[t], buf, p)
        return v, p + struct.calcsize(scalar[t])

    for _ in range(n_kv):
        key, pos = read_str(pos)
        (t,) = struct.unpack_from("<I", buf, pos)
        val, pos = read_val(t, pos + 4, key in keys)
        if key in keys:
            out[key] = val
    return out


@lru_cache(maxsize=2)
def _fixture_vocab(path: str) -> tuple[list[str], list[int], list[str]]:
    kv = _read_gguf_string_arrays(Path(path), {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                               "tokenizer.ggml.merges"})
    return kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv["tokenizer.ggml.merges"]


def _vocab_fixture_path() -> Path:
    p = shared_file("fixtures/ggml-vocab-qwen35.gguf", env="TIGHTFIT_VOCAB_FIXTURE")
    if p is None or not p.exists():
        raise UserError("the Qwen vocabulary fixture ggml-vocab-qwen35.gguf was not found "
                        "(set TIGHTFIT_VOCAB_FIXTURE to its path)")
    return p


def parse_vocab(spec: str) -> tuple[str, int | None]:
    if spec == "real":
        return "real", None
    if spec.startswith("small:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = -1
        if n < 259 + 3:
            raise UserError(f"vocab {spec!r}: small:N needs N >= 262 (256 byte tokens + 3 controls + 3)")
        return "small", n
    raise UserError(f"vocab {spec!r}: expected 'small:N' or 'real'")


def vocab_size(spec: str, real_size: int = 248320) -> int:
    kind, n = parse_vocab(spec)
    return n if kind == "small" else real_size


def tokenizer_metadata(spec: str, real_size: int = 248320) -> list[tuple[str, Any, _VT, _VT | None]]:
    """tokenizer.* keys for a `small:N` or `real` vocabulary (list of key, value, type, subtype)."""
    kind, n = parse_vocab(spec)
    if kind == "real":
        try:  # the tokenizer engineer's converter of the true Qwen3.5 vocabulary, when present
            from tightfit.tokenizer.vocab import qwen35_tokenizer_metadata  # type: ignore
        except ImportError:
            qwen35_tokenizer_metadata = None
        if qwen35_tokenizer_metadata is not None:
            out = []
            for k, (v, t) in qwen35_tokenizer_metadata(real_size).items():
                sub = (_VT.STRING if isinstance(v[0], str) else _VT.INT32) if t == _VT.ARRAY else None
                out.append((k, v, t, sub))
            return out + _template_md()
    if kind == "small" and n <= DEMO_VOCAB_MAX and shared_file("fixtures/ggml-vocab-qwen35.gguf",
                                                               env="TIGHTFIT_VOCAB_FIXTURE") is None:
        tokens, types, merges = _packaged_demo_vocab()   # installed copy without the shared folder
    else:
        tokens, types, merges = _fixture_vocab(str(_vocab_fixture_path()))
    if kind == "small":
        keep = list(tokens[: n - 3])
        kinds = [TOKEN_NORMAL] * len(keep)
        keep_set = set(keep)
        # a merge survives only if both parts and the merged token are still in the vocabulary
        mer = [m for m in merges if (lambda a, b: a in keep_set and b in keep_set and a + b in keep_set)(*m.split(" ", 1))]
        keep += list(CONTROL_TOKENS)
        kinds += [TOKEN_CONTROL] * 3
        eot, eos = n - 3, n - 1
    else:
        keep, kinds, mer = list(tokens), list(types), list(merges)
        keep += [f"[PAD{i}]" for i in range(len(keep), real_size)]   # as convert_hf_to_gguf pads
        kinds += [TOKEN_UNUSED] * (len(keep) - len(kinds))
        eot, eos = keep.index("<|endoftext|>"), keep.index("<|im_end|>")
    md: list[tuple[str, Any, _VT, _VT | None]] = [
        ("tokenizer.ggml.model", "gpt2", _VT.STRING, None),
        ("tokenizer.ggml.pre", "qwen35", _VT.STRING, None),
        ("tokenizer.ggml.tokens", keep, _VT.ARRAY, _VT.STRING),
        ("tokenizer.ggml.token_type", kinds, _VT.ARRAY, _VT.INT32),
        ("tokenizer.ggml.merges", mer, _VT.ARRAY, _VT.STRING),
        ("tokenizer.ggml.eos_token_id", eos, _VT.UINT32, None),        # <|im_end|>, as Qwen3.5
        ("tokenizer.ggml.padding_token_id", eot, _VT.UINT32, None),    # <|endoftext|>
        ("tokenizer.ggml.add_bos_token", False, _VT.BOOL, None),       # Qwen3.5 has no BOS
    ]
    return md + _template_md()


DEMO_VOCAB_MAX = 2048  # tightfit/data/demo-vocab.json.gz holds small:2048 (scripts/make_demo_vocab.py)


@lru_cache(maxsize=1)
def _packaged_demo_vocab() -> tuple[list[str], list[int], list[str]]:
    import gzip
    import json
    with gzip.open(REPO_ROOT / "tightfit" / "data" / "demo-vocab.json.gz", "rt", encoding="utf-8") as f:
        d = json.load(f)
    return d["tokens"], d["types"], d["merges"]


def _template_md() -> list[tuple[str, Any, _VT, _VT | None]]:
    tpl = shared_file("fixtures/Qwen3.5-4B.jinja", env="TIGHTFIT_CHAT_TEMPLATE")
    if tpl is None:  # installed copy without the shared folder: tightfit's own ChatML template
        tpl = REPO_ROOT / "tightfit" / "data" / "chatml-demo.jinja"
    return [("tokenizer.chat_template", tpl.read_text(encoding="utf-8"), _VT.STRING, None)]


# ---- block-domain sampler ----------------------------------------------------------------------
# type -> ([(byte offset of an fp16 scale field, factor relative to d)], random sign per block?)
# Offsets from spec/quant-formats.md §2.3/§2.4. Factor for a min field = mean of the codes, so that
# d*sc*q - dmin*m is centred (with m == sc, see _fixup).
_FIELDS: dict[str, tuple[list[tuple[int, float]], bool]] = {
    "Q4_0": ([(0, 1.0)], True), "Q5_0": ([(0, 1.0)], True), "Q8_0": ([(0, 1.0)], True),
    "Q4_1": ([(0, 1.0), (2, -7.5)], False), "Q5_1": ([(0, 1.0), (2, -15.5)], False),
    "Q2_K": ([(80, 1.0), (82, 1.5)], False), "Q3_K": ([(108, 1.0)], True),
    "Q4_K": ([(0, 1.0), (2, 7.5)], False), "Q5_K": ([(0, 1.0), (2, 15.5)], False),
    "Q6_K": ([(208, 1.0)], True),
    "IQ2_XXS": ([(0, 1.0)], True), "IQ2_XS": ([(0, 1.0)], True), "IQ2_S": ([(0, 1.0)], True),
    "IQ3_XXS": ([(0, 1.0)], True), "IQ3_S": ([(0, 1.0)], True), "IQ1_S": ([(0, 1.0)], True),
    "IQ4_NL": ([(0, 1.0)], True), "IQ4_XS": ([(0, 1.0)], True),
}
_FLOAT_QUANTIZED = ("TQ1_0", "TQ2_0", "MXFP4")   # made as floats, packed by gguf-py's quantizer


def _fixup(qtype: str, blocks: np.ndarray, rng: np.random.Generator) -> None:
    """Make sub-scale bytes of min-carrying K types consistent (min == scale) so blocks centre."""
    n = blocks.shape[0]
    if qtype == "Q2_K":
        sc = rng.integers(1, 16, size=(n, 16), dtype=np.uint8)
        blocks[:, 0:16] = sc * 17                      # low nibble scale, high nibble min
    elif qtype in ("Q4_K", "Q5_K"):
        sc = rng.integers(1, 64, size=(n, 8), dtype=np.uint8)
        s = np.zeros((n, 12), dtype=np.uint8)
        lo, hi = sc[:, :4], sc[:, 4:]
        s[:, 0:4] = lo | ((hi >> 4) << 6)              # sc0..3, top bits of sc4..7
        s[:, 4:8] = lo | ((hi >> 4) << 6)              # m0..3 (= sc), top bits of m4..7
        s[:, 8:12] = (hi & 15) | ((hi & 15) << 4)      # low nibbles of sc4..7 and m4..7
        blocks[:, 4:16] = s


def sample_blocks(rng: np.random.Generator, qtype: str, n_blocks: int, base: float) -> np.ndarray:
    """n_blocks random valid blocks of `qtype`; `base` is the typical fp16 scale d."""
    bsz = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1]
    blocks = np.frombuffer(rng.bytes(n_blocks * bsz), dtype=np.uint8).reshape(n_blocks, bsz).copy()
    _fixup(qtype, blocks, rng)
    fields, signed = _FIELDS[qtype]
    # per-block jitter of the scale (real blocks differ), and a random sign where it is free
    d = base * np.exp(0.25 * rng.standard_normal(n_blocks, dtype=np.float32))
    if signed:
        d = np.where(rng.integers(0, 2, n_blocks, dtype=np.uint8) == 1, -d, d)
    for off, factor in fields:
        blocks[:, off:off + 2] = (d * factor).astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return blocks


@lru_cache(maxsize=None)
def _unit_std(qtype: str) -> float:
    """Std of the dequantized values of blocks made with base 1, measured once per type with
    gguf-py's dequantizer on a fixed sample; scales are then chosen as std_target / this."""
    rng = np.random.Generator(np.random.PCG64(20260101))
    blocks = sample_blocks(rng, qtype, 512, 1.0)
    return float(gguf_dequantize(blocks, GGMLQuantizationType[qtype]).std())


# ---- tensor values ---------------------------------------------------------------------------
def _rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    words = np.frombuffer(hashlib.sha256(name.encode()).digest(), dtype="<u4").tolist()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), *words, chunk])))


def _float_values(rng: np.random.Generator, name: str, shape: tuple[int, int]) -> np.ndarray:
    kind, s = presets.init_rule(name)
    if kind == "normal":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(s)
    if kind == "norm":
        return 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(s)
    if kind == "ssm_a":
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if kind == "dt_bias":
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)    # inverse softplus
    if kind == "conv":
        return rng.uniform(-s, s, shape).astype(np.float32)
    raise AssertionError(kind)


#: chunks of at least this many weights of a TQ2_0 tensor are packed directly (random 2-bit codes)
#: instead of going through gguf-py's float quantizer: the 27B ternary model took ~85 s on the
#: device that way. Smaller chunks (every test model) keep the quantizer path and its bytes.
FAST_TERNARY_MIN = 1 << 24

# byte -> byte with every 2-bit field equal to 3 (no TQ2_0 code) replaced by 1 (the zero trit):
# codes 0, 1, 2 = -1, 0, +1 with probabilities 1/4, 1/2, 1/4
_TQ2_FIX = np.array([sum((1 if ((b >> s) & 3) == 3 else ((b >> s) & 3)) << s for s in (0, 2, 4, 6))
                     for b in range(256)], dtype=np.uint8)


def _tq2_blocks_fast(rng: np.random.Generator, name: str, rows: int, ne0: int) -> np.ndarray:
    """rows x row_bytes of valid TQ2_0 blocks (64 bytes of 2-bit codes + fp16 scale per 256
    weights), scales drawn as the quantizer path draws them; exact blocks, no float detour."""
    nb = rows * (ne0 // 256)
    qs = _TQ2_FIX[np.frombuffer(rng.bytes(nb * 64), dtype=np.uint8)].reshape(nb, 64)
    sc = presets.init_rule(name)[1] * np.sqrt(1.5) * np.exp(
        0.25 * rng.standard_normal(nb, dtype=np.float32))
    out = np.empty((nb, 66), dtype=np.uint8)
    out[:, :64] = qs
    out[:, 64:] = sc.astype("<f2").reshape(nb, 1).view(np.uint8)
    return out.reshape(rows, -1)


def tensor_chunk(seed: int, name: str, qtype: str, ne0: int, rows: int, chunk: int,
                 want_twin: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Bytes (uint8, rows x row_bytes) of one chunk of a tensor, and its F32 dequantization."""
    rng = _rng(seed, name, chunk)
    gt = GGMLQuantizationType[qtype]
    if qtype == "TQ2_0" and rows * ne0 >= FAST_TERNARY_MIN:
        data = _tq2_blocks_fast(rng, name, rows, ne0)
        twin = gguf_dequantize(data, gt).reshape(rows, ne0).astype(np.float32) \
            if want_twin else None
        return data, twin
    if qtype in ("F32", "F16", "BF16") or qtype in _FLOAT_QUANTIZED:
        x = _float_values(rng, name, (rows, ne0))
        if qtype in ("TQ1_0", "TQ2_0"):
            # ternary values with one scale per 256-block, so gguf-py's amax quantizer is exact
            t = rng.integers(-1, 2, size=(rows, ne0)).astype(np.float32)
            sc = presets.init_rule(name)[1] * np.sqrt(1.5) * np.exp(
                0.25 * rng.standard_normal((rows, ne0 // 256, 1), dtype=np.float32))
            x = (t.reshape(rows, -1, 256) * sc).reshape(rows, ne0).astype(np.float32)
        if qtype == "F32":
            data = x.view(np.uint8)
            return data, (x if want_twin else None)
        if qtype == "F16":
            h = x.astype("<f2")
            return h.view(np.uint8), (h.astype(np.float32) if want_twin else None)
        data = gguf_quantize(x, gt)
    else:
        kind, std = presets.init_rule(name)
        if kind != "normal":
            raise UserError(f"{name} must be F32, not {qtype}")
        bs = GGML_QUANT_SIZES[gt][0]
        data = sample_blocks(rng, qtype, rows * (ne0 // bs), std / _unit_std(qtype)).reshape(rows, -1)
    twin = gguf_dequantize(data, gt).reshape(rows, ne0).astype(np.float32) if want_twin else None
    return data, twin


# ---- the plan: every tensor's type, size and offset ------------------------------------------
@dataclass
class TensorPlan:
    name: str
    ne: tuple[int, ...]          # ggml order (ne0 first)
    qtype: str
    nbytes: int
    offset: int = 0              # relative to the data section

    @property
    def rows(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[self.qtype]]
        return self.ne[0] // bs * ts


@dataclass
class ModelPlan:
    cfg: Qwen35Config
    tensors: list[TensorPlan]
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return sum(_pad(t.nbytes) for t in self.tensors)

    def by_name(self) -> dict[str, TensorPlan]:
        return {t.name: t for t in self.tensors}

    def type_bytes(self, names: Callable[[str], bool] = lambda n: True) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            if names(t.name):
                out[t.qtype] = out.get(t.qtype, 0) + t.nbytes
        return out


def _pad(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def resolve_args(preset: str = "tiny", *, seed: int = 0, qtype: str | None = None,
                 mix: str | Mapping[str, str] | None = None, vocab: str | None = None,
                 mtp: bool = False, tied: bool = False, layers: int | None = None) -> dict[str, Any]:
    """Fill preset defaults; the result is the canonical argument set (stored in manifests)."""
    seedmix = preset in presets.PRESET_MIX
    if mix is None and qtype is None and seedmix:
        mix = presets.PRESET_MIX[preset]
    if vocab is None:
        vocab = "real" if seedmix or preset == "27b" else "small:1000"
    return dict(preset=preset, seed=int(seed), qtype=qtype.upper() if qtype else None,
                mix=dict(mix) if isinstance(mix, Mapping) else mix, vocab=vocab, mtp=bool(mtp),
                tied=bool(tied), layers=layers)


def plan_model(preset: str = "tiny", **kw: Any) -> ModelPlan:
    """Types, sizes and data offsets of every tensor, without generating anything."""
    args = resolve_args(preset, **kw)
    cfg = presets.geometry(preset, layers=args["layers"], n_vocab=vocab_size(args["vocab"]),
                           mtp=args["mtp"], tied=args["tied"])
    types = presets.tensor_types(cfg, qtype=args["qtype"], mix=args["mix"])
    tensors, off = [], 0
    for name, ne in cfg.tensor_shapes(include_mtp=True).items():
        qt = types[name]
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[qt]]
        if ne[0] % bs:
            raise UserError(f"{qt} needs rows that are a multiple of {bs}, but {name} has rows of "
                            f"{ne[0]} in preset {preset!r}; pick a type with 32-element blocks or a "
                            "'small*' preset")
        t = TensorPlan(name, tuple(ne), qt, ne[0] // bs * ts * (int(np.prod(ne[1:])) if len(ne) > 1 else 1))
        t.offset = off
        off += _pad(t.nbytes)
        tensors.append(t)
    return ModelPlan(cfg, tensors, args)


def plan_model_bytes(preset: str = "qwen3.8-27b-seedmix", **kw: Any) -> ModelPlan:
    """Alias kept for the planner: same as plan_model (bytes are in .tensors[i].nbytes)."""
    return plan_model(preset, **kw)


def twin_plan(plan: ModelPlan) -> ModelPlan:
    """The exact-F32 twin: same tensors, every one stored as F32."""
    tensors, off = [], 0
    for t in plan.tensors:
        tt = TensorPlan(t.name, t.ne, "F32", 4 * int(np.prod(t.ne)), off)
        off += _pad(tt.nbytes)
        tensors.append(tt)
    return ModelPlan(plan.cfg, tensors, dict(plan.args, twin=True))


# ---- header --------------------------------------------------------------------------------------
_TYPE_NAMES = {"STRING": (_VT.STRING, None), "UINT32": (_VT.UINT32, None), "FLOAT32": (_VT.FLOAT32, None),
               "BOOL": (_VT.BOOL, None), "ARRAY_INT32": (_VT.ARRAY, _VT.INT32),
               "ARRAY_UINT32": (_VT.ARRAY, _VT.UINT32), "ARRAY_BOOL": (_VT.ARRAY, _VT.BOOL)}


def model_metadata(plan: ModelPlan) -> list[tuple[str, Any, _VT, _VT | None]]:
    cfg, a = plan.cfg, plan.args
    what = a["mix"] if a["mix"] else (a["qtype"] or "F32")
    kind = ("SYNTHETIC COPYING MODEL - a hand-built induction circuit, every other weight zero "
            "(tightfit make-model --copycat)" if a.get("copycat") else
            "RANDOM WEIGHTS - synthetic test model written by tightfit make-model")
    desc = (f"{kind} (preset {a['preset']}, {json.dumps(what) if isinstance(what, dict) else what}, "
            f"seed {a['seed']})" + ("; exact F32 dequantization twin" if a.get("twin") else ""))
    md: list[tuple[str, Any, _VT, _VT | None]] = [
        ("general.type", "model", _VT.STRING, None),
        ("general.name", f"tightfit-synthetic-{a['preset']}", _VT.STRING, None),
        ("general.description", desc, _VT.STRING, None),
        ("general.quantization_version", 2, _VT.UINT32, None),
    ]
    for k, (v, tname) in cfg.to_metadata().items():
        if k == "general.architecture":
            continue   # GGUFWriter writes it first
        vt, sub = _TYPE_NAMES[tname]
        md.append((k, v, vt, sub))
    # converters write the per-block layer types (MTP entry false); llama.cpp prefers it
    md.append((f"{ARCH}.attention.recurrent_layers", [cfg.is_recurrent(i) for i in range(cfg.block_count)],
               _VT.ARRAY, _VT.BOOL))
    md += tokenizer_metadata(a["vocab"])
    n_tok = next(len(v) for k, v, *_ in md if k == "tokenizer.ggml.tokens")
    if n_tok != cfg.n_vocab:
        raise UserError(f"vocabulary has {n_tok} tokens but the model has n_vocab {cfg.n_vocab}")
    return md


def write_header(path: str | os.PathLike, plan: ModelPlan, *, sparse_size: bool = True) -> int:
    """Write metadata and tensor infos; returns the absolute offset of the data section. With
    `sparse_size` the file is extended (sparse) to its final size, ready for pwrite."""
    w = GGUFWriter(str(path), ARCH)
    for k, v, vt, sub in model_metadata(plan):
        w.add_key_value(k, v, vt, sub)
    for t in plan.tensors:
        # gguf-py takes the numpy-order shape and writes it reversed (ggml order)
        w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.nbytes,
                          raw_dtype=GGMLQuantizationType[t.qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    end = w.fout[0].tell()
    w.close()
    start = _pad(end)
    if sparse_size:
        with open(path, "r+b") as f:
            f.truncate(start + plan.data_bytes)
    return start


# ---- writing ---------------------------------------------------------------------------------------
def _chunks(plan: ModelPlan) -> list[tuple[int, int, int, int]]:
    """(tensor index, chunk index, first row, n rows), largest first for load balance."""
    out = []
    for i, t in enumerate(plan.tensors):
        per = max(1, CHUNK_BYTES // max(1, t.row_bytes))
        for c, r0 in enumerate(range(0, t.rows, per)):
            out.append((i, c, r0, min(per, t.rows - r0)))
    out.sort(key=lambda x: -x[3] * plan.tensors[x[0]].row_bytes)
    return out


_CTX: dict[str, Any] = {}


def _init_worker(ctx: dict[str, Any]) -> None:
    _CTX.clear()
    _CTX.update(ctx)


def _do_chunk(job: tuple[int, int, int, int]) -> int:
    i, c, r0, n = job
    plan, seed = _CTX["plan"], _CTX["seed"]
    t = plan.tensors[i]
    data, twin = tensor_chunk(seed, t.name, t.qtype, t.ne[0], n, c, want_twin=_CTX["twin_path"] is not None)
    fd = os.open(_CTX["path"], os.O_WRONLY)
    try:
        os.pwrite(fd, np.ascontiguousarray(data).tobytes(), _CTX["start"] + t.offset + r0 * t.row_bytes)
    finally:
        os.close(fd)
    if twin is not None:
        tt = _CTX["twin_plan"].tensors[i]
        fd = os.open(_CTX["twin_path"], os.O_WRONLY)
        try:
            os.pwrite(fd, np.ascontiguousarray(twin, dtype="<f4").tobytes(),
                      _CTX["twin_start"] + tt.offset + r0 * t.ne[0] * 4)
        finally:
            os.close(fd)
    return n * t.row_bytes


def make_model(path: str | os.PathLike, preset: str = "tiny", *, seed: int = 0, qtype: str | None = None,
               mix: str | Mapping[str, str] | None = None, vocab: str | None = None, mtp: bool = False,
               tied: bool = False, layers: int | None = None, f32_twin_path: str | os.PathLike | None = None,
               processes: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> ModelPlan:
    """Write a synthetic qwen35 GGUF to `path` (and optionally its exact F32 twin); returns the plan.
    `processes` None = one per CPU for big files, in-process for small ones."""
    plan = plan_model(preset, seed=seed, qtype=qtype, mix=mix, vocab=vocab, mtp=mtp, tied=tied, layers=layers)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    ctx: dict[str, Any] = {"plan": plan, "seed": plan.args["seed"], "path": str(tmp), "twin_path": None}
    ctx["start"] = write_header(tmp, plan)
    if f32_twin_path is not None:
        tp = twin_plan(plan)
        twin_tmp = Path(f32_twin_path).with_name(Path(f32_twin_path).name + ".partial")
        ctx.update(twin_path=str(twin_tmp), twin_plan=tp, twin_start=write_header(twin_tmp, tp))
    jobs = _chunks(plan)
    total = sum(t.nbytes for t in plan.tensors)
    if processes is None:
        processes = 1 if total < (256 << 20) else (os.cpu_count() or 1)
    done = 0
    if processes <= 1:
        _init_worker(ctx)
        for j in jobs:
            done += _do_chunk(j)
            if progress:
                progress(done, total)
    else:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(processes, initializer=_init_worker, initargs=(ctx,)) as pool:
            for nb in pool.imap_unordered(_do_chunk, jobs):
                done += nb
                if progress:
                    progress(done, total)
    os.replace(tmp, path)
    if f32_twin_path is not None:
        os.replace(ctx["twin_path"], f32_twin_path)
    return plan


def sha256_file(path: str | os.PathLike, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                return h.hexdigest()
            h.update(b)
