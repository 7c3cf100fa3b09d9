"""The threaded upload (tightfit.plan.arena.upload) on a CPU arena, against a synthetic file of
random bytes with hundreds of segments of odd sizes, gaps of every kind (none, GGUF padding, more
than COALESCE_GAP, host suffixes in between), segments larger than a slot, and an arena laid out in
another order than the file. The oracle is the file read with plain open().read()."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from tightfit.errors import UserError
from tightfit.plan import arena as A
from tightfit.plan.arena import Arena, upload
from tightfit.plan.placement import GPU, build_placement, spec_for
from tightfit.plan.rowsplit import SPLIT_ROW_QUANTUM

MXFP4 = 39       # 17 B per 32 elements: rows of 17 x k bytes, odd sizes everywhere
B = 32
SENTINEL = 0xA5


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tightfit-upload")]


def synth(path, seed: int = 0, n: int = 300, big: int = 3 * 65536):
    """A file of random bytes and an inventory of `n` MXFP4 tensors laid in it, plus a placement
    (shuffled arena order, some host suffixes). Returns (model, plan)."""
    rng = np.random.default_rng(seed)
    specs, off = [], int(rng.integers(0, 5000))
    for i in range(n):
        r = rng.random()
        if r < 0.45:                                  # norms, biases: a few odd bytes
            ne = (B * int(rng.integers(1, 20)), 1)
        elif r < 0.85:                                # medium matrices, odd row lengths
            ne = (B * int(rng.integers(1, 7)), int(rng.integers(2, 400)))
        elif r < 0.95:                                # splittable matrices (>= 2 quanta of rows)
            ne = (B * int(rng.integers(1, 3)), SPLIT_ROW_QUANTUM * int(rng.integers(2, 6)))
        else:                                         # larger than a slot
            ne = (B * int(rng.integers(61, 71)), big // 1000 + int(rng.integers(0, 40)))
        specs.append(spec_for(f"t{i}", MXFP4, ne, off))
        g = rng.random()
        gap = 0 if g < 0.4 else int(rng.integers(1, 32)) if g < 0.8 else \
            int(rng.integers(1, 5000)) if g < 0.95 else int(rng.integers(70_000, 140_000))
        off += specs[-1].nbytes + gap
    size = off + int(rng.integers(0, 3000))
    path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    tensors = {t.name: t for t in specs}
    host = {}
    for t in specs:
        q = SPLIT_ROW_QUANTUM
        if t.n_rows % q == 0 and t.n_rows > q and rng.random() < 0.5:
            host[t.name] = SPLIT_ROW_QUANTUM * int(rng.integers(1, t.n_rows // SPLIT_ROW_QUANTUM))
    order = list(specs)
    rng.shuffle(order)                                # arena order != file order
    p = build_placement(order, host)
    assert any(s.nbytes > 65536 for s in p.gpu_segments()) and p.host_segments()
    wr = p.weights_region_bytes
    plan = SimpleNamespace(placement=p, arena_bytes=wr + 4096,
                           layout=lambda: [("weights", 0, wr), ("other", wr, 4096)])
    return SimpleNamespace(path=str(path), tensors=tensors), plan


def check_arena(model, plan, arena):
    data = open(model.path, "rb").read()
    got = arena.buffer.numpy()
    covered = np.zeros(arena.nbytes, dtype=bool)
    for s in plan.placement.gpu_segments():
        off = model.tensors[s.tensor].offset + s.byte_start
        want = np.frombuffer(data, np.uint8, s.nbytes, off)
        assert np.array_equal(got[s.arena_offset:s.arena_offset + s.nbytes], want), s.tensor
        covered[s.arena_offset:s.arena_offset + s.nbytes] = True
    assert (got[~covered] == SENTINEL).all(), "bytes written outside the GPU segments"


def new_arena(plan):
    a = Arena(plan, "cpu")
    a.buffer.fill_(SENTINEL)
    return a


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("upload") / "synth.bin")


@pytest.mark.parametrize("slot_bytes,slots,readers", [
    (65536, 5, 3), (4096, 2, 8), (65536, 1, 1), (1 << 20, 12, 8), (A.RING_SLOT_BYTES, 3, 2)])
def test_arena_equals_file(synth_file, slot_bytes, slots, readers):
    model, plan = synth_file
    arena = new_arena(plan)
    rep = upload(model, plan.placement, arena, progress=False, slot_bytes=slot_bytes, slots=slots,
                 readers=readers)
    check_arena(model, plan, arena)
    assert rep.bytes == plan.placement.gpu_bytes
    assert rep.segments == len(plan.placement.gpu_segments())
    assert rep.released_bytes > 0 and rep.seconds > 0
    assert not _threads()


def test_progress_bar_and_default_ring(synth_file):
    model, plan = synth_file
    arena = new_arena(plan)
    rep = upload(model, plan.placement, arena, progress=True)
    check_arena(model, plan, arena)
    assert rep.released_bytes >= rep.bytes // 2
    assert not _threads()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_layouts(tmp_path, seed):
    model, plan = synth(tmp_path / "s.bin", seed=seed, n=120)
    arena = new_arena(plan)
    upload(model, plan.placement, arena, progress=False, slot_bytes=8192 + 17 * seed, slots=4,
           readers=3)
    check_arena(model, plan, arena)


def test_nothing_on_the_device(synth_file):
    model, plan = synth_file
    specs = list(model.tensors.values())
    p = build_placement(specs, {t.name: t.n_rows for t in specs})
    assert not p.gpu_segments() and p.weights_region_bytes == 0
    rep = upload(model, p, new_arena(plan), progress=False)
    assert (rep.bytes, rep.segments, rep.released_bytes) == (0, 0, 0)
    assert not _threads()


def test_plan_chunks_cover_batch_and_split():
    sb = 1000
    ranges = [(0, 0, 10), (10, 256, 5), (15, 512, 0), (47, 768, 300),      # adjacent / padded
              (47 + 300 + 200_000, 2048, 2500),                              # far: new chunk, split
              (47 + 300 + 200_000 + 2500, 2048 + 2500, 7)]                   # contiguous in both
    chunks = A._plan_chunks(ranges, sb)
    assert chunks[0].lo == 0 and chunks[0].hi == 347 and len(chunks[0].pieces) == 3
    assert all(c.hi - c.lo <= sb for c in chunks)
    got = []
    for c in chunks:
        for so, ao, n in c.pieces:
            assert n > 0 and 0 <= so and so + n <= c.hi - c.lo
            got.append((c.lo + so, ao, n))
    # the pieces, merged back, are exactly the non-empty ranges
    merged: list[list[int]] = []
    for a, d, n in got:
        if merged and merged[-1][0] + merged[-1][2] == a and merged[-1][1] + merged[-1][2] == d:
            merged[-1][2] += n
        else:
            merged.append([a, d, n])
    want = [[a, d, n] for a, d, n in ranges if n]
    want[-2][2] += want[-1][2]
    del want[-1]
    assert merged == want
    assert sum(c.segments for c in chunks) == len(want) + 1
    # many tiny adjacent tensors cost one read
    tiny = [(i * 64, i * 256, 33) for i in range(200)]
    assert len(A._plan_chunks(tiny, 1 << 20)) == 1
    assert A._plan_chunks([], sb) == [] and A._plan_chunks([(5, 0, 0)], sb) == []


def test_tensor_past_eof_is_user_error(tmp_path):
    model, plan = synth(tmp_path / "t.bin", seed=4, n=80)
    last = max(plan.placement.gpu_segments(),
               key=lambda s: model.tensors[s.tensor].offset + s.byte_end)
    end = model.tensors[last.tensor].offset + last.byte_end
    os.truncate(model.path, end - 1)
    with pytest.raises(UserError, match="past the end"):
        upload(model, plan.placement, new_arena(plan), progress=False, slot_bytes=4096, slots=3)
    assert not _threads()


@pytest.mark.parametrize("fault", ["short", "eio"])
def test_reader_error_surfaces_without_hang(tmp_path, monkeypatch, fault):
    """The file shrinks (or the disk fails) after the size check: the reader thread's error is
    raised in the caller, and every upload thread is gone when upload returns."""
    model, plan = synth(tmp_path / "r.bin", seed=5, n=200)
    real = os.preadv
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(fd, bufs, off):
        with lock:
            calls["n"] += 1
            bad = calls["n"] > 6
        if not bad:
            return real(fd, bufs, off)
        if fault == "eio":
            raise OSError(5, "Input/output error")
        return 0
    monkeypatch.setattr(A.os, "preadv", flaky)
    with pytest.raises(UserError, match="ends at byte" if fault == "short" else "failed"):
        upload(model, plan.placement, new_arena(plan), progress=False, slot_bytes=4096, slots=4,
               readers=3)
    assert not _threads()


def test_error_in_copy_loop_stops_readers(synth_file, monkeypatch):
    """An exception on the caller's side (here: the progress bar) stops the readers too."""
    model, plan = synth_file

    class Boom(RuntimeError):
        pass
    real = A._progress_bar

    def bar(progress):
        p = real(False)
        p.update = lambda *a, **k: (_ for _ in ()).throw(Boom())
        return p
    monkeypatch.setattr(A, "_progress_bar", bar)
    with pytest.raises(Boom):
        upload(model, plan.placement, new_arena(plan), progress=False, slot_bytes=4096, slots=6,
               readers=4)
    assert not _threads()


def test_only_gpu_segments_and_exact_cover_first(synth_file):
    """A placement that fails the exact-cover check is refused before any read."""
    from dataclasses import replace

    from tightfit.plan.rowsplit import PlacementError
    model, plan = synth_file
    p = plan.placement
    name = next(n for n, segs in p.segments.items()
                if segs[0].where == GPU and segs[0].row_end - segs[0].row_start >= 2)
    bad = dict(p.segments)
    s = bad[name][0]
    rb = s.nbytes // (s.row_end - s.row_start)
    bad[name] = [replace(s, row_end=s.row_end - 1, byte_end=s.byte_end - rb)] + bad[name][1:]
    arena = new_arena(plan)
    with pytest.raises(PlacementError):
        upload(model, replace(p, segments=bad), arena, progress=False)
    assert not _threads()
    assert (arena.buffer.numpy() == SENTINEL).all()            # nothing was copied
