"""Strict, allocation-safe checks of a GGUF file that gguf-py does not make.

Two layers:

* `prescan(buf, file_size, fname)` walks the header with `struct` *before* gguf-py sees the file.
  Every count and length is bounded by the bytes that are left, so a hostile length can neither
  allocate memory nor make a loop run longer than the file is big. It mirrors the rejections of
  llama.cpp's `gguf.cpp` (version, tensor name length, n_dims, retired types, block multiples,
  alignment, data inside the file) and also rejects overlapping tensor data.
  It decodes string arrays itself because gguf-py parses arrays one element at a time (8 s for a
  150k-token vocabulary); the reader reuses those strings.
* `check_metadata_types(...)` enforces the exact value types llama.cpp demands for the keys it
  reads (spec/gguf-synthetic-traps.md §3: "block_count has wrong type i32 but expected type u32").

Every failure is a `GGUFError` naming the file, the key or tensor, and the problem.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

from gguf.constants import GGUFValueType as VT

from tightfit.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4           # ggml tensors have at most 4 dims
GGML_MAX_NAME = 64          # llama.cpp rejects tensor names of >= 64 bytes
DEFAULT_ALIGNMENT = 32
QWEN35 = "qwen35"
MAX_ELEMENTS = 2**62        # far above any real tensor, far below int64 overflow

#: Type ids llama.cpp removed; a file using them was made by a broken or ancient tool.
RETIRED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
                 36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}

# bytes of each fixed-size GGUF value type
SCALAR_SIZES = {VT.UINT8: 1, VT.INT8: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4,
                VT.FLOAT32: 4, VT.BOOL: 1, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


# ---- quant type table ---------------------------------------------------------------------------
@dataclass(frozen=True)
class QType:
    id: int
    name: str
    block_elems: int
    block_bytes: int


_QTYPES: dict[int, QType] | None = None


def qtypes() -> dict[int, QType]:
    """id -> QType for every type a tensor may use. Prefers tightfit.quant's traits (which may know
    types newer than gguf-py, e.g. Q2_0); falls back to gguf-py's GGML_QUANT_SIZES."""
    global _QTYPES
    if _QTYPES is not None:
        return _QTYPES
    table: dict[int, QType] = {}
    from gguf.constants import GGML_QUANT_SIZES
    for t, (blck, size) in GGML_QUANT_SIZES.items():
        table[int(t)] = QType(int(t), t.name, int(blck), int(size))
    try:  # tightfit.quant is written in parallel; tolerate its absence or a different shape
        from tightfit.quant import TRAITS  # type: ignore[attr-defined]
        items = TRAITS.items() if isinstance(TRAITS, Mapping) else enumerate(TRAITS)
        for key, tr in items:
            qid = int(getattr(tr, "id", getattr(tr, "qtype", key)))
            name = getattr(tr, "name", None) or str(key)
            blck = getattr(tr, "block_size", None) or getattr(tr, "block_elems", None) or getattr(tr, "blck", None)
            size = getattr(tr, "type_size", None) or getattr(tr, "block_bytes", None)
            if blck and size and qid not in RETIRED_TYPES:
                table[qid] = QType(qid, str(name), int(blck), int(size))
    except Exception:
        pass
    for rid in RETIRED_TYPES:
        table.pop(rid, None)
    _QTYPES = table
    return table


def qtype_name(qid: int) -> str:
    t = qtypes().get(qid)
    return t.name if t else RETIRED_TYPES.get(qid, f"type{qid}")


# ---- prescan ------------------------------------------------------------------------------------
@dataclass
class KVRecord:
    key: str
    vtype: VT
    etype: VT | None              # element type of an array
    count: int                    # array length (1 for scalars)
    value_offset: int             # where the value starts (after the u32 type)
    size: int                     # bytes of the value (array header included)
    strings: list[str] | None = None   # decoded string array


@dataclass
class TensorRecord:
    name: str
    ne: tuple[int, ...]
    qtype: int
    rel_offset: int
    n_elements: int = 0
    nbytes: int = 0
    offset: int = 0               # absolute


