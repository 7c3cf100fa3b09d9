"""`tightfit repack`: lossless base-3 repacking of ternary GGUF tensors into tightfit's T3 types.

Why. A ternary weight carries log2(3) = 1.585 bits, but the 2-bit containers spend 2: TQ2_0
(256 elements, 66 bytes, 2.0625 bpw) and Q2_0 (64 elements, 18 bytes, 2.25 bpw) hold codes
0, 1, 2 (= -1, 0, +1 times the fp16 scale d) in 2-bit fields (spec/quant-formats.md §2.3, §5).
T3 stores the same trits five to a byte (3^5 = 243 <= 256: 1.6 bits per trit, 99.06 % of the
log2(3) floor) and keeps the block's fp16 scale bits unchanged, so dequantization is bit-identical
and the original blocks can be rebuilt byte for byte (`tightfit repack --unpack`).

T3 block of G elements (G = the source block size), `ceil(G/5) + 2` bytes:

    F = G // 5 full bytes, then one tail byte when R = G % 5 > 0, then d (fp16, the source bits)
    full byte m (0 <= m < F) holds elements m, m+F, m+2F, m+3F, m+4F, first most significant
    tail byte holds elements 5F .. 5F+R-1, first most significant, pre-multiplied by 3^(5-R)
    byte = ceil(v * 256 / 243) for the base-3 value v (TQ1_0's trick): trit n of byte b is
    (((b * 3^n) mod 256) * 3) >> 8, a multiply and a shift, no division
    y[e] = d * (t[e] - 1)

Like TQ1_0's stages, consecutive bytes hold one trit plane of consecutive elements, so a GPU
reads four weights' trit n from one u32 (spec §5.3 "cheap GPU decode").

| type | id | source | elements/block | bytes/block | bpw | vs source |
|---|---|---|---|---|---|---|
| TF_T3_64 | 3064 | Q2_0 (42) | 64 | 15 | 1.875 | -16.7 % |
| TF_T3_128 | 3128 | (PQ2_0-style g128; no source type in ggml) | 128 | 28 | 1.75 | - |
| TF_T3_256 | 3256 | TQ2_0 (35) | 256 | 54 | 1.6875 | -18.2 % |

The ids are far outside ggml's range (0..42; forks use up to ~150), chosen to read as
"base 3, group G". **llama.cpp and gguf-py cannot read a repacked file** (unknown type id);
`tightfit repack --unpack` restores the original, llama.cpp-readable file exactly. Each repacked
tensor is named in the metadata: `tightfit.repack.<tensor name>` = the original type name
("Q2_0" / "TQ2_0"), plus `tightfit.repack.version` = 1, so the file is self-describing.

Floors. A block that must decode on its own, in whole bytes, with a 16-bit scale needs
ceil((G*log2(3) + 16) / 8) bytes: 15 for G = 64 (T3 reaches it), 28 for 128 (reached), 53 for
256 (T3: 54, one byte above, because 256 = 51*5 + 1 leaves a byte for one trit; only a 256-trit
big-integer code gets 53, which no GPU wants).

Not repacked: TQ1_0 (already 5 trits per byte: 54 bytes per 256, the same as T3_256, nothing to
gain); Q1_0 (binary, 1 bit per weight, not ternary); a Q2_0/TQ2_0 tensor that holds a code 3
anywhere (Q2_0's +2, so not ternary: kept as it is, with the reason in the report).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from tightfit.errors import GGUFError, UserError
from tightfit.tools import gguf_rewrite as G

REPACK_VERSION = 1
KEY_PREFIX = "tightfit.repack."
TQ1_0, TQ2_0, Q1_0, Q2_0 = 34, 35, 41, 42
_SRC_NAMES = {TQ2_0: "TQ2_0", Q2_0: "Q2_0"}
_BLOCKS_PER_CHUNK = 1 << 16


@dataclass(frozen=True)
class T3Type:
    name: str
    type_id: int
    block_size: int

    @property
    def n_full(self) -> int:
        return self.block_size // 5

    @property
    def n_tail(self) -> int:
        return self.block_size % 5

    @property
    def n_qs(self) -> int:
        return self.n_full + (1 if self.n_tail else 0)

    @property
    def type_size(self) -> int:
        return self.n_qs + 2

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size


T3_64 = T3Type("TF_T3_64", 3064, 64)
T3_128 = T3Type("TF_T3_128", 3128, 128)
T3_256 = T3Type("TF_T3_256", 3256, 256)
T3_TYPES: dict[int, T3Type] = {t.type_id: t for t in (T3_64, T3_128, T3_256)}
T3_FOR_SOURCE: dict[int, T3Type] = {Q2_0: T3_64, TQ2_0: T3_256}

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint16)


# ---- source formats <-> (codes, scale bits) ---------------------------------------------------
def _tq2_0_codes(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ2_0 blocks (n, 66) -> codes (n, 256) in element order, d bits (n,). Crumb planes:
    element 128c + 32j + m is crumb j of qs[32c + m] (spec §2.3)."""
    n = b.shape[0]
    qs = b[:, :64].reshape(n, 2, 1, 32)
    c = (qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    return c.reshape(n, 256), np.ascontiguousarray(b[:, 64:66]).view("<u2")[:, 0]


def _tq2_0_blocks(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = codes.shape[0]
    c = codes.reshape(n, 2, 4, 32)
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return np.concatenate([qs.reshape(n, 64), d.astype("<u2").view(np.uint8).reshape(n, 2)], axis=1)


def _q2_0_codes(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q2_0 blocks (n, 18) -> codes (n, 64), d bits. Element e is crumb e%4 of qs[e/4]."""
    n = b.shape[0]
    c = (b[:, 2:18, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
    return c.reshape(n, 64), np.ascontiguousarray(b[:, 0:2]).view("<u2")[:, 0]


def _q2_0_blocks(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = codes.shape[0]
    c = codes.reshape(n, 16, 4)
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return np.concatenate([d.astype("<u2").view(np.uint8).reshape(n, 2), qs], axis=1)


_SOURCE_CODECS: dict[int, tuple[Callable, Callable, int]] = {
    TQ2_0: (_tq2_0_codes, _tq2_0_blocks, 66),
    Q2_0: (_q2_0_codes, _q2_0_blocks, 18),
}


# ---- T3 <-> (codes, scale bits) ---------------------------------------------------------------
def _base3_byte(v: np.ndarray) -> np.ndarray:
    return ((v.astype(np.uint32) * 256 + 242) // 243).astype(np.uint8)


def t3_encode(codes: np.ndarray, d: np.ndarray, t: T3Type) -> np.ndarray:
    """codes (n, G) in {0, 1, 2}, fp16 scale bits (n,) -> T3 blocks (n, type_size)."""
    n, g = codes.shape
    if g != t.block_size:
        raise ValueError(f"{t.name} needs {t.block_size} codes per block, got {g}")
    F, R = t.n_full, t.n_tail
    full = codes[:, :5 * F].reshape(n, 5, F).astype(np.uint16)
    v = (full * _POW3[::-1][None, :, None]).sum(axis=1)               # first trit most significant
    parts = [_base3_byte(v)]
    if R:
        tail = codes[:, 5 * F:].astype(np.uint16)
        w = _POW3[:R][::-1] * _POW3[5 - R]                             # 3^(R-1-k) * 3^(5-R)
        parts.append(_base3_byte((tail * w[None, :]).sum(axis=1))[:, None])
    parts.append(np.asarray(d, dtype="<u2").view(np.uint8).reshape(n, 2))
    return np.concatenate(parts, axis=1)


def _trits(b: np.ndarray, k: int) -> np.ndarray:
    """Trits 0..k-1 (most significant first) of base-3 bytes: (...) -> (..., k)."""
    x = b.astype(np.uint16)[..., None] * _POW3[:k]
    return (((x & 255) * 3) >> 8).astype(np.uint8)


def t3_decode(blocks: np.ndarray, t: T3Type) -> tuple[np.ndarray, np.ndarray]:
    """T3 blocks (n, type_size) -> codes (n, G), fp16 scale bits (n,)."""
    n = blocks.shape[0]
    F, R = t.n_full, t.n_tail
    full = _trits(blocks[:, :F], 5)                  # (n, F, 5): [m, k] is element m + F k
    codes = [full.transpose(0, 2, 1).reshape(n, 5 * F)]
    if R:
        codes.append(_trits(blocks[:, F], R))
    d = np.ascontiguousarray(blocks[:, t.n_qs:t.n_qs + 2]).view("<u2")[:, 0]
    return np.concatenate(codes, axis=1), d


def dequantize_t3(raw: np.ndarray, type_id: int) -> np.ndarray:
    """NumPy reference: T3 bytes -> float32 (flat), y = d * (t - 1), the same float operation
    as TQ2_0's and Q2_0's reference dequantization."""
    t = T3_TYPES[int(type_id)]
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, t.type_size)
    codes, d = t3_decode(b, t)
    df = d.view(np.float16).astype(np.float32)[:, None]
    return (df * (codes.astype(np.float32) - np.float32(1))).reshape(-1)


# ---- tensor level ---------------------------------------------------------------------------------
def _block_chunks(raw: np.ndarray, type_size: int) -> Iterator[np.ndarray]:
    blocks = raw.reshape(-1, type_size)
    for i in range(0, blocks.shape[0], _BLOCKS_PER_CHUNK):
        yield np.ascontiguousarray(blocks[i:i + _BLOCKS_PER_CHUNK])


def _threads() -> int:
    """Worker threads for the chunk loops (NumPy releases the GIL in its array kernels):
    TIGHTFIT_REPACK_THREADS, else min(8, CPUs)."""
    import os
    n = os.environ.get("TIGHTFIT_REPACK_THREADS")
    return max(1, int(n)) if n else max(1, min(8, os.cpu_count() or 1))


def _ordered_map(fn: Callable[[np.ndarray], np.ndarray], chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """fn over chunks on a thread pool, results in input order, at most 2 x threads in flight
    (bounded memory: a chunk is 65,536 blocks)."""
    n = _threads()
    if n == 1:
        yield from map(fn, chunks)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(n) as ex:
        window: deque = deque()
        for c in chunks:
            window.append(ex.submit(fn, c))
            if len(window) >= 2 * n:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def is_ternary(raw: np.ndarray, src_type: int) -> bool:
    """True if every code of a Q2_0/TQ2_0 tensor is 0, 1 or 2 (no code 3 = +2)."""
    to_codes, _, ts = _SOURCE_CODECS[src_type]
    return all(int(m) <= 2 for m in _ordered_map(lambda b: to_codes(b)[0].max(initial=0),
                                                 _block_chunks(raw, ts)))


def repack_chunks(raw: np.ndarray, src_type: int) -> Iterator[np.ndarray]:
    to_codes, _, ts = _SOURCE_CODECS[src_type]
    t3 = T3_FOR_SOURCE[src_type]

    def one(b: np.ndarray) -> np.ndarray:
        codes, d = to_codes(b)
        return t3_encode(codes, d, t3)
    yield from _ordered_map(one, _block_chunks(raw, ts))


def unpack_chunks(raw: np.ndarray, t3: T3Type, src_type: int) -> Iterator[np.ndarray]:
    _, to_blocks, _ = _SOURCE_CODECS[src_type]
    yield from _ordered_map(lambda b: to_blocks(*t3_decode(b, t3)), _block_chunks(raw, t3.type_size))


def repacked_nbytes(src_type: int, ne: tuple[int, ...]) -> int:
    """Bytes a Q2_0/TQ2_0 tensor of shape `ne` (ggml order) takes as T3."""
    return G.tensor_nbytes(ne, T3_FOR_SOURCE[src_type].type_id)


# ---- file level -------------------------------------------------------------------------------------
@dataclass
class RepackReport:
    bytes_in: int = 0                      # file sizes
    bytes_out: int = 0
    tensors: dict[str, tuple[str, str, int, int]] = field(default_factory=dict)  # name -> (from, to, in, out)
    skipped: dict[str, str] = field(default_factory=dict)                          # name -> reason

    @property
    def saved(self) -> int:
        return self.bytes_in - self.bytes_out

    def lines(self) -> list[str]:
        out = [f"{name}: {a} -> {b}, {i} -> {o} bytes" for name, (a, b, i, o) in self.tensors.items()]
        out += [f"{name}: kept ({why})" for name, why in self.skipped.items()]
        pct = 100.0 * self.saved / self.bytes_in if self.bytes_in else 0.0
        out.append(f"{len(self.tensors)} tensors rewritten; file {self.bytes_in} -> {self.bytes_out} "
                   f"bytes ({self.saved} saved, {pct:.2f} %)")
        return out


def _check_paths(src: str, dst: str) -> None:
    if Path(dst).exists() and Path(src).exists() and Path(dst).resolve() == Path(src).resolve():
        raise UserError(f"output {dst} is the input file; write to a new path")


def repack_file(src: str, dst: str, *, progress: Callable[[str], None] | None = None) -> RepackReport:
    """Write `dst`: `src` with every ternary Q2_0/TQ2_0 tensor stored as T3. Lossless."""
    _check_paths(src, dst)
    lay = G.read_gguf(src)
    if lay.get(KEY_PREFIX + "version") is not None:
        raise UserError(f"{Path(src).name} is already repacked (it has {KEY_PREFIX}version)")
    rep = RepackReport(bytes_in=Path(src).stat().st_size)
    out, set_kv = [], {}
    for t in lay.tensors:
        name = _SRC_NAMES.get(t.type_id)
        if t.type_id == TQ1_0:
            rep.skipped[t.name] = "TQ1_0 is already 5 trits per byte"
        elif t.type_id == Q1_0:
            rep.skipped[t.name] = "Q1_0 is binary, not ternary"
        if name is None:
            out.append(G.OutTensor.copy_of(lay, t))
            continue
        if progress:
            progress(t.name)
        if not is_ternary(lay.raw(t), t.type_id):
            rep.skipped[t.name] = f"{name} with code 3 (+2): not ternary"
            out.append(G.OutTensor.copy_of(lay, t))
            continue
        t3 = T3_FOR_SOURCE[t.type_id]
        out.append(G.OutTensor(t.name, t.ne, t3.type_id,
                               (lambda t=t: repack_chunks(lay.raw(t), t.type_id))))
        set_kv[KEY_PREFIX + t.name] = G.KV(KEY_PREFIX + t.name, G.STRING, name)
        rep.tensors[t.name] = (name, t3.name, t.nbytes, out[-1].nbytes)
    kvs = lay.kvs_with({KEY_PREFIX + "version": G.KV(KEY_PREFIX + "version", G.UINT32, REPACK_VERSION),
                        **set_kv})
    rep.bytes_out = G.write_gguf(dst, kvs, out, alignment=lay.alignment, version=lay.version)
    return rep


def unpack_file(src: str, dst: str) -> RepackReport:
    """Inverse of repack_file: every T3 tensor back to its original type, byte for byte."""
    _check_paths(src, dst)
    lay = G.read_gguf(src)
    if lay.get(KEY_PREFIX + "version") is None:
        raise UserError(f"{Path(src).name} is not a repacked file (no {KEY_PREFIX}version)")
    rep = RepackReport(bytes_in=Path(src).stat().st_size)
    by_name = {v: k for k, v in _SRC_NAMES.items()}
    out = []
    for t in lay.tensors:
        if t.type_id not in T3_TYPES:
            out.append(G.OutTensor.copy_of(lay, t))
            continue
        orig = lay.get(KEY_PREFIX + t.name)
        if orig not in by_name or T3_FOR_SOURCE[by_name[orig]].type_id != t.type_id:
            raise GGUFError(f"{Path(src).name}: T3 tensor '{t.name}' has no valid original type "
                            f"({KEY_PREFIX}{t.name} = {orig!r})")
        sid, t3 = by_name[orig], T3_TYPES[t.type_id]
        out.append(G.OutTensor(t.name, t.ne, sid, (lambda t=t, t3=t3, sid=sid: unpack_chunks(lay.raw(t), t3, sid))))
        rep.tensors[t.name] = (t3.name, orig, t.nbytes, out[-1].nbytes)
    kvs = lay.kvs_with(drop=[KEY_PREFIX + "*"])
    rep.bytes_out = G.write_gguf(dst, kvs, out, alignment=lay.alignment, version=lay.version)
    return rep


def plan_savings(tensors: list[tuple[str, tuple[int, ...], str]]) -> dict[str, int]:
    """Header-only accounting for (name, ne, type name) triples: bytes of the Q2_0/TQ2_0 tensors
    before and after repacking (no data read; assumes they are ternary)."""
    ids = {"Q2_0": Q2_0, "TQ2_0": TQ2_0}
    before = after = 0
    for _, ne, tname in tensors:
        if tname in ids:
            before += G.tensor_nbytes(ne, ids[tname])
            after += repacked_nbytes(ids[tname], ne)
    return {"ternary_bytes": before, "repacked_bytes": after, "saved": before - after}
