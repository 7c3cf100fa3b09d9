"""Arena + upload on the CPU with a generated tiny qwen35 GGUF: every GPU row in the arena equals
the file's bytes as gguf-py's reader sees them; host rows are computed in place from the mmap."""
from __future__ import annotations

import mmap

import numpy as np
import pytest
import gguf
from gguf.constants import GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G
from tightfit.model.config import TINY
from tightfit.plan.arena import Arena, upload
from tightfit.plan.budget import PlanOptions, plan_model
from tightfit.plan.placement import inventory_from_gguf

ADD = {"UINT32": "add_uint32", "FLOAT32": "add_float32", "STRING": "add_string"}


def write_tiny(path, seed=0):
    """TINY geometry with an MTP block, Q8_0 / Q4_0 matrices with random bytes, F32 vectors."""
    from dataclasses import replace
    cfg = replace(TINY, nextn_layers=1)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen35")
    for key, (val, kind) in cfg.to_metadata().items():
        if key == "general.architecture":
            continue
        if kind.startswith("ARRAY"):
            w.add_array(key, val)
        else:
            getattr(w, ADD[kind])(key, val)
    for i, (name, ne) in enumerate(cfg.tensor_shapes(include_mtp=True).items()):
        if cfg.is_vector_tensor(name):
            w.add_tensor(name, rng.standard_normal(tuple(reversed(ne))).astype(np.float32))
            continue
        qt = T.Q8_0 if i % 2 else T.Q4_0
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (ne[1], ne[0] // bs * ts), dtype=np.uint8)
        raw.reshape(ne[1], -1, ts)[:, :, 0:2] = rng.uniform(0.01, 0.1, (ne[1], ne[0] // bs, 1)).astype(
            np.float16).view(np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny(path)
    return path


def test_inventory_matches_gguf_reader(tiny):
    inv = inventory_from_gguf(tiny)
    r = gguf.GGUFReader(str(tiny))
    assert len(r.tensors) == len(inv.tensors)
    for t in r.tensors:
        s = inv.tensors[t.name]
        assert (s.nbytes, s.offset, int(s.qtype)) == (int(t.n_bytes), int(t.data_offset), int(t.tensor_type))
    assert inv.config.n_layer == TINY.n_layer and inv.config.nextn_layers == 1


@pytest.mark.parametrize("squeeze", [False, True])
def test_upload_bytes_equal_file(tiny, squeeze):
    inv = inventory_from_gguf(tiny)
    full = plan_model(inv, PlanOptions(ctx=128, available=1 << 30, reserve=0, host_embd="no",
                                       prefill_chunk=32))
    avail = full.total_bytes
    if squeeze:   # force the embedding to the host and a few output-row splits
        avail -= inv.tensors["token_embd.weight"].nbytes + 12_000
    plan = plan_model(inv, PlanOptions(ctx=128, available=avail, reserve=0, prefill_chunk=32))
    assert plan.fits
    if squeeze:
        assert plan.host_embd and len(plan.placement.split_tensors()) > 1
    arena = Arena(plan, "cpu")
    assert arena.buffer.numel() == plan.arena_bytes
    rep = upload(inv, plan.placement, arena, progress=False, slot_bytes=4096)
    assert rep.bytes == plan.line("weights").bytes
    assert rep.released_bytes >= rep.bytes // 2
    r = gguf.GGUFReader(str(tiny))
    on_gpu = {s.tensor for s in plan.placement.gpu_segments()}
    for t in r.tensors:
        if t.name.startswith("blk.8."):
            assert t.name not in plan.placement.segments       # MTP excluded
            continue
        filebytes = np.asarray(t.data).view(np.uint8).reshape(-1)
        if t.name in on_gpu:
            s = arena.segment(t.name)
            got = arena.weight(t.name).numpy()
            assert np.array_equal(got, filebytes[s.byte_start:s.byte_end]), t.name
    # regions are disjoint and inside the one buffer
    lay = plan.layout()
    for (n0, o0, b0), (n1, o1, b1) in zip(lay, lay[1:]):
        assert o0 + b0 <= o1
    assert lay[-1][1] + lay[-1][2] <= arena.nbytes
    assert arena.region("kv_cache").numel() == 128 * TINY.kv_bytes_per_token()


def test_split_matrix_prefix_plus_host_suffix_is_the_full_gemv(tiny):
    inv = inventory_from_gguf(tiny)
    full = plan_model(inv, PlanOptions(ctx=64, available=1 << 30, reserve=0, prefill_chunk=32))
    for deficit in (1_000, 10_000, 30_000, 60_000, 100_000):
        plan = plan_model(inv, PlanOptions(ctx=64, available=full.total_bytes - deficit, reserve=0,
                                           prefill_chunk=32, host_embd="no"))
        split = [n for n in plan.placement.split_tensors()
                 if len(plan.placement.segments[n]) == 2]
        if plan.fits and split:
            break
    assert split, "expected at least one matrix with a GPU prefix and a host suffix"
    arena = Arena(plan, "cpu")
    upload(inv, plan.placement, arena, progress=False)
    r = {t.name: t for t in gguf.GGUFReader(str(tiny)).tensors}
    with open(tiny, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for name in split:
            t = inv.tensors[name]
            gpu, host = plan.placement.segments[name]
            x = np.random.default_rng(1).standard_normal(t.ne[0]).astype(np.float32)
            top = G.gemv(arena.weight(name, t.row_bytes).numpy(), t.qtype, x)
            bottom = G.gemv(G.as_rows(mm, t.row_bytes, host.row_end - host.row_start,
                                      t.offset + host.byte_start), t.qtype, x)
            W = gguf.quants.dequantize(r[name].data, r[name].tensor_type).astype(np.float64)
            want = W.reshape(t.n_rows, t.ne[0]) @ x
            np.testing.assert_allclose(np.concatenate([top, bottom]), want, rtol=1e-4, atol=1e-4)
            del bottom


def test_preset_cannot_upload():
    from tightfit.errors import UserError
    from tightfit.plan.placement import inventory_from_preset
    inv = inventory_from_preset("tiny")
    plan = plan_model(inv, PlanOptions(ctx=16, available=1 << 30, reserve=0, prefill_chunk=16))
    with pytest.raises(UserError):
        upload(inv, plan.placement, Arena(plan, "cpu"), progress=False)


def test_host_embedding_rows_decoded_on_cpu(tiny):
    from tightfit.plan.arena import embed_tokens, open_readonly
    inv = inventory_from_gguf(tiny)
    t = inv.tensors["token_embd.weight"]
    r = {x.name: x for x in gguf.GGUFReader(str(tiny)).tensors}["token_embd.weight"]
    table = gguf.quants.dequantize(r.data, r.tensor_type).reshape(t.n_rows, t.ne[0])
    mm = open_readonly(tiny)
    try:
        got = embed_tokens(mm, t, [5, 999, 0])
        np.testing.assert_allclose(got, table[[5, 999, 0]], rtol=1e-6, atol=1e-7)
    finally:
        del got
        mm.close()
