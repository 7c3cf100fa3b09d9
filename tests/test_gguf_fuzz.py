"""Hostile-input fuzzing of GGUFFile / open_model.

Valid files come from gguf-py's GGUFWriter; the positions of every length, count, dim, type and
offset field are located with gguf-py's GGUFReader (an outside parser), then hypothesis truncates,
flips bytes and overwrites those fields with huge/negative/odd values. Whatever happens, the only
allowed outcomes are success or GGUFError, within a time limit per example (no hang) and with a
bounded Python heap peak (no allocation sized by a hostile length).
"""
from __future__ import annotations

import signal
import struct
import tempfile
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import write_qwen35
from test_gguf_reader import write_sample
from tightfit.api import open_model
from tightfit.errors import GGUFError
from tightfit.gguf import GGUFFile

EXTREMES = [0, 1, 3, 4, 5, 8, 9, 31, 32, 33, 64, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
            2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
HEAP_LIMIT = 48 * 2**20     # the sample files are < 1 MiB; a hostile length must not cost more
TIME_LIMIT_S = 10


def field_map(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every integer field that steers parsing, found by gguf-py's reader."""
    r = gguf.GGUFReader(str(path))
    out = [(8, 8), (16, 8), (4, 4)]          # tensor count, kv count, version
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        out.append((f.offset, 8))            # key length
        out.append((f.offset + 8 + len(name.encode()), 4))   # value type
        vpos = f.offset + sum(p.nbytes for p in f.parts[:3])
        if f.types[0] == gguf.GGUFValueType.STRING:
            out.append((vpos, 8))
        elif f.types[0] == gguf.GGUFValueType.ARRAY:
            out += [(vpos, 4), (vpos + 4, 8)]
            if f.types[-1] == gguf.GGUFValueType.STRING and len(f.data) > 1:
                out.append((vpos + 12, 8))   # first element's length
    for t in r.tensors:
        off = t.field.offset
        for part in t.field.parts:
            if part.dtype.kind in "ui" and part.nbytes in (4, 8, 16, 24, 32):
                for k in range(0, part.nbytes, part.itemsize):
                    out.append((off + k, part.itemsize))
            off += part.nbytes
    return out


def mutations(size: int, fields: list[tuple[int, int]]):
    value = st.one_of(st.sampled_from(EXTREMES), st.integers(0, 2**64 - 1))
    overwrite = st.tuples(st.just("field"), st.sampled_from(fields), value)
    flip = st.tuples(st.just("flip"), st.integers(0, size - 1), st.integers(0, 255))
    trunc = st.tuples(st.just("trunc"), st.integers(0, size - 1), st.none())
    edits = st.lists(st.one_of(overwrite, overwrite, overwrite, flip), min_size=1, max_size=4)
    # at most one truncation, last, so that field overwrites still land inside the file
    return st.tuples(edits, st.one_of(st.none(), st.none(), trunc)).map(
        lambda et: et[0] + ([et[1]] if et[1] else []))


def apply(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for kind, where, val in muts:
        if kind == "trunc":
            del b[where:]
        elif kind == "flip":
            if where < len(b):
                b[where] = val
        else:
            off, size = where
            if off + size <= len(b):
                b[off:off + size] = struct.pack("<I" if size == 4 else "<Q", val % (1 << (8 * size)))
    return bytes(b)


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise Hang(f"parse took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_open(path: Path, opener) -> None:
    tracemalloc.start()
    try:
        with time_limit(TIME_LIMIT_S):
            try:
                obj = opener(path)
            except GGUFError as e:
                msg = str(e)
                assert "\n" not in msg and msg
                return
            # a file that passes must be internally consistent: every tensor's bytes readable
            g = obj if isinstance(obj, GGUFFile) else obj.gguf
            for t in g.tensors.values():
                assert t.raw().nbytes == t.nbytes
                assert t.offset + t.nbytes <= g.file_size
            g.close()
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < HEAP_LIMIT, f"parse peaked at {peak / 2**20:.1f} MiB of Python heap"
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@pytest.fixture(scope="module")
def sample_case(workdir):
    p = workdir / "base.gguf"
    write_sample(p)
    return p.read_bytes(), field_map(p)


@pytest.fixture(scope="module")
def model_case(workdir):
    p = workdir / "model-base.gguf"
    write_qwen35(p, matrix_type="Q8_0", mtp=True)
    return p.read_bytes(), field_map(p)


def test_field_map_finds_header_fields(sample_case):
    data, fields = sample_case
    assert len(fields) > 40 and all(o + s <= len(data) for o, s in fields)


_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(data=st.data())
def test_fuzz_reader_only_ggufError(data, sample_case, workdir):
    base, fields = sample_case
    muts = data.draw(mutations(len(base), fields))
    path = workdir / "fuzz.gguf"
    path.write_bytes(apply(base, muts))
    check_open(path, GGUFFile)


@settings(_SETTINGS, max_examples=80)
@given(data=st.data())
def test_fuzz_open_model_only_ggufError(data, model_case, workdir):
    base, fields = model_case
    # corrupt the header region only (data-region flips only change weights)
    muts = data.draw(mutations(len(base), fields))
    path = workdir / "fuzz-model.gguf"
    path.write_bytes(apply(base, muts))
    check_open(path, open_model)


def test_every_prefix_of_header_is_rejected_cleanly(sample_case, workdir):
    """Truncation at each of the first header bytes (deterministic, complements the fuzz)."""
    base, _ = sample_case
    path = workdir / "prefix.gguf"
    r_end = gguf.GGUFReader(str(workdir / "base.gguf")).data_offset
    for n in range(0, r_end, 7):
        path.write_bytes(base[:n])
        with pytest.raises(GGUFError):
            GGUFFile(path)
