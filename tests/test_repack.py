"""`tightfit repack`: T3 base-3 repacking of ternary tensors.

Oracles: gguf-py writes the input files and reads/dequantizes the originals and the unpacked
copies (TQ2_0, TQ1_0, Q8_0, F32); Q2_0, which gguf-py 0.19 lacks, is read by tightfit's strict
GGUFFile and dequantized by tightfit.quant (checked against llama.cpp in test_quant_dequant.py).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT, GGUFReader, GGUFWriter  # noqa: E402
from gguf.quants import dequantize as gg_dequantize, quantize as gg_quantize  # noqa: E402

from tightfit.cli import main as cli_main  # noqa: E402
from tightfit.tools import gguf_rewrite as G  # noqa: E402
from tightfit.tools.repack import (KEY_PREFIX, T3_64, T3_128, T3_256, T3_TYPES, dequantize_t3,  # noqa: E402
                                   repack_file, t3_decode, t3_encode, unpack_file)


def _sha(p) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def _ternary_floats(rng, rows, cols, group):
    t = rng.integers(-1, 2, size=(rows, cols)).astype(np.float32)
    sc = np.exp(rng.standard_normal((rows, cols // group, 1))).astype(np.float32) * 0.02
    return (t.reshape(rows, -1, group) * sc).reshape(rows, cols)


@pytest.fixture(scope="module")
def tq_file(tmp_path_factory):
    """A GGUF written by gguf-py: ternary TQ2_0 tensors (one 3-D), a TQ2_0 tensor with a code 3,
    TQ1_0, Q8_0 and F32 tensors, and metadata of several value types."""
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("rp") / "tq.gguf"
    w = GGUFWriter(str(path), arch="qwen35")
    w.add_key_value("general.name", "repack-test", gguf.GGUFValueType.STRING)
    w.add_key_value("test.u32", 7, gguf.GGUFValueType.UINT32)
    w.add_key_value("test.f32arr", [1.5, -2.0], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    w.add_key_value("test.strarr", ["a", "b c", "中"], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    w.add_tensor("a.weight", gg_quantize(_ternary_floats(rng, 12, 512, 256), QT.TQ2_0), raw_dtype=QT.TQ2_0)
    w.add_tensor("v.weight", rng.standard_normal(40).astype(np.float32))
    w.add_tensor("b.weight", gg_quantize(_ternary_floats(rng, 3 * 5, 256, 256), QT.TQ2_0).reshape(3, 5, 66),
                 raw_dtype=QT.TQ2_0)
    bad = gg_quantize(_ternary_floats(rng, 4, 256, 256), QT.TQ2_0)
    bad[2, 5] |= 0b11 << 4                         # one code 3 (= +2 d): not ternary
    w.add_tensor("bad.weight", bad, raw_dtype=QT.TQ2_0)
    w.add_tensor("t1.weight", gg_quantize(_ternary_floats(rng, 4, 256, 256), QT.TQ1_0), raw_dtype=QT.TQ1_0)
    w.add_tensor("q8.weight", gg_quantize(rng.standard_normal((4, 64)).astype(np.float32), QT.Q8_0),
                 raw_dtype=QT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_t3_block_sizes_reach_the_byte_floor():
    """ceil(G*log2(3)/8 + 2) bytes is the floor for a whole-byte, self-contained block with an
    fp16 scale; 5 trits per byte reaches it for 64 and 128 and is one byte above for 256."""
    for t, extra in ((T3_64, 0), (T3_128, 0), (T3_256, 1)):
        floor = math.ceil((t.block_size * math.log2(3) + 16) / 8)
        assert t.type_size == floor + extra
    assert abs(8 / 5 / math.log2(3) - 1.0095) < 1e-4   # 1.6 bits per trit vs 1.585


def test_reader_agrees_with_gguf_py(tq_file):
    lay = G.read_gguf(tq_file)
    r = GGUFReader(str(tq_file))
    assert [t.name for t in lay.tensors] == [t.name for t in r.tensors]
    for mine, ref in zip(lay.tensors, r.tensors):
        assert mine.type_id == int(ref.tensor_type)
        assert lay.data_offset + mine.rel_offset == ref.data_offset
        assert mine.nbytes == ref.n_bytes
        assert np.array_equal(lay.raw(mine), np.asarray(ref.data).reshape(-1).view(np.uint8))
    assert lay.get("test.strarr") == ["a", "b c", "中"]
    assert list(lay.get("test.f32arr")) == [1.5, -2.0]


def test_repack_roundtrip_bit_identical(tq_file, tmp_path):
    rep_path, back = tmp_path / "t3.gguf", tmp_path / "back.gguf"
    rep = repack_file(str(tq_file), str(rep_path))
    assert set(rep.tensors) == {"a.weight", "b.weight"}
    assert "code 3" in rep.skipped["bad.weight"] and "5 trits" in rep.skipped["t1.weight"]
    orig = GGUFReader(str(tq_file))
    lay = G.read_gguf(rep_path)
    assert lay.get(KEY_PREFIX + "a.weight") == "TQ2_0" and lay.get(KEY_PREFIX + "version") == 1
    for t in lay.tensors:
        ref = next(x for x in orig.tensors if x.name == t.name)
        if t.name in rep.tensors:
            assert t.type_id == T3_256.type_id
            assert t.nbytes * 66 == ref.n_bytes * 54
            # dequantized repacked == gguf-py's dequantization of the original, bit for bit
            want = gg_dequantize(np.asarray(ref.data), QT.TQ2_0).reshape(-1)
            got = dequantize_t3(lay.raw(t), t.type_id)
            assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
        else:
            assert t.type_id == int(ref.tensor_type)
            assert np.array_equal(lay.raw(t), np.asarray(ref.data).reshape(-1).view(np.uint8))
    saved = sum(i - o for _, _, i, o in rep.tensors.values())
    assert saved == (12 * 2 + 15) * 12          # 12 bytes per TQ2_0 block
    unpack_file(str(rep_path), str(back))
    assert _sha(back) == _sha(tq_file)          # whole file, header and padding included


def _q2_0_file(path, rng, codes_hi=2):
    """A Q2_0 file (gguf-py cannot write id 42): blocks built from the spec's layout."""
    rows, cols = 6, 192
    n = rows * cols // 64
    codes = rng.integers(0, codes_hi + 1, size=(n, 64)).astype(np.uint8)
    d = (rng.standard_normal(n) * 0.05).astype("<f2")
    c = codes.reshape(n, 16, 4)
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    blocks = np.concatenate([d.view(np.uint8).reshape(n, 2), qs], axis=1)
    md = [G.KV("general.architecture", G.STRING, "qwen35"), G.KV("general.alignment", G.UINT32, 64)]
    ts = [G.OutTensor("w.weight", (cols, rows), 42, lambda: iter([blocks]))]
    G.write_gguf(path, md, ts, alignment=64)
    return path


