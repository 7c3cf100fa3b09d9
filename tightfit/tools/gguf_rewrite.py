"""Copy a GGUF file with changed metadata and/or tensors, streaming (never a second copy of the
weights in memory).

Why a reader of its own: the tools also read files that hold tightfit's repacked ternary types
(ids outside ggml's range, see tightfit/tools/repack.py), which gguf-py's `GGUFReader` and the
strict `tightfit.gguf.GGUFFile` reject as unknown types. This reader walks the header once with
bounds checks, keeps every key's exact GGUF value type (so a copy is type-faithful), and maps the
data section read-only. Block sizes come from `tightfit.quant.TRAITS`, gguf-py's table (integer
types) and the repacked types.

    src = read_gguf(path)                 # GGUFLayout: kvs (ordered), tensors, data view
    out = [OutTensor.copy_of(src, t) for t in src.tensors]
    write_gguf(dst, src.kvs_with(changes), out, alignment=src.alignment)

`write_gguf` writes `dst + ".partial"` then renames it, so an interrupted run leaves no half file.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from tightfit.errors import GGUFError

# GGUF value types (gguf spec numbering = gguf.GGUFValueType).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_NP = {UINT8: "<u1", INT8: "<i1", UINT16: "<u2", INT16: "<i2", UINT32: "<u4", INT32: "<i4",
       FLOAT32: "<f4", BOOL: "<u1", UINT64: "<u8", INT64: "<i8", FLOAT64: "<f8"}
DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4


@dataclass
class KV:
    """One metadata entry. `value`: python scalar / str; arrays are a numpy array (numbers) or a
    list of str; `etype` is the array element type."""
    key: str
    vtype: int
    value: Any
    etype: int | None = None


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ne: tuple[int, ...]          # ggml order (ne0 = contiguous row length)
    type_id: int
    rel_offset: int              # offset inside the data section
    nbytes: int

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.n_rows


def block_info(type_id: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a tensor type id, tightfit's repacked types
    included. GGUFError for an id nobody here knows."""
    from tightfit.tools.repack import T3_TYPES
    if type_id in T3_TYPES:
        t = T3_TYPES[type_id]
        return t.block_size, t.type_size
    from tightfit.quant import TRAITS
    tr = TRAITS.get(int(type_id))
    if tr is not None:
        return tr.block_size, tr.type_size
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    try:
        return tuple(GGML_QUANT_SIZES[GGMLQuantizationType(int(type_id))])  # type: ignore[return-value]
    except (ValueError, KeyError):
        raise GGUFError(f"unknown tensor type id {type_id}") from None


def tensor_nbytes(ne: Iterable[int], type_id: int) -> int:
    ne = tuple(int(v) for v in ne)
    bs, ts = block_info(type_id)
    if ne[0] % bs:
        raise GGUFError(f"row length {ne[0]} is not a multiple of the block size {bs} of type {type_id}")
    n_rows = 1
    for d in ne[1:]:
        n_rows *= d
    return ne[0] // bs * ts * n_rows


