"""Host rows read by the device GEMV beside the CPU (tightfit.model.pcie_rows, issue 5): the
switch, the row arithmetic, the page spans registered, and a placed executor whose step splits
every host suffix between the two readers, against the reference model (the outside oracle) and
with the plan's exact cover kept. CPU: the "device" part runs the executor's CPU GEMV path on a
view of the same mapping; the registered-pages path is in the device tests (test_segments' CUDA
tests run with the default share) and bench/zero_copy.py."""
from __future__ import annotations

import os

import _interp

_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from _placed import close, small_q8, split_plan  # noqa: E402

from tightfit.errors import UserError  # noqa: E402
from tightfit.model import pcie_rows as P  # noqa: E402
from tightfit.plan.rowsplit import SPLIT_ROW_QUANTUM  # noqa: E402

CTX = 32


@pytest.mark.parametrize("v,want", [("", P.DEFAULT_SHARE), ("0", 0.0), ("off", 0.0),
                                    ("0.25", 0.25), (" 0.9 ", 0.9)])
def test_share_from_env(monkeypatch, v, want):
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", v)
    assert P.share_from_env() == want


@pytest.mark.parametrize("v", ["half", "1", "-0.1", "nan"])
def test_share_from_env_refuses(monkeypatch, v):
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", v)
    with pytest.raises(ValueError, match="TIGHTFIT_PCIE_ROWS"):
        P.share_from_env()


