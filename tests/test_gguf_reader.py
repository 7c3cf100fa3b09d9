"""GGUFFile against files written by gguf-py's GGUFWriter and offsets reported by gguf-py's own
GGUFReader (outside oracles); strict validation against hand-made corruptions whose expected
rejections come from llama.cpp's gguf.cpp rules (spec/quant-formats.md §4.1, traps §8)."""
from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT

from conftest import shared_path
from tightfit.errors import GGUFError, UserError
from tightfit.gguf import GGUFFile, read_header_only

Q = gguf.GGMLQuantizationType

SCALARS = [  # key, value, type
    ("t.u8", 200, VT.UINT8), ("t.i8", -100, VT.INT8), ("t.u16", 60000, VT.UINT16),
    ("t.i16", -30000, VT.INT16), ("t.u32", 4_000_000_000, VT.UINT32), ("t.i32", -2_000_000_000, VT.INT32),
    ("t.f32", 1.25e-6, VT.FLOAT32), ("t.u64", 2**63 + 5, VT.UINT64), ("t.i64", -(2**62), VT.INT64),
    ("t.f64", 3.141592653589793, VT.FLOAT64), ("t.bool", True, VT.BOOL),
    ("t.str", "héllo ✓ 中文", VT.STRING),
]
ARRAYS = [
    ("t.arr_i32", [1, -2, 3, 2**31 - 1], VT.INT32), ("t.arr_u8", [0, 255, 7], VT.UINT8),
    ("t.arr_f32", [0.5, -1.5, 2.0], VT.FLOAT32), ("t.arr_bool", [True, False, True], VT.BOOL),
    ("t.arr_u64", [2**64 - 1, 0], VT.UINT64), ("t.arr_str", ["a", "", "ü ✓", "x y z"], VT.STRING),
]


def _tensors(rng):
    """name -> (array passed to GGUFWriter, raw_dtype or None, expected ne)."""
    return {
        "f32.weight": (rng.standard_normal((3, 5)).astype(np.float32), None, (5, 3)),
        "f16.weight": (rng.standard_normal((2, 4, 8)).astype(np.float16), None, (8, 4, 2)),
        "q8.weight": (rng.integers(0, 256, (3, 2 * 34), dtype=np.uint8), Q.Q8_0, (64, 3)),
        "q4k.weight": (rng.integers(0, 256, (2, 144), dtype=np.uint8), Q.Q4_K, (256, 2)),
        "i32.weight": (rng.integers(-9, 9, (7,), dtype=np.int32), None, (7,)),
        "bf16.weight": (rng.integers(0, 256, (2, 6), dtype=np.uint8), Q.BF16, (3, 2)),
    }


def write_sample(path: Path, alignment: int | None = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="sample")
    if alignment:
        w.add_custom_alignment(alignment)
    for k, v, t in SCALARS:
        w.add_key_value(k, v, t)
    for k, v, t in ARRAYS:
        w.add_key_value(k, v, VT.ARRAY, sub_type=t)
    tensors = _tensors(rng)
    for name, (arr, raw, _) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    p = tmp_path_factory.mktemp("sample") / "sample.gguf"
    return p, write_sample(p)


def test_metadata_values_and_types(sample):
    path, _ = sample
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == 64
        assert f.metadata["general.architecture"] == "sample"
        for k, v, t in SCALARS:
            assert f.metadata_types[k] == t, k
            if t == VT.FLOAT32:
                assert f.metadata[k] == float(np.float32(v))
            else:
                assert f.metadata[k] == v, k
        for k, v, t in ARRAYS:
            assert f.metadata_types[k] == VT.ARRAY and f.array_types[k] == t, k
            assert f.metadata[k] == v, k
        np.testing.assert_array_equal(f.array("t.arr_i32"), np.array([1, -2, 3, 2**31 - 1]))
        with pytest.raises(GGUFError, match="t.arr_str"):
            f.array("t.arr_str")