class _Cur:
    def __init__(self, buf: Any, name: str):
        self.buf, self.pos, self.name, self.size = buf, 0, name, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"{self.name}: truncated header while reading {what}")

    def unpack(self, fmt: str, what: str):
        s = struct.calcsize(fmt)
        self.need(s, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += s
        return v

    def string(self, what: str) -> str:
        (n,) = self.unpack("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.name}: {what} is not valid UTF-8") from None


def _read_value(c: _Cur, vtype: int, what: str) -> tuple[Any, int | None]:
    if vtype == STRING:
        return c.string(what), None
    if vtype in _NP:
        dt = np.dtype(_NP[vtype])
        c.need(dt.itemsize, what)
        v = np.frombuffer(c.buf, dt, 1, c.pos)[0].item()
        c.pos += dt.itemsize
        return (bool(v) if vtype == BOOL else v), None
    if vtype == ARRAY:
        etype, n = c.unpack("<IQ", what)
        if etype == STRING:
            unpack, buf, items = struct.Struct("<Q").unpack_from, c.buf, []
            pos = c.pos
            for _ in range(n):
                if pos + 8 > c.size:
                    raise GGUFError(f"{c.name}: truncated string array {what}")
                (ln,) = unpack(buf, pos)
                if pos + 8 + ln > c.size:
                    raise GGUFError(f"{c.name}: truncated string array {what}")
                items.append(bytes(buf[pos + 8:pos + 8 + ln]).decode("utf-8"))
                pos += 8 + ln
            c.pos = pos
            return items, etype
        if etype in _NP:
            dt = np.dtype(_NP[etype])
            c.need(n * dt.itemsize, what)
            arr = np.frombuffer(c.buf, dt, n, c.pos).copy()
            c.pos += n * dt.itemsize
            return arr, etype
        if etype == ARRAY:
            return [_read_value(c, ARRAY, what) for _ in range(n)], etype
        raise GGUFError(f"{c.name}: {what} has unknown array element type {etype}")
    raise GGUFError(f"{c.name}: {what} has unknown value type {vtype}")


@dataclass
class GGUFLayout:
    path: Path
    version: int
    alignment: int
    kvs: dict[str, KV]
    tensors: list[TensorEntry]
    data_offset: int
    _data: Any = field(default=None, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None else kv.value

    def tensor(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise GGUFError(f"{self.path.name}: no tensor '{name}'")

    def raw(self, t: TensorEntry) -> np.ndarray:
        """Read-only uint8 view of a tensor's bytes (pages load on access)."""
        start = self.data_offset + t.rel_offset
        return self._data[start:start + t.nbytes]

    def rows(self, t: TensorEntry) -> np.ndarray:
        return self.raw(t).reshape(t.n_rows, t.row_bytes)

    def kvs_with(self, set_: dict[str, KV] | None = None, drop: Iterable[str] = ()) -> list[KV]:
        """The key/value list with entries replaced/added (`set_`, appended in its order when
        new) and keys removed (`drop`; a key ending in '*' drops a prefix)."""
        set_ = dict(set_ or {})
        drop = list(drop)

        def dropped(k: str) -> bool:
            return any(k.startswith(d[:-1]) if d.endswith("*") else k == d for d in drop)
        out = []
        for k, kv in self.kvs.items():
            if k in set_:
                out.append(set_.pop(k))
            elif not dropped(k):
                out.append(kv)
        return out + list(set_.values())

    def close(self) -> None:
        self._data = None


def read_gguf(path: str | os.PathLike) -> GGUFLayout:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise GGUFError(f"{path}: cannot read as GGUF ({getattr(e, 'strerror', None) or e})") from None
    data = np.frombuffer(mm, dtype=np.uint8)
    c = _Cur(mm, path.name)
    (magic,) = c.unpack("<4s", "magic")
    if magic != b"GGUF":
        raise GGUFError(f"{path.name}: not a GGUF file (bad magic)")
    version, n_tensors, n_kv = c.unpack("<IQQ", "header")
    if version not in (2, 3):
        raise GGUFError(f"{path.name}: unsupported GGUF version {version}")
    kvs: dict[str, KV] = {}
    for i in range(n_kv):
        key = c.string(f"key #{i}")
        (vtype,) = c.unpack("<I", f"type of '{key}'")
        value, etype = _read_value(c, vtype, f"'{key}'")
        kvs[key] = KV(key, vtype, value, etype)
    alignment = int(kvs["general.alignment"].value) if "general.alignment" in kvs else DEFAULT_ALIGNMENT
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path.name}: general.alignment {alignment} is not a power of two")
    infos = []
    for i in range(n_tensors):
        name = c.string(f"name of tensor #{i}")
        (nd,) = c.unpack("<I", f"dims of '{name}'")
        if not 1 <= nd <= _MAX_DIMS:
            raise GGUFError(f"{path.name}: tensor '{name}' has {nd} dimensions")
        ne = c.unpack(f"<{nd}Q", f"shape of '{name}'")
        tid, off = c.unpack("<IQ", f"type of '{name}'")
        infos.append((name, tuple(int(v) for v in ne), int(tid), int(off)))
    data_offset = c.pos + (-c.pos) % alignment
    tensors = []
    for name, ne, tid, off in infos:
        nb = tensor_nbytes(ne, tid)
        if data_offset + off + nb > len(data):
            raise GGUFError(f"{path.name}: tensor '{name}' runs past the end of the file")
        tensors.append(TensorEntry(name, ne, tid, off, nb))
    return GGUFLayout(path, version, alignment, kvs, tensors, data_offset, data)


# ---- writing -------------------------------------------------------------------------------------
def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype: int, value: Any, etype: int | None) -> bytes:
    if vtype == STRING:
        return _pack_str(value)
    if vtype in _NP:
        return np.asarray(value, dtype=_NP[vtype]).tobytes()
    if vtype == ARRAY:
        if etype is None:
            raise GGUFError("array value without element type")
        n = len(value)
        head = struct.pack("<IQ", etype, n)
        if etype == STRING:
            return head + b"".join(_pack_str(s) for s in value)
        if etype in _NP:
            return head + np.asarray(value, dtype=_NP[etype]).tobytes()
        if etype == ARRAY:
            return head + b"".join(_pack_value(ARRAY, v, e) for v, e in value)
    raise GGUFError(f"cannot write value type {vtype}")


@dataclass
class OutTensor:
    """A tensor of the output file: `chunks()` yields its bytes in order (any number of pieces,
    bytes-like or uint8 arrays), exactly `nbytes` in all."""
    name: str
    ne: tuple[int, ...]
    type_id: int
    chunks: Callable[[], Iterator[Any]]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ne, self.type_id)

    @classmethod
    def copy_of(cls, src: GGUFLayout, t: TensorEntry, chunk_bytes: int = 64 << 20) -> "OutTensor":
        def gen():
            raw = src.raw(t)
            for i in range(0, t.nbytes, chunk_bytes):
                yield raw[i:i + chunk_bytes]
        return cls(t.name, t.ne, t.type_id, gen)