def test_pcie_rows_whole_quanta():
    assert P.pcie_rows(1000, 0.4, 64) == 384          # 400 rows -> 6 groups of 64
    assert P.pcie_rows(100, 0.5, 64) == 0             # less than one group: the CPU keeps all
    assert P.pcie_rows(8704, 0.0, 64) == 0
    assert P.pcie_rows(128, 0.9, 64) == 64


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 40000)), max_size=12))
def test_page_spans_cover_each_page_once(raw):
    ranges = [(a, a + n) for a, n in raw]
    spans = P.page_spans(ranges)
    for a, b in spans:
        assert a % 4096 == 0 and b % 4096 == 0 and b > a
    for (_, b0), (a1, _) in zip(spans, spans[1:]):
        assert b0 < a1                                 # sorted, disjoint, not even touching
    for a, b in ranges:
        if b > a:
            assert any(s <= a and b <= e for s, e in spans), (a, b, spans)
    # nothing registered beyond the pages the ranges touch
    touched = {p for a, b in ranges if b > a for p in range(a // 4096, (b - 1) // 4096 + 1)}
    assert sum((b - a) // 4096 for a, b in spans) == len(touched)


def test_refused_registration_warns_and_keeps_the_cpu():
    def refuse(ranges):
        raise OSError("cudaErrorHostMemoryAlreadyRegistered")
    with pytest.warns(RuntimeWarning, match="host rows stay on the CPU.*AlreadyRegistered"):
        assert P.register_or_warn([(0, 4096)], make=refuse) is None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    yield from small_q8(tmp_path_factory, "pcie", seed=9)


def _host_rows(inv) -> dict:
    rows = {}
    for il in range(4):
        for k in ("ffn_gate", "ffn_up", "ffn_down", "attn_qkv", "attn_q"):
            t = inv.tensors.get(f"blk.{il}.{k}.weight")
            if t is not None:
                rows[t.name] = t.n_rows // SPLIT_ROW_QUANTUM // 2 * SPLIT_ROW_QUANTUM
    rows["blk.2.ffn_up.weight"] = inv.tensors["blk.2.ffn_up.weight"].n_rows    # all on the host
    return rows


def _plan(path):
    return split_plan(path, CTX, _host_rows)


def _exe(mf, plan):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=CTX, plan=plan, use_triton=False,
                                    progress=False)


def _cover(exe) -> int:
    """Every host row read by exactly one of the two readers; returns the PCIe rows."""
    n = 0
    for name, H in exe.hostw.items():
        C = exe.hostc[name]
        L = exe.pcie.get(name)
        assert C.row_end == H.row_end
        if L is None:
            assert C.row_start == H.row_start
            continue
        assert L.row_start == H.row_start and L.row_start + L.n_out == C.row_start
        assert L.n_out % SPLIT_ROW_QUANTUM == 0 and C.n_rows + L.n_out == H.n_rows
        # the device reads the mapping's own bytes (no copy): same memory as the host suffix
        assert np.shares_memory(L.raw.numpy(), H.w)
        assert L.raw.numel() == L.n_out * H.w.shape[1]
        n += L.n_out
    return n


def test_step_splits_host_rows_between_readers(small, monkeypatch):
    path, mf, ref = small
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", "0.5")
    exe = _exe(mf, _plan(path))
    assert exe.pcie_share == 0.5 and "blk.2.ffn_up.weight" in exe.pcie
    assert _cover(exe) > 0
    assert exe.host_cpu_bytes + sum(L.nbytes for L in exe.pcie.values()) == exe.host_weight_bytes
    calls = []
    for L in exe.pcie.values():           # count the device part's products in the step
        f = L.ref
        L.ref = lambda x, o, _f=f, _n=L.name: (calls.append(_n), _f(x, o))[1]
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, ref.config.n_vocab, 5).tolist()
    gs, rs = exe.new_state(CTX), ref.new_state(CTX)
    close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    assert calls == []                    # batched forwards: the CPU has the whole suffix
    for tok in rng.integers(0, ref.config.n_vocab, 3).tolist():
        close(exe.forward([tok], gs, logits="last"), ref.forward([tok], rs, logits="last"))
    assert set(calls) == set(exe.pcie) and len(calls) == 3 * len(exe.pcie)

    exe.set_pcie_share(0.0)               # the CPU reads every host row again
    assert exe.pcie == {} and exe.pcie_share == 0.0 and _cover(exe) == 0
    assert all(exe.hostc[n] is exe.hostw[n] for n in exe.hostw)
    assert exe.host_cpu_bytes == exe.host_weight_bytes
    tok = 7
    close(exe.forward([tok], gs, logits="last"), ref.forward([tok], rs, logits="last"))


def test_off_by_default_on_the_cpu_and_bad_share_refused(small, monkeypatch):
    path, mf, _ = small
    monkeypatch.delenv("TIGHTFIT_PCIE_ROWS", raising=False)
    assert _exe(mf, _plan(path)).pcie == {}     # CUDA only unless asked for
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", "lots")
    with pytest.raises(UserError, match="TIGHTFIT_PCIE_ROWS"):
        _exe(mf, _plan(path))


cuda = pytest.mark.skipif(not __import__("torch").cuda.is_available() or
                          os.environ.get("TRITON_INTERPRET") == "1",
                          reason="needs CUDA (and compiled kernels)")


@cuda
def test_cuda_registered_rows_read_in_place(small, monkeypatch):
    """On the device: the PCIe rows are the mapping's own pages, registered (no VRAM, no copy),
    and the step with them matches the same executor with the CPU reading every host row and the
    reference (int8 activations on both readers: bench/device_tests.py's bounds)."""
    import torch
    from tightfit.model.executor import GPUModel
    path, mf, ref = small
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", "0.5")
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=CTX, plan=_plan(path), progress=False)
    assert exe.pcie and _cover_cuda(exe) > 0
    assert exe._pcie_reg.nbytes >= sum(L.nbytes for L in exe.pcie.values())
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", "0")
    cpu_only = GPUModel.from_model_file(mf, device="cuda", n_ctx=CTX, plan=_plan(path),
                                        progress=False)
    assert not cpu_only.pcie
    sts = [m.new_state(CTX) for m in (exe, cpu_only)]
    rs = ref.new_state(CTX)
    prompt = [3, 4, 5, 6]
    for m, st in zip((exe, cpu_only), sts):
        m.forward(prompt, st, logits="last")
    ref.forward(prompt, rs, logits="last")
    for tok in (9, 10, 11):
        outs = []
        with torch.no_grad():
            for m, st in zip((exe, cpu_only), sts):
                m.step_token(tok, st, head=True)
                torch.cuda.synchronize()
                outs.append(m.logits.clone())
        want = ref.forward([tok], rs, logits="last")
        close(outs[0], outs[1], 2e-2)
        close(outs[0], want, 5e-2)
    assert ("host-segments", "single", True, False) in sts[0].graphs
    exe.placed.close()                     # unregisters before the mapping goes
    assert exe._pcie_reg.spans == []


def _cover_cuda(exe) -> int:
    n = 0
    for name, L in exe.pcie.items():
        H, C = exe.hostw[name], exe.hostc[name]
        assert L.raw.is_cuda and L.row_start == H.row_start
        assert L.row_start + L.n_out == C.row_start and C.row_end == H.row_end
        # UVA: the device reads the host rows at their own address
        assert L.raw.data_ptr() == int(H.w.ctypes.data)
        n += L.n_out
    return n