def test_q2_0_roundtrip(tmp_path):
    from tightfit.gguf.reader import GGUFFile
    from tightfit.quant import dequantize
    src = _q2_0_file(tmp_path / "q2.gguf", np.random.default_rng(3))
    rep = repack_file(str(src), str(tmp_path / "t3.gguf"))
    assert rep.tensors["w.weight"][1:] == ("TF_T3_64", 18 * 18, 18 * 15)
    with GGUFFile(src) as f:
        want = dequantize(f.tensors["w.weight"].raw(), 42)
    lay = G.read_gguf(tmp_path / "t3.gguf")
    assert lay.alignment == 64
    got = dequantize_t3(lay.raw(lay.tensor("w.weight")), T3_64.type_id)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    unpack_file(str(tmp_path / "t3.gguf"), str(tmp_path / "back.gguf"))
    assert _sha(tmp_path / "back.gguf") == _sha(src)


def test_q2_0_with_plus_two_is_not_repacked(tmp_path):
    src = _q2_0_file(tmp_path / "q2.gguf", np.random.default_rng(4), codes_hi=3)
    rep = repack_file(str(src), str(tmp_path / "t3.gguf"))
    assert not rep.tensors and "not ternary" in rep.skipped["w.weight"]


def test_t3_codec_every_trit_pattern():
    """Every base-3 byte value decodes to its own digits (also the tail bytes of 1..4 trits)."""
    import itertools
    for t in T3_TYPES.values():
        pats = np.array(list(itertools.product(range(3), repeat=5)), dtype=np.uint8)   # 243
        codes = np.zeros((243, t.block_size), dtype=np.uint8)
        for k in range(5):
            codes[:, k * t.n_full:(k + 1) * t.n_full] = pats[:, k:k + 1]
        if t.n_tail:
            codes[:, 5 * t.n_full:] = pats[:, :t.n_tail]
        d = np.arange(243, dtype=np.uint16)
        blocks = t3_encode(codes, d, t)
        assert len(np.unique(blocks[:, 0])) == 243
        c2, d2 = t3_decode(blocks, t)
        assert np.array_equal(c2, codes) and np.array_equal(d2, d)