def header_bytes(kvs: list[KV], tensors: list[OutTensor], alignment: int, version: int = 3) -> tuple[bytes, list[int]]:
    """The header (padded to `alignment`) and each tensor's offset in the data section."""
    parts = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(kvs))]
    for kv in kvs:
        parts += [_pack_str(kv.key), struct.pack("<I", kv.vtype), _pack_value(kv.vtype, kv.value, kv.etype)]
    offsets, off = [], 0
    for t in tensors:
        offsets.append(off)
        parts += [_pack_str(t.name), struct.pack(f"<I{len(t.ne)}Q", len(t.ne), *t.ne),
                  struct.pack("<IQ", t.type_id, off)]
        off += t.nbytes + (-t.nbytes) % alignment
    head = b"".join(parts)
    return head + b"\0" * ((-len(head)) % alignment), offsets


def write_gguf(path: str | os.PathLike, kvs: list[KV], tensors: list[OutTensor], *,
               alignment: int = DEFAULT_ALIGNMENT, version: int = 3) -> int:
    """Write a GGUF file; returns its size in bytes."""
    path = Path(path)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise GGUFError(f"{path.name}: duplicate tensor names")
    head, _ = header_bytes(kvs, tensors, alignment, version)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for t in tensors:
                n = 0
                for piece in t.chunks():
                    b = memoryview(np.ascontiguousarray(piece, dtype=np.uint8)).cast("B") \
                        if isinstance(piece, np.ndarray) else memoryview(piece)
                    f.write(b)
                    n += b.nbytes
                if n != t.nbytes:
                    raise GGUFError(f"tensor '{t.name}': wrote {n} bytes, expected {t.nbytes}")
                f.write(b"\0" * ((-n) % alignment))
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return size