def test_metadata_matches_gguf_py_contents(sample):
    path, _ = sample
    oracle = gguf.GGUFReader(str(path))
    with GGUFFile(path) as f:
        keys = [k for k in oracle.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == keys
        for k in keys:
            assert f.metadata[k] == oracle.fields[k].contents(), k


def test_tensor_offsets_shapes_bytes(sample):
    path, written = sample
    oracle = gguf.GGUFReader(str(path))
    with GGUFFile(path) as f:
        assert list(f.tensors) == [t.name for t in oracle.tensors] == list(written)
        for ot in oracle.tensors:
            t = f.tensors[ot.name]
            arr, _, ne = written[ot.name]
            assert t.ne == ne == tuple(int(x) for x in ot.shape)
            assert t.qtype == int(ot.tensor_type)
            assert t.offset == ot.data_offset and t.offset % 64 == 0
            assert t.nbytes == ot.n_bytes == arr.nbytes
            assert t.n_elements == ot.n_elements
            raw = t.raw()
            assert raw.dtype == np.uint8 and raw.shape == (arr.nbytes,)
            assert not raw.flags.writeable
            assert raw.tobytes() == arr.tobytes()
            assert t.numpy_shape == tuple(reversed(ne))
            rows = t.rows()
            assert rows.shape == (t.n_elements // ne[0], arr.nbytes // (t.n_elements // ne[0]))
            assert rows.tobytes() == np.ascontiguousarray(ot.data).view(np.uint8).tobytes()
        np.testing.assert_array_equal(f.tensors["f32.weight"].array(), written["f32.weight"][0])
        np.testing.assert_array_equal(f.tensors["f16.weight"].array(), written["f16.weight"][0])
        assert f.tensors["q4k.weight"].type_name == "Q4_K"
        with pytest.raises(GGUFError, match="q8.weight"):
            f.tensors["q8.weight"].array()


def test_default_alignment(tmp_path):
    p = tmp_path / "a32.gguf"
    write_sample(p, alignment=None)
    oracle = gguf.GGUFReader(str(p))
    with GGUFFile(p) as f:
        assert f.alignment == 32
        assert [t.offset for t in f] == [t.data_offset for t in oracle.tensors]


def test_header_only_and_close(sample):
    path, _ = sample
    h = read_header_only(path)
    assert h.metadata["t.str"] == "héllo ✓ 中文" and len(h.tensors) == 6
    with pytest.raises(GGUFError, match="f32.weight"):
        h.tensors["f32.weight"].raw()
    f = GGUFFile(path)
    f.close()
    assert f.closed


def test_vocab_fixture_facts_and_speed():
    """Facts spec/qwen35.md §5.1 states about llama.cpp's qwen35 vocab fixture. (gguf-py's own
    reader needs ~10-20 s for this file, so full equality is checked on the written 248k vocab.)"""
    p = shared_path("fixtures/ggml-vocab-qwen35.gguf")
    t0 = time.process_time()   # CPU time: robust to other jobs on the CI cores
    f = GGUFFile(p)
    dt = time.process_time() - t0
    md = f.metadata
    assert md["general.architecture"] == "qwen2"
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen35"
    toks, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert len(toks) == len(types) == 151936
    assert len(md["tokenizer.ggml.merges"]) == 151387
    assert toks[151643:151646] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert types.count(1) == 151643 and types.count(3) == 3 and types.count(4) == 290
    assert md["tokenizer.ggml.eos_token_id"] == md["tokenizer.ggml.bos_token_id"] == 151643
    assert md["tokenizer.ggml.padding_token_id"] == 151643
    assert "You are a helpful assistant" in md["tokenizer.chat_template"]
    assert f.array_types["tokenizer.ggml.token_type"] == VT.INT32
    assert dt < 2.0, f"opening a 150k-token vocabulary took {dt:.2f} s"


def test_248k_vocabulary_loads_quickly(tmp_path):
    p = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(p), arch="qwen35")
    toks = [f"Ġtok{i}" for i in range(248320)]
    merges = [f"Ġt ok{i}" for i in range(247587)]
    w.add_token_list(toks)
    w.add_token_merges(merges)
    w.add_token_types([1] * 248320)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t0 = time.process_time()   # CPU time: robust to other jobs on the CI cores
    f = GGUFFile(p)
    dt = time.process_time() - t0
    assert f.metadata["tokenizer.ggml.tokens"] == toks
    assert f.metadata["tokenizer.ggml.merges"] == merges
    assert f.array("tokenizer.ggml.token_type").shape == (248320,)
    assert dt < 2.0, f"opening a 248k-token vocabulary took {dt:.2f} s"


# ---- corruptions -------------------------------------------------------------------------------
def tensor_part_offsets(path: Path, name: str) -> dict[str, int]:
    """File offsets of a tensor-info record's fields, located by gguf-py's reader."""
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    off, out = t.field.offset, {}
    for label, part in zip(("name_len", "name", "n_dims", "dims", "type", "offset"), t.field.parts):
        out[label] = off
        off += part.nbytes
    return out


def kv_value_offset(path: Path, key: str) -> int:
    r = gguf.GGUFReader(str(path))
    f = r.fields[key]
    return f.offset + sum(p.nbytes for p in f.parts[:3])


def patch(path: Path, offset: int, fmt: str, *values) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(struct.pack(fmt, *values))


@pytest.fixture
def victim(tmp_path):
    p = tmp_path / "victim.gguf"
    write_sample(p)
    return p


def expect(path: Path, *fragments: str) -> str:
    with pytest.raises(GGUFError) as ei:
        GGUFFile(path)
    msg = str(ei.value)
    assert isinstance(ei.value, UserError)
    assert path.name in msg and "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


def test_bad_magic_version_endianness(victim):
    patch(victim, 0, "<4s", b"GGML")
    expect(victim, "not a GGUF file")
    patch(victim, 0, "<4s", b"GGUF")
    patch(victim, 4, "<I", 1)
    expect(victim, "version 1")
    patch(victim, 4, ">I", 3)
    expect(victim, "big-endian")


def test_missing_and_short_files(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    expect(tmp_path / "empty.gguf", "not a GGUF file")


def test_truncated_tensor_data(victim):
    data = victim.read_bytes()
    victim.write_bytes(data[:-100])
    expect(victim, "bf16.weight", "past the end")


def test_huge_counts_rejected_before_parsing(victim):
    patch(victim, 8, "<Q", 2**63)
    expect(victim, "tensor count")
    write_sample(victim)
    patch(victim, 16, "<Q", 2**64 - 1)
    expect(victim, "metadata key count")


def test_huge_string_and_array_lengths(victim):
    off = kv_value_offset(victim, "t.str")
    patch(victim, off, "<Q", 2**62)
    expect(victim, "t.str", "past the end")
    write_sample(victim)
    off = kv_value_offset(victim, "t.arr_str")        # u32 elem type, u64 count
    patch(victim, off + 4, "<Q", 2**40)
    expect(victim, "t.arr_str")
    write_sample(victim)
    off = kv_value_offset(victim, "t.arr_i32")
    patch(victim, off + 4, "<Q", 2**61)
    expect(victim, "t.arr_i32", "past the end")


def test_misaligned_and_out_of_file_offsets(victim):
    o = tensor_part_offsets(victim, "q8.weight")
    r = gguf.GGUFReader(str(victim))
    rel = next(t.data_offset for t in r.tensors if t.name == "q8.weight") - r.data_offset
    patch(victim, o["offset"], "<Q", rel + 1)
    expect(victim, "q8.weight", "alignment 64")
    patch(victim, o["offset"], "<Q", 2**63)
    expect(victim, "q8.weight", "past")


def test_overlapping_tensors(victim):
    o = tensor_part_offsets(victim, "f16.weight")
    patch(victim, o["offset"], "<Q", 0)             # same start as f32.weight
    expect(victim, "overlaps", "f32.weight")


def test_duplicate_tensor_name(victim):
    o = tensor_part_offsets(victim, "i32.weight")     # same length as "f32.weight"
    patch(victim, o["name"], "<10s", b"f32.weight")
    expect(victim, "duplicate tensor 'f32.weight'")


def test_type_ids(victim):
    o = tensor_part_offsets(victim, "q8.weight")
    patch(victim, o["type"], "<I", 4)
    expect(victim, "q8.weight", "retired", "Q4_2")
    patch(victim, o["type"], "<I", 99)
    expect(victim, "q8.weight", "unknown type id 99")
    patch(victim, o["type"], "<I", int(Q.Q4_K))       # ne0 = 64 is not a multiple of 256
    expect(victim, "q8.weight", "not a multiple of the block size 256")


def test_bad_dims(victim):
    o = tensor_part_offsets(victim, "f32.weight")
    patch(victim, o["n_dims"], "<I", 5)
    expect(victim, "f32.weight", "5 dimensions")
    write_sample(victim)
    patch(victim, o["dims"], "<Q", 0)
    expect(victim, "f32.weight", "invalid dimension 0")
    patch(victim, o["dims"], "<Q", 2**63 + 1)
    expect(victim, "f32.weight", "invalid dimension")
    write_sample(victim)
    patch(victim, o["dims"], "<QQ", 2**40, 2**40)
    expect(victim, "f32.weight", "too many elements")


def test_long_tensor_name(tmp_path):
    p = tmp_path / "long.gguf"
    w = gguf.GGUFWriter(str(p), arch="x")
    w.add_tensor("n" * 64, np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect(p, "name of tensor #0", "64 bytes")


def test_bad_alignment(victim):
    off = kv_value_offset(victim, "general.alignment")
    patch(victim, off, "<I", 48)
    expect(victim, "general.alignment 48")


def test_invalid_utf8_key(victim):
    r = gguf.GGUFReader(str(victim))
    f = r.fields["t.str"]
    patch(victim, f.offset + 8, "<B", 0xFF)          # first byte of the key name
    expect(victim, "UTF-8")


# ---- llama.cpp's exact metadata types for qwen35 (traps §3, §8) --------------------------------
def _qwen35(make_qwen35, **kw):
    return make_qwen35(**kw)


@pytest.mark.parametrize("key,spec,fragments", [
    ("qwen35.block_count", (8, "INT32"), ("qwen35.block_count", "INT32", "expected UINT32")),
    ("qwen35.attention.layer_norm_rms_epsilon", (1e-6, "FLOAT64"),
     ("layer_norm_rms_epsilon", "FLOAT64", "expected FLOAT32")),
    ("qwen35.rope.dimension_sections", ([2, 1, 1], "ARRAY_INT32"),
     ("rope.dimension_sections", "3 entries", "exactly 4")),
    ("qwen35.rope.dimension_sections", ([2.0, 1.0, 1.0, 0.0], "ARRAY_FLOAT32"),
     ("rope.dimension_sections", "ARRAY[FLOAT32]")),
    ("qwen35.attention.recurrent_layers", ([True] * 7, "ARRAY_BOOL"),
     ("recurrent_layers", "7 entries", "block_count=8")),
    ("qwen35.feed_forward_length", ([96] * 8, "ARRAY_UINT32"), None),   # per-layer array is legal
    ("qwen35.feed_forward_length", ("96", "STRING"), ("feed_forward_length", "STRING")),
    ("tokenizer.ggml.eos_token_id", (3, "INT32"), ("eos_token_id", "INT32", "expected UINT32")),
])
def test_metadata_key_types(make_qwen35, key, spec, fragments):
    p = make_qwen35(meta_override={key: spec})
    if fragments is None:
        GGUFFile(p).close()
    else:
        expect(p, *fragments)


def test_other_arch_keys_not_checked_as_qwen35(tmp_path):
    """A qwen2 file (like the vocab fixture) may store keys with other types than qwen35 wants."""
    p = tmp_path / "q2.gguf"
    w = gguf.GGUFWriter(str(p), arch="qwen2")
    w.add_key_value("qwen2.block_count", 3, VT.INT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFFile(p).metadata["qwen2.block_count"] == 3


def test_q2_0_type_newer_than_gguf_py(victim):
    """Q2_0 (id 42: 64 elements in 18 bytes, spec/quant-formats.md §1) is absent from gguf 0.19's
    enum; the reader sizes it from tightfit.quant's table. q8.weight has ne (64, 3): 3 blocks."""
    quant = pytest.importorskip("tightfit.quant")
    if 42 not in quant.TRAITS:
        pytest.skip("tightfit.quant does not know Q2_0")
    o = tensor_part_offsets(victim, "q8.weight")
    patch(victim, o["type"], "<I", 42)
    with GGUFFile(victim) as f:
        t = f.tensors["q8.weight"]
        assert t.qtype == 42 and t.type_name == "Q2_0"
        assert t.nbytes == 3 * 18 and t.rows().shape == (3, 18)
