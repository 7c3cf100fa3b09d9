"""TRAITS against outside sources: gguf-py's GGML_QUANT_SIZES, the type table of
spec/quant-formats.md §1, llama.cpp's C type traits, and sizes the specs state for whole tensors."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import gguf
import pytest

from tightfit.errors import GGUFError
from tightfit.quant import Q2_0, QTYPES_BY_NAME, TRAITS, row_bytes, tensor_bytes, traits
from tightfit.quant.traits import GGML_TRAITS as TRAITS  # ggml types only: the oracles know no others  # noqa: E402,F811

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
SPEC = SHARED / "spec" / "quant-formats.md"

EXPECTED_NAMES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                  "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                  "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "Q2_0"}


def test_table_covers_the_required_types():
    assert set(QTYPES_BY_NAME) == EXPECTED_NAMES
    assert Q2_0 == 42 and QTYPES_BY_NAME["Q2_0"] == 42


def test_traits_match_gguf_py_sizes():
    checked = 0
    for tid, t in TRAITS.items():
        try:
            qt = gguf.GGMLQuantizationType(tid)
        except ValueError:
            assert t.name == "Q2_0"          # the only id gguf 0.19 lacks
            continue
        assert qt.name == t.name
        assert gguf.GGML_QUANT_SIZES[qt] == (t.block_size, t.type_size), t.name
        checked += 1
    assert checked >= 26


def test_traits_match_spec_table():
    if not SHARED.is_dir():
        pytest.skip(f"shared folder {SHARED} absent: spec table not available")
    rows = {}
    for line in SPEC.read_text().splitlines():
        m = re.match(r"\|\s*([A-Z0-9_]+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|"
                     r"\s*\**(\d+)\**\s*\|", line)
        if m and m.group(1) not in rows:      # later tables reuse the names; §1 is first
            rows[m.group(1)] = tuple(float(v) for v in m.groups()[1:])
    assert len(rows) >= 30, "spec §1 table not found"
    for t in TRAITS.values():
        tid, bs, ts, bpw, align = rows[t.name]
        assert (t.type_id, t.block_size, t.type_size, t.align) == (tid, bs, ts, align), t.name
        assert t.bits_per_weight == pytest.approx(bpw, abs=1e-4), t.name


def _ggml_base():
    try:
        import llama_cpp
    except ImportError:
        return None
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    return ctypes.CDLL(str(path)) if path.exists() else None


class _CTraits(ctypes.Structure):   # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


@pytest.mark.llama
def test_traits_match_llama_cpp_c_traits():
    lib = _ggml_base()
    if lib is None:
        pytest.skip("llama-cpp-python (libggml-base.so) not installed")
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_CTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    for tid, t in TRAITS.items():
        c = lib.ggml_get_type_traits(tid).contents
        assert c.type_name.decode().upper() == t.name
        assert (c.blck_size, c.type_size) == (t.block_size, t.type_size), t.name


def test_gguf_dequant_flag():
    # gguf 0.19 dequantizes every type here except Q1_0 and Q2_0; a newer gguf may add more.
    flagged = {t.name for t in TRAITS.values() if t.gguf_dequant}
    assert EXPECTED_NAMES - {"Q1_0", "Q2_0"} <= flagged
    assert not TRAITS[Q2_0].gguf_dequant


def test_lookup_by_enum_int_and_name():
    assert traits(gguf.GGMLQuantizationType.Q4_K) is traits(12) is traits("q4_k") is traits("Q4_K")
    assert TRAITS[gguf.GGMLQuantizationType.IQ4_XS].name == "IQ4_XS"
    assert traits("Q2_0").type_id == 42


@pytest.mark.parametrize("bad", [4, 5, 31, 33, 36, 38, 9, 15, 24, 40, 43, 999, -1, "Q4_2", "q9_9",
                                 3.0, None])
def test_unknown_or_retired_types_raise(bad):
    with pytest.raises(GGUFError):
        traits(bad)


def test_retired_message_names_the_type():
    with pytest.raises(GGUFError, match="Q4_0_4_4"):
        traits(31)


def test_row_and_tensor_bytes_spec_examples():
    # spec §4.1 worked sizes
    assert row_bytes("Q4_K", 5120) == 2880
    assert row_bytes("Q6_K", 17408) == 14280
    assert tensor_bytes("Q4_K", (5120, 17408)) == 50_135_040       # "50.1 MB"
    assert tensor_bytes("Q6_K", (17408, 5120)) == 73_113_600       # "73.1 MB"
    # bench/seed-mix.md: Q3_K embedding, blk.13 FFN (3 Q3_K), blk.0+12 ffn_gate (IQ2_XS)
    assert tensor_bytes("Q3_K", (5120, 248320)) == 546_304_000
    assert 3 * tensor_bytes("Q3_K", (5120, 17408)) == 114_892_800
    assert 2 * tensor_bytes("IQ2_XS", (5120, 17408)) == 51_527_680
    assert row_bytes("Q2_0", 128) == 36 and row_bytes("Q1_0", 128) == 18
    assert row_bytes("F32", 7) == 28 and tensor_bytes("F32", (5,)) == 20
    assert tensor_bytes("F16", ()) == 2


@pytest.mark.parametrize("qtype,n", [("Q4_K", 100), ("Q8_0", 48), ("Q1_0", 64), ("Q2_0", 96),
                                     ("IQ4_NL", 16)])
def test_row_bytes_rejects_partial_blocks(qtype, n):
    with pytest.raises(GGUFError, match="multiple"):
        row_bytes(qtype, n)
    with pytest.raises(GGUFError):
        tensor_bytes(qtype, (n, 4))
