"""Quality of the quantized KV formats, measured against the FP16 cache.

* `attention_error`: relative error of decode-attention outputs, quantized cache vs FP16 cache,
  on synthetic Q/K/V with realistic outliers (`SyntheticKV`), at any context length (chunked,
  online softmax in float64: 128K positions need no more than one chunk of K/V in memory);
* `distortion`: normalized MSE D = E|x - x^|² / |x|² of rows (the paper's D_mse, spec §6.1);
* `inner_products`: bias of q.k^ against q.k (additive, relative to rms(q.k), and multiplicative
  slope - 1) and the relative rms error;
* `logits_deviation`: rms(logits_q - logits_f16) / std(logits_f16) of the CPU ReferenceModel over
  a token sequence, the cache replaced by quantize -> dequantize (`RoundtripKVState`).

    python3 -m tightfit.kvquant.quality --ctx 1024,32768 [--formats tq3,tq4] [--models tiny,small]

prints the table of the report;  `--native tiny,small` instead measures the runtime path
(`load_deviation`: the State stores the bytes, attention reads the codes) against the f16 cache. Paper reference (spec §6.1): D_mse within ~2.7x of the
lower bound 4^-b, i.e. 4^-b <= D_mse <= (sqrt(3) pi / 2) 4^-b.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch

from tightfit.kvquant.formats import DEFAULT_SEED, get_format, split_kv_type
from tightfit.kvquant.reference import RoundtripKVState, roundtrip

DEFAULT_TYPES = ("q8_0", "tq4", "tq3", "tq3_128", "tq2", "q8_0+tq3", "tq4+tq3")


def paper_bounds(bits: int) -> tuple[float, float]:
    """TurboQuant_mse distortion bounds for b bits per coordinate (spec §6.1: within ~2.7x of
    the information-theoretic lower bound 4^-b)."""
    lo = 4.0 ** -bits
    return lo, lo * math.sqrt(3) * math.pi / 2


# ---- synthetic data ----------------------------------------------------------------------------
@dataclass
class SyntheticKV:
    """Deterministic synthetic decode-attention data in the 27B's shape.

    K: per KV head, N(0, 1) channels times a log-normal channel scale (sigma 0.5), plus
    `n_outlier` channels per head with `outlier_scale` x the spread and a constant offset of
    +-`outlier_offset` (real K caches have a few such channels, spec §6.1: kurtosis 900 before
    rotation). V: N(0, 1) times a log-normal scale (sigma 0.3), 2 channels at 6x. q: N(0, 1)
    scaled so that scores q.k / sqrt(D) have a standard deviation of about `score_std`; every
    `needle_every` positions one key is replaced by a "needle" aligned with its group's mean
    query (scores ~ +`needle_boost` std), so attention is peaked like in retrieval.
    K/V rows are generated chunk by chunk from (seed, chunk index), so any length is cheap."""
    n_head: int = 24
    n_head_kv: int = 4
    head_dim: int = 256
    seed: int = 1
    n_outlier: int = 4
    outlier_scale: float = 10.0
    outlier_offset: float = 6.0
    score_std: float = 2.0
    needle_every: int = 512
    needle_boost: float = 4.0

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        Hkv, D = self.n_head_kv, self.head_dim
        self.k_scale = torch.exp(0.5 * torch.randn(Hkv, D, generator=g))
        self.k_off = torch.zeros(Hkv, D)
        for j in range(Hkv):
            ch = torch.randperm(D, generator=g)[: self.n_outlier]
            self.k_scale[j, ch] *= self.outlier_scale
            self.k_off[j, ch] = self.outlier_offset * torch.sign(torch.randn(self.n_outlier, generator=g))
        self.v_scale = torch.exp(0.3 * torch.randn(Hkv, D, generator=g))
        for j in range(Hkv):
            self.v_scale[j, torch.randperm(D, generator=g)[:2]] *= 6.0
        q = torch.randn(self.n_head, D, generator=g)
        # score std of head h: |q_h * k_scale| / sqrt(D) (k zero-mean part)
        grp = self.n_head // Hkv
        ks = self.k_scale.repeat_interleave(grp, 0)
        cur = (q * ks).norm(dim=-1) / math.sqrt(D)
        self.q = q * (self.score_std / cur)[:, None]
        qm = self.q.view(Hkv, grp, D).mean(1)                               # group mean query
        self.needle = qm / qm.norm(dim=-1, keepdim=True)

    def chunk(self, c: int, n: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V rows [n, Hkv, D] (float32) of chunk c (positions c*n ..). Measurements always use
        n = GEN_CHUNK so the data at a position does not depend on how it is processed."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + c)
        Hkv, D = self.n_head_kv, self.head_dim
        k = torch.randn(n, Hkv, D, generator=g) * self.k_scale + self.k_off
        v = torch.randn(n, Hkv, D, generator=g) * self.v_scale
        pos = torch.arange(c * n, c * n + n)
        rows = (pos % self.needle_every == self.needle_every // 2).nonzero().flatten()
        if rows.numel():
            # a needle: k = typical key + boost * std-of-scores * sqrt(D) * needle direction / |q|
            qn = self.q.view(Hkv, -1, D).norm(dim=-1).mean(1)               # [Hkv]
            amp = self.needle_boost * self.score_std * math.sqrt(D) / qn
            k[rows] += amp[None, :, None] * self.needle[None]
        return k, v


# ---- measurements ------------------------------------------------------------------------------
def _fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(x.dtype)


GEN_CHUNK = 4096


def attention_error(data: SyntheticKV, T: int, kv_types,
                    seed: int = DEFAULT_SEED) -> dict[str, float]:
    """{kv_type: |o_q - o_f16|_F / |o_f16|_F} of one decode step at T cached positions (all query
    heads, no gate), float64 online softmax over chunks; also 'f16_vs_f32' as the floor."""
    H, Hkv, D = data.n_head, data.n_head_kv, data.head_dim
    grp = H // Hkv
    qv = data.q.double().view(Hkv, grp, D) / math.sqrt(D)
    names = ["f32", "f16", *kv_types]
    state = {n: [torch.full((Hkv, grp), -math.inf, dtype=torch.float64),
                 torch.zeros(Hkv, grp, dtype=torch.float64),
                 torch.zeros(Hkv, grp, D, dtype=torch.float64)] for n in names}
    chunk = GEN_CHUNK
    for c in range(-(-T // chunk)):
        n = min(chunk, T - c * chunk)
        k, v = data.chunk(c, chunk)
        k, v = k[:n], v[:n]
        for name in names:
            if name == "f32":
                kk, vv = k, v
            elif name == "f16":
                kk, vv = _fp16(k), _fp16(v)
            else:
                kn, vn = split_kv_type(name)
                kk = _fp16(k) if kn == "f16" else roundtrip(k, kn, seed)
                vv = _fp16(v) if vn == "f16" else roundtrip(v, vn, seed)
            s = torch.einsum("jgd,tjd->jgt", qv, kk.double())
            m, l, acc = state[name]
            m_new = torch.maximum(m, s.amax(-1))
            a = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            state[name] = [m_new, l * a + p.sum(-1),
                           acc * a[..., None] + torch.einsum("jgt,tjd->jgd", p, vv.double())]
    outs = {n: (st[2] / st[1][..., None]).reshape(H, D) for n, st in state.items()}
    ref = outs["f16"]
    res = {n: float((outs[n] - ref).norm() / ref.norm()) for n in kv_types}
    res["f16_vs_f32"] = float((outs["f32"] - ref).norm() / outs["f32"].norm())
    return res


def distortion(x: torch.Tensor, fmt: str, seed: int = DEFAULT_SEED) -> float:
    """Mean over rows of |x - x^|² / |x|² (rows x [..., D])."""
    x = x.reshape(-1, x.shape[-1]).double()
    xh = roundtrip(x.float(), fmt, seed).double()
    return float(((x - xh).pow(2).sum(-1) / x.pow(2).sum(-1)).mean())


def inner_products(q: torch.Tensor, K: torch.Tensor, fmt: str,
                   seed: int = DEFAULT_SEED) -> dict[str, float]:
    """q [H, D] against K [T, Hkv, D] (grouped): bias = mean(q.k^ - q.k) / rms(q.k),
    slope = sum(q.k^ * q.k) / sum((q.k)²) - 1 (multiplicative shrink), rel_rmse = rms(q.k^ - q.k)
    / rms(q.k)."""
    H, D = q.shape
    Hkv = K.shape[1]
    qv = q.double().view(Hkv, H // Hkv, D)
    Kh = roundtrip(K.float(), fmt, seed).double()
    ip = torch.einsum("jgd,tjd->jgt", qv, K.double())
    iph = torch.einsum("jgd,tjd->jgt", qv, Kh)
    rms = ip.pow(2).mean().sqrt()
    return {"bias": float((iph - ip).mean() / rms),
            "slope": float((iph * ip).sum() / ip.pow(2).sum() - 1),
            "rel_rmse": float((iph - ip).pow(2).mean().sqrt() / rms)}


def logits_deviation(model, tokens, kv_type: str, seed: int = DEFAULT_SEED) -> float:
    """rms(logits with kv_type cache - logits with the FP16 cache) / std(FP16 logits), all
    positions of one forward over `tokens` (model: a ReferenceModel with kv_dtype float16)."""
    n = len(tokens)
    ref = model.forward(tokens, model.new_state(n)).double()
    got = model.forward(tokens, RoundtripKVState(model, kv_type, n, seed)).double()
    return float((got - ref).pow(2).mean().sqrt() / ref.std())


def tiny_model(preset: str, seed: int = 3, cache_dir: str | None = None):
    """A ReferenceModel of a random-weight synthetic file (F32) of `preset` (tiny: head_dim 32,
    small: head_dim 128), float32 compute with the FP16 cache as the baseline."""
    import tempfile
    from pathlib import Path

    from tightfit.api import open_model
    from tightfit.model.generate import make_model
    from tightfit.model.reference import ReferenceModel
    d = Path(cache_dir or tempfile.mkdtemp(prefix="kvq"))
    p = d / f"{preset}-f32-{seed}.gguf"
    if not p.exists():
        make_model(p, preset=preset, qtype="F32", seed=seed)
    return ReferenceModel.from_model_file(open_model(p), dtype=torch.float32,
                                          kv_dtype=torch.float16)


def load_deviation(path: str, tokens, kv_types, n_ctx: int | None = None) -> dict[str, float]:
    """The native runtime path: rms(tightfit.load(path, kv_type=t).logits(tokens) - the same with
    kv_type='f16') / std(f16 logits) per type; the State stores the cache as bytes and attention
    reads the codes (tightfit.kvquant.reference.attention_quant)."""
    import numpy as np

    import tightfit
    n_ctx = n_ctx or len(tokens)
    ref = tightfit.load(path, n_ctx=n_ctx, kv_type="f16").logits(tokens).astype(np.float64)
    out = {}
    for t in kv_types:
        try:
            got = tightfit.load(path, n_ctx=n_ctx, kv_type=t).logits(tokens).astype(np.float64)
        except Exception:            # UserError: format needs a wider head (tq3_128 on D=32)
            out[t] = float("nan")
            continue
        out[t] = float(np.sqrt(((got - ref) ** 2).mean()) / ref.std())
    return out


def native_files(presets, cache_dir: str | None = None) -> dict[str, str]:
    """F32 random-weight files with a tokenizer (seed 1, 1000-token vocabulary) for `load`."""
    import tempfile
    from pathlib import Path

    from tightfit.model.generate import make_model
    d = Path(cache_dir or tempfile.mkdtemp(prefix="kvq"))
    out = {}
    for preset in presets:
        p = d / f"{preset}-F32-s1-v1000.gguf"
        if not p.exists():
            make_model(p, preset=preset, seed=1, qtype="F32", vocab="small:1000")
        out[preset] = str(p)
    return out


# ---- the report table --------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", default="1024,32768")
    ap.add_argument("--formats", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--native", default=None, metavar="PRESETS",
                    help="only the native-cache table (tightfit.load(kv_type=...).logits vs f16) "
                         "for these presets, e.g. tiny,small")
    a = ap.parse_args(argv)
    types = [t for t in a.formats.split(",") if t]
    if a.native:
        print("| model (native cache, tightfit.load) | " + " | ".join(types) + " |")
        print("|---|" + "---|" * len(types))
        for preset, path in native_files([p for p in a.native.split(",") if p]).items():
            toks = torch.randint(0, 1000, (a.tokens,),
                                 generator=torch.Generator().manual_seed(0)).tolist()
            d = load_deviation(path, toks, types)
            print(f"| {preset} | " + " | ".join("n/a" if v != v else f"{v:.5f}" for v in d.values())
                  + " |", flush=True)
        return 0
    data = SyntheticKV()
    k, v = data.chunk(0, GEN_CHUNK)
    print("| kv type | K bpv | V bpv | D_mse K | D_mse V | paper bounds (K bits) | ip bias | "
          "ip slope | ip rel rmse |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in types:
        kn, vn = split_kv_type(t)
        kf, vf = get_format(kn), get_format(vn)
        ipd = inner_products(data.q, k, kn)
        lo, hi = paper_bounds(kf.bits) if kf.rotate else (float("nan"),) * 2
        print(f"| {t} | {kf.bits_per_value:g} | {vf.bits_per_value:g} | {distortion(k, kn):.5f} | "
              f"{distortion(v, vn):.5f} | {lo:.4f}..{hi:.4f} | {ipd['bias']:+.4f} | "
              f"{ipd['slope']:+.4f} | {ipd['rel_rmse']:.4f} |", flush=True)
    print()
    ctxs = [int(c) for c in a.ctx.split(",") if c]
    print("| T | " + " | ".join(types) + " | f16 vs f32 |")
    print("|---|" + "---|" * (len(types) + 1))
    for T in ctxs:
        t0 = time.time()
        r = attention_error(data, T, types)
        print(f"| {T} | " + " | ".join(f"{r[t]:.4f}" for t in types)
              + f" | {r['f16_vs_f32']:.1e} |  ({time.time() - t0:.0f} s)", flush=True)
    print()
    models = [m for m in a.models.split(",") if m]
    print("| model | " + " | ".join(types) + " |")
    print("|---|" + "---|" * len(types))
    for m in models:
        model = tiny_model(m)
        toks = torch.randint(0, model.config.n_vocab, (a.tokens,),
                             generator=torch.Generator().manual_seed(0)).tolist()
        cells = []
        for t in types:
            try:
                cells.append(f"{logits_deviation(model, toks, t):.4f}")
            except ValueError:          # format needs a wider head (tq3_128 on head_dim 32)
                cells.append("n/a")
        print(f"| {m} (D={model.config.head_dim}) | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
