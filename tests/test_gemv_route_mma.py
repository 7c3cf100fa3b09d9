"""Routing of N-column products to the tensor-core kernel (gemv_route.mma_routed): on unless
TIGHTFIT_GEMV_MMA=0, only past the measured crossover, only for formats the kernel implements,
never for CPU tensors."""
from __future__ import annotations

import torch

from tightfit.kernels import gemv_mma
from tightfit.kernels import gemv_route as R
from tightfit.quant.traits import traits
from _fake_cuda import FakeCuda


def test_crossover_table_covers_only_implemented_formats():
    # GGML ids: Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14, IQ4_XS 23 (gguf's GGMLQuantizationType)
    import gguf
    names = {gguf.GGMLQuantizationType(t).name for t in R.MMA_MIN_N}
    assert names == {"Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
    for t, n in R.MMA_MIN_N.items():
        assert gemv_mma.supported(t), t
        assert 2 <= n <= 16
        assert traits(t).block_size in (32, 256)


def test_on_by_default_off_by_env_and_never_on_cpu(monkeypatch):
    """On by default again since session 11 (its split tiles are summed in a fixed order: two
    prefills of one prompt on the 27B are bitwise equal): the default and "1" route past the
    crossover; "0"/"off"/"" leave every product on gemv_cuda; CPU tensors and formats without a
    decoder never route, nor devices below sm_80."""
    w = torch.zeros(1024, dtype=torch.uint8)
    monkeypatch.delenv("TIGHTFIT_GEMV_MMA", raising=False)
    assert R._mma_on()
    monkeypatch.setattr(gemv_mma, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    assert R.mma_routed(12, 8, FakeCuda)        # the default: on
    for off in ("0", "off", ""):
        monkeypatch.setenv("TIGHTFIT_GEMV_MMA", off)
        assert not R._mma_on() and not R.mma_routed(12, 8, FakeCuda)
    monkeypatch.setenv("TIGHTFIT_GEMV_MMA", "1")
    assert R._mma_on()
    assert R.mma_routed(12, 8, FakeCuda)        # a CUDA Q4_K at N = 8
    assert not R.mma_routed(12, 8, w)            # CPU tensor
    assert not R.mma_routed(2, 16, FakeCuda)    # Q4_0: no tensor-core decoder
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: False)
    assert not R.mma_routed(12, 8, FakeCuda)    # below sm_80: no int8 mma.sync / cp.async


def test_below_crossover_not_routed(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_GEMV_MMA", "1")
    monkeypatch.delenv("TIGHTFIT_MMA_PIPE", raising=False)
    monkeypatch.setattr(gemv_mma, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    for t in R.MMA_MIN_N:
        n = R.mma_min_n(t)
        assert not R.mma_routed(t, n - 1, FakeCuda)
        assert R.mma_routed(t, n, FakeCuda)

    class Misaligned(FakeCuda):
        @staticmethod
        def data_ptr():
            return 4104
    assert not R.mma_routed(12, 8, Misaligned)


def test_shared_operand_checks_refuse_bad_buffers():
    """gemv_cuda and gemv_mma share check_shape / check_operands: each bad buffer gets its error."""
    import pytest
    from tightfit.kernels.gemv_cuda import check_operands, check_shape
    from tightfit.kernels.quantize_act import QuantAct
    n, k, n_out, t = 2, 512, 8, 12                  # Q4_K: 144 bytes per 256 weights
    rb = k // 256 * 144

    def act(q=None, d=None, s16=None):
        return QuantAct(torch.zeros(n, k, dtype=torch.int8) if q is None else q,
                        torch.zeros(n, k // 32) if d is None else d,
                        torch.zeros(n, k // 16, dtype=torch.int32) if s16 is None else s16, 0, n, k)
    w = torch.zeros(n_out * rb, dtype=torch.uint8)
    out = torch.zeros(n, n_out)
    with pytest.raises(ValueError, match="not on a CUDA device"):
        check_shape("X", t, act(), torch.device("cpu"))
    assert check_shape("X", t, act(), torch.device("cuda", 0)) == rb
    bad_k = QuantAct(torch.zeros(n, 288, dtype=torch.int8), torch.zeros(n, 9),
                     torch.zeros(n, 18, dtype=torch.int32), 0, n, 288)
    with pytest.raises(ValueError, match="not a multiple of the block size 256"):
        check_shape("X", t, bad_k, torch.device("cuda", 0))
    check_operands("X", act(), w, n_out, out, rb)   # well-formed: no error
    with pytest.raises(ValueError, match="X: weights must be contiguous uint8"):
        check_operands("X", act(), w[:-1], n_out, out, rb)
    with pytest.raises(ValueError, match="activation buffers"):
        check_operands("X", act(d=torch.zeros(n, k // 16)), w, n_out, out, rb)
    with pytest.raises(ValueError, match="out must be contiguous fp32"):
        check_operands("X", act(), w, n_out, out.double(), rb)


def test_q6_k_crossover_follows_the_pipelined_kernel(monkeypatch):
    """Q6_K routes from N = 5 while its products run on the pipelined kernel (the default), from
    N = 8 when TIGHTFIT_MMA_PIPE=0 leaves it on tf_mma_rt; the others keep their crossover."""
    monkeypatch.setattr(gemv_mma, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    monkeypatch.setenv("TIGHTFIT_GEMV_MMA", "1")
    monkeypatch.delenv("TIGHTFIT_MMA_PIPE", raising=False)
    assert gemv_mma.pipe_default(14) and not gemv_mma.pipe_default(23)
    assert R.mma_min_n(14) == 5 and R.mma_routed(14, 5, FakeCuda) and not R.mma_routed(14, 4, FakeCuda)
    monkeypatch.setenv("TIGHTFIT_MMA_PIPE", "0")
    assert R.mma_min_n(14) == 8 and not R.mma_routed(14, 5, FakeCuda)
    assert all(R.mma_min_n(t) == R.MMA_MIN_N[t] for t in R.MMA_MIN_N)


def test_grid_formats_route_from_five_columns_on_the_ring(monkeypatch):
    """IQ2_XS / IQ3_XXS / IQ3_S / IQ2_S: on gemv_mma from N = 5 (session 24, call 1), on the
    cp.async ring at one row tile; TIGHTFIT_MMA_GRID=0 keeps them on gemv_cuda; a type list in
    TIGHTFIT_MMA_PIPE picks the ring per type."""
    monkeypatch.setattr(gemv_mma, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    monkeypatch.setenv("TIGHTFIT_GEMV_MMA", "1")
    monkeypatch.delenv("TIGHTFIT_MMA_PIPE", raising=False)
    monkeypatch.delenv("TIGHTFIT_MMA_GRID", raising=False)
    monkeypatch.delenv("TIGHTFIT_MMA_RT", raising=False)
    for t in (17, 18, 21, 22):
        assert R.mma_routed(t, 5, FakeCuda) and R.mma_routed(t, 16, FakeCuda)
        assert not R.mma_routed(t, 4, FakeCuda) and not R.mma_routed(t, 1, FakeCuda)
        assert gemv_mma._pipe_choice(t, None) == (1, gemv_mma.DEFAULT_NST)
    monkeypatch.setenv("TIGHTFIT_MMA_GRID", "0")
    assert not any(R.mma_routed(t, 5, FakeCuda) for t in (17, 18, 21, 22))
    assert R.mma_routed(13, 5, FakeCuda)                 # the other formats are not affected
    monkeypatch.setenv("TIGHTFIT_MMA_PIPE", "18,22")
    assert gemv_mma._pipe_choice(18, None) and gemv_mma._pipe_choice(22, None)
    assert gemv_mma._pipe_choice(14, None) is None and gemv_mma._pipe_choice(17, None) is None


def test_small_matrices_cross_over_later(monkeypatch):
    """The size buckets (session 14, call 11: the tensor-core kernel's ~10 us fixed cost) only ever
    raise a type's crossover, raise it less as matrices grow, and leave the FFN-sized matrices and
    the output head on the old crossover; without a size the old table applies."""
    monkeypatch.setattr(gemv_mma, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    monkeypatch.setenv("TIGHTFIT_GEMV_MMA", "1")
    monkeypatch.delenv("TIGHTFIT_MMA_PIPE", raising=False)
    for t, buckets in R.MMA_MIN_N_BY_SIZE.items():
        base = R.mma_min_n(t)
        limits = [lim for lim, _ in buckets]
        assert limits == sorted(limits)
        prev = 17
        for lim, _ in buckets:
            m = R.mma_min_n(t, lim)
            assert base <= m <= prev, (t, lim)
            prev = m
        assert R.mma_min_n(t, 5120 * 17408) == base          # FFN matrices: unchanged
        assert R.mma_min_n(t, 5120 * 248320) == base         # output head
    # the 27B's small matrices at the verify block's N = 5 stay on gemv_cuda ...
    assert not R.mma_routed(13, 5, FakeCuda, 5120 * 1024)   # Q5_K attn_v
    assert not R.mma_routed(14, 5, FakeCuda, 5120 * 1024)   # Q6_K attn_k
    assert not R.mma_routed(23, 5, FakeCuda, 5120 * 6144)   # IQ4_XS attn_gate
    # ... where the tensor-core kernel measured faster they route
    assert R.mma_routed(13, 5, FakeCuda, 6144 * 5120)       # Q5_K ssm_out
    assert R.mma_routed(23, 5, FakeCuda, 5120 * 12288)      # IQ4_XS attn_q
    assert R.mma_routed(13, 3, FakeCuda, 17408 * 5120)      # Q5_K ffn_down
    assert R.mma_routed(23, 16, FakeCuda, 5120 * 1024)      # past 8 columns: always
    monkeypatch.setenv("TIGHTFIT_MMA_BY_SIZE", "0")               # A/B switch: the old table
    assert R.mma_routed(13, 5, FakeCuda, 5120 * 1024)