def test_model_file_repack_and_cli(tmp_path, capsys):
    from tightfit.model.generate import make_model
    src = tmp_path / "m.gguf"
    make_model(src, preset="small", qtype="TQ2_0", vocab="small:1000", layers=4)
    assert cli_main(["repack", str(src), str(tmp_path / "r.gguf")]) == 0
    out = capsys.readouterr().out
    r = GGUFReader(str(src))
    tq2 = [t for t in r.tensors if t.tensor_type == QT.TQ2_0]
    want_saved = sum(int(t.n_bytes) // 66 * 12 for t in tq2)
    lay = G.read_gguf(tmp_path / "r.gguf")
    assert sum(int(t.n_bytes) for t in r.tensors) - sum(t.nbytes for t in lay.tensors) == want_saved
    file_saved = (tmp_path / "m.gguf").stat().st_size - (tmp_path / "r.gguf").stat().st_size
    assert f"({file_saved} saved" in out
    assert want_saved - 4096 < file_saved < want_saved      # the header grows by the repack keys
    assert cli_main(["repack", "--unpack", str(tmp_path / "r.gguf"), str(tmp_path / "b.gguf")]) == 0
    assert _sha(tmp_path / "b.gguf") == _sha(src)
    # errors are one line, exit 1
    assert cli_main(["repack", str(tmp_path / "r.gguf"), str(tmp_path / "rr.gguf")]) == 1
    assert "already repacked" in capsys.readouterr().err
    assert cli_main(["repack", str(tmp_path / "missing.gguf"), str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "no such file" in err and err.count("\n") == 1
    assert cli_main(["repack", "--unpack", str(src), str(tmp_path / "x.gguf")]) == 1
    assert "not a repacked file" in capsys.readouterr().err


def test_27b_ternary_layout_savings():
    """Bytes of the proposed qwen3.8-27b-ternary preset, from block sizes (gguf-py's table for the
    ggml types) and the T3 rule ceil(G/5) + 2."""
    from gguf.constants import GGML_QUANT_SIZES
    from tightfit.model.config import QWEN35_27B
    from tightfit.tools.ternary_preset import preset_bytes, tensor_types
    types = tensor_types(QWEN35_27B)
    shapes = QWEN35_27B.tensor_shapes(include_mtp=True)
    n_tern = sum(math.prod(shapes[n]) for n, t in types.items() if t == "TQ2_0")
    bs, ts = GGML_QUANT_SIZES[QT.TQ2_0]
    tq2 = preset_bytes("TQ2_0")
    t3 = preset_bytes("TF_T3_256")
    assert tq2["TQ2_0"] == n_tern // bs * ts
    assert t3["TF_T3_256"] == n_tern // 256 * (math.ceil(256 / 5) + 2)
    assert t3["TF_T3_256"] == preset_bytes("TQ1_0")["TQ1_0"]       # same density as TQ1_0
    q2, t64 = preset_bytes("Q2_0")["Q2_0"], preset_bytes("TF_T3_64")["TF_T3_64"]
    assert q2 == n_tern // 64 * 18 and t64 == n_tern // 64 * 15


def test_repacked_file_runs_with_identical_logits(tmp_path):
    """A repacked file loads through the normal reader and gives the original's logits exactly
    (the original is decoded by gguf-py-equivalent TQ2_0 dequantization)."""
    import numpy as np

    import tightfit
    from tightfit.model.generate import make_model
    from tightfit.tools.repack import repack_file

    src, dst = tmp_path / "tq2.gguf", tmp_path / "tq2.t3.gguf"
    make_model(src, preset="small", seed=3, qtype="TQ2_0", vocab="small:1000")
    repack_file(str(src), str(dst))
    assert dst.stat().st_size < src.stat().st_size
    ids = [1, 2, 3, 4, 5]
    a = tightfit.load(src).logits(ids)
    b = tightfit.load(dst).logits(ids)
    assert np.array_equal(a, b)