@dataclass
class Prescan:
    version: int
    n_tensors: int
    n_kv: int
    kvs: dict[str, KVRecord] = field(default_factory=dict)
    tensors: list[TensorRecord] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0
    file_size: int = 0

    def array_by_offset(self) -> dict[int, KVRecord]:
        return {r.value_offset: r for r in self.kvs.values() if r.vtype == VT.ARRAY}


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: Any, size: int, fname: str):
        self.buf, self.size, self.fname, self.pos = buf, size, fname, 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.fname}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} runs past the end of the file (needs {n} bytes at offset "
                            f"{self.pos}, file has {self.size})")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_len is not None and n >= max_len:
            raise self.fail(f"{what} is {n} bytes long (limit {max_len - 1})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None


def _value_type(c: _Cursor, raw: int, what: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise c.fail(f"{what} has unknown value type id {raw}") from None


def _scan_value(c: _Cursor, key: str, vtype: VT) -> KVRecord:
    start = c.pos
    what = f"metadata key '{key}'"
    if vtype == VT.STRING:
        n = c.u64(f"string length of {what}")
        c.need(n, f"string value of {what}")
        c.pos += n
        return KVRecord(key, vtype, None, 1, start, c.pos - start)
    if vtype in SCALAR_SIZES:
        c.need(SCALAR_SIZES[vtype], f"value of {what}")
        c.pos += SCALAR_SIZES[vtype]
        return KVRecord(key, vtype, None, 1, start, c.pos - start)
    # array: u32 element type, u64 count, elements
    etype = _value_type(c, c.u32(f"array type of {what}"), f"array {what}")
    count = c.u64(f"array length of {what}")
    if etype == VT.ARRAY:
        raise c.fail(f"{what} is an array of arrays, which GGUF readers do not support")
    if etype in SCALAR_SIZES:
        esize = SCALAR_SIZES[etype]
        if count > (c.size - c.pos) // esize:
            raise c.fail(f"{what}: array of {count} {etype.name} elements runs past the end of the file")
        c.pos += count * esize
        return KVRecord(key, vtype, etype, count, start, c.pos - start)
    # string array: each element has an 8-byte length, so the count is bounded by the bytes left
    if count > (c.size - c.pos) // 8:
        raise c.fail(f"{what}: array of {count} strings runs past the end of the file")
    buf, pos, size, unpack = c.buf, c.pos, c.size, _U64.unpack_from
    out: list[str] = [""] * count
    for i in range(count):
        if size - pos < 8:
            c.pos = pos
            raise c.fail(f"{what}: string {i} of {count} runs past the end of the file")
        n = unpack(buf, pos)[0]
        pos += 8
        if n > size - pos:
            c.pos = pos
            raise c.fail(f"{what}: string {i} has length {n}, past the end of the file")
        try:
            out[i] = bytes(buf[pos:pos + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise c.fail(f"{what}: string {i} is not valid UTF-8") from None
        pos += n
    c.pos = pos
    return KVRecord(key, vtype, etype, count, start, c.pos - start, strings=out)


def prescan(buf: Any, file_size: int, fname: str) -> Prescan:
    """Walk header, metadata and tensor infos; check tensor data placement. `buf` supports the
    buffer protocol (mmap / memoryview) and holds `file_size` bytes."""
    c = _Cursor(buf, file_size, fname)
    if file_size < 4 or bytes(buf[0:4]) != GGUF_MAGIC:
        head = bytes(buf[0:4]) if file_size >= 4 else bytes(buf[0:file_size])
        raise c.fail(f"not a GGUF file (magic {head!r}, expected b'GGUF')")
    c.pos = 4
    version = c.u32("version")
    if version & 0xFFFF == 0 and version != 0:
        raise c.fail("big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise c.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata key count")
    # smallest KV: 8 (key len) + 0 (key) + 4 (type) + 1 (u8); smallest tensor info: 8+0+4+8+4+8
    if n_kv > (file_size - c.pos) // 13:
        raise c.fail(f"metadata key count {n_kv} is impossible for a file of {file_size} bytes")
    if n_tensors > (file_size - c.pos - 13 * n_kv) // 32:
        raise c.fail(f"tensor count {n_tensors} is impossible for a file of {file_size} bytes")
    scan = Prescan(version=version, n_tensors=n_tensors, n_kv=n_kv, file_size=file_size)

    for i in range(n_kv):
        key = c.string(f"name of metadata key #{i}")
        if key in scan.kvs:
            raise c.fail(f"duplicate metadata key '{key}'")
        vtype = _value_type(c, c.u32(f"type of metadata key '{key}'"), f"metadata key '{key}'")
        scan.kvs[key] = _scan_value(c, key, vtype)

    al = scan.kvs.get("general.alignment")
    if al is not None:
        if al.vtype != VT.UINT32:
            raise c.fail(f"metadata key 'general.alignment' has type {al.vtype.name}, expected UINT32")
        scan.alignment = _U32.unpack_from(buf, al.value_offset)[0]
        if scan.alignment == 0 or scan.alignment & (scan.alignment - 1):
            raise c.fail(f"general.alignment {scan.alignment} is not a power of two")

    table = qtypes()
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"name of tensor #{i}", max_len=GGML_MAX_NAME)
        if name in names:
            raise c.fail(f"duplicate tensor '{name}'")
        names.add(name)
        what = f"tensor '{name}'"
        n_dims = c.u32(f"n_dims of {what}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise c.fail(f"{what} has {n_dims} dimensions (must be 1..{GGML_MAX_DIMS})")
        ne = tuple(c.u64(f"dims of {what}") for _ in range(n_dims))
        n_el = 1
        for d in ne:
            if d <= 0 or d > MAX_ELEMENTS:
                raise c.fail(f"{what} has invalid dimension {d} in shape {list(ne)}")
            n_el *= d
            if n_el > MAX_ELEMENTS:
                raise c.fail(f"{what} shape {list(ne)} has too many elements")
        qid = c.u32(f"type of {what}")
        if qid in RETIRED_TYPES:
            raise c.fail(f"{what} uses retired type id {qid} ({RETIRED_TYPES[qid]})")
        qt = table.get(qid)
        if qt is None:
            raise c.fail(f"{what} has unknown type id {qid}")
        if ne[0] % qt.block_elems:
            raise c.fail(f"{what} of type {qt.name}: ne0={ne[0]} is not a multiple of the block "
                         f"size {qt.block_elems}")
        rel = c.u64(f"data offset of {what}")
        scan.tensors.append(TensorRecord(name, ne, qid, rel, n_el, n_el // qt.block_elems * qt.block_bytes))

    pad = (-c.pos) % scan.alignment
    scan.data_offset = c.pos + pad
    if scan.tensors and scan.data_offset > file_size:
        raise c.fail(f"tensor data section starts at {scan.data_offset}, past the end of the file "
                     f"({file_size} bytes)")
    for t in scan.tensors:
        if t.rel_offset % scan.alignment:
            raise c.fail(f"tensor '{t.name}' data offset {t.rel_offset} is not a multiple of the "
                         f"alignment {scan.alignment}")
        t.offset = scan.data_offset + t.rel_offset
        if t.rel_offset > file_size or t.nbytes > file_size - t.offset:
            raise c.fail(f"tensor '{t.name}' data ({t.nbytes} bytes at offset {t.offset}) runs past "
                         f"the end of the file ({file_size} bytes); truncated download?")
    prev: TensorRecord | None = None
    for t in sorted(scan.tensors, key=lambda t: t.offset):
        if prev is not None and t.offset < prev.offset + prev.nbytes:
            raise c.fail(f"tensor '{t.name}' data overlaps tensor '{prev.name}'")
        prev = t
    return scan


# ---- metadata value types llama.cpp checks exactly ----------------------------------------------
_INT_ARR = (VT.UINT32, VT.INT32)

# rule: ("scalar", VT) | ("array", element types, length rule) | ("scalar_or_array", VT, element types)
_ARCH_RULES: dict[str, tuple] = {
    "context_length": ("scalar", VT.UINT32),
    "embedding_length": ("scalar", VT.UINT32),
    "block_count": ("scalar", VT.UINT32),
    "nextn_predict_layers": ("scalar", VT.UINT32),
    "feed_forward_length": ("scalar_or_array", VT.UINT32, _INT_ARR),
    "attention.head_count": ("scalar_or_array", VT.UINT32, _INT_ARR),
    "attention.head_count_kv": ("scalar_or_array", VT.UINT32, _INT_ARR),
    "attention.key_length": ("scalar", VT.UINT32),
    "attention.value_length": ("scalar", VT.UINT32),
    "attention.layer_norm_rms_epsilon": ("scalar", VT.FLOAT32),
    "attention.causal": ("scalar", VT.BOOL),
    "attention.recurrent_layers": ("array", (VT.BOOL,), "block_count"),
    "rope.dimension_count": ("scalar", VT.UINT32),
    "rope.freq_base": ("scalar", VT.FLOAT32),
    "rope.dimension_sections": ("array", _INT_ARR, 4),
    "rope.scaling.type": ("scalar", VT.STRING),
    "rope.scaling.factor": ("scalar", VT.FLOAT32),
    "ssm.conv_kernel": ("scalar", VT.UINT32),
    "ssm.state_size": ("scalar", VT.UINT32),
    "ssm.group_count": ("scalar", VT.UINT32),
    "ssm.time_step_rank": ("scalar", VT.UINT32),
    "ssm.inner_size": ("scalar", VT.UINT32),
    "full_attention_interval": ("scalar", VT.UINT32),
    "expert_count": ("scalar", VT.UINT32),
    "expert_used_count": ("scalar", VT.UINT32),
}

_GLOBAL_RULES: dict[str, tuple] = {
    "general.architecture": ("scalar", VT.STRING),
    "general.alignment": ("scalar", VT.UINT32),
    "general.file_type": ("scalar", VT.UINT32),
    "tokenizer.ggml.model": ("scalar", VT.STRING),
    "tokenizer.ggml.pre": ("scalar", VT.STRING),
    "tokenizer.ggml.tokens": ("array", (VT.STRING,), None),
    "tokenizer.ggml.merges": ("array", (VT.STRING,), None),
    "tokenizer.ggml.token_type": ("array", (VT.INT32,), "tokens"),
    "tokenizer.ggml.scores": ("array", (VT.FLOAT32,), "tokens"),
    "tokenizer.ggml.bos_token_id": ("scalar", VT.UINT32),
    "tokenizer.ggml.eos_token_id": ("scalar", VT.UINT32),
    "tokenizer.ggml.padding_token_id": ("scalar", VT.UINT32),
    "tokenizer.ggml.unknown_token_id": ("scalar", VT.UINT32),
    "tokenizer.ggml.add_bos_token": ("scalar", VT.BOOL),
    "tokenizer.ggml.add_eos_token": ("scalar", VT.BOOL),
    "tokenizer.chat_template": ("scalar", VT.STRING),
}


def _tname(t: VT | None) -> str:
    return t.name if t is not None else "?"


def check_metadata_types(values: Mapping[str, Any], types: Mapping[str, VT],
                         array_types: Mapping[str, VT], fname: str) -> None:
    """Exact type rules for the keys llama.cpp reads. Files of another architecture are only
    checked for the generic (general.*, tokenizer.*) rules."""
    arch = values.get("general.architecture")
    rules = dict(_GLOBAL_RULES)
    if arch == QWEN35:   # other archs (e.g. the qwen2 vocab fixture) are read for their tokenizer only
        rules.update({f"{arch}.{k}": r for k, r in _ARCH_RULES.items()})
    block_count = values.get(f"{arch}.block_count")
    for key, rule in rules.items():
        if key not in types:
            continue
        vt, et = types[key], array_types.get(key)
        have = f"ARRAY[{_tname(et)}]" if vt == VT.ARRAY else vt.name
        kind = rule[0]
        if kind == "scalar":
            if vt != rule[1]:
                raise GGUFError(f"{fname}: metadata key '{key}' has type {have}, expected {rule[1].name}")
            continue
        if kind == "scalar_or_array":
            if vt == rule[1]:
                continue
            if vt == VT.ARRAY and et in rule[2]:
                length_rule: Any = "block_count"
            else:
                raise GGUFError(f"{fname}: metadata key '{key}' has type {have}, expected "
                                f"{rule[1].name} or a per-layer array")
        else:
            if vt != VT.ARRAY or et not in rule[1]:
                want = " or ".join(f"ARRAY[{t.name}]" for t in rule[1])
                raise GGUFError(f"{fname}: metadata key '{key}' has type {have}, expected {want}")
            length_rule = rule[2]
        n = len(values[key])
        if length_rule == "block_count" and isinstance(block_count, int) and n != block_count:
            raise GGUFError(f"{fname}: metadata key '{key}' has {n} entries, expected block_count="
                            f"{block_count}")
        if length_rule == "tokens":
            nt = len(values.get("tokenizer.ggml.tokens", ()))
            if n != nt:
                raise GGUFError(f"{fname}: metadata key '{key}' has {n} entries, expected one per "
                                f"token ({nt})")
        if isinstance(length_rule, int) and n != length_rule:
            raise GGUFError(f"{fname}: metadata key '{key}' has {n} entries, expected exactly "
                            f"{length_rule}")
