"""TIGHTFIT_HOST_PROFILE=1 (issue 5): per-token wall-time breakdown of the placed decode step.
Run on the CPU with host rows (tightfit.model.placed.replace_host_rows), as in
tests/test_executor_placement.py: the buckets are filled, non-negative, and sum to the step's
wall time, which itself is within the time measured around step_token; profiling changes no
logit; with the flag off no profile object exists and cpu_gemv's sink stays unset."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

from tightfit.api import open_model  # noqa: E402
from tightfit.kernels import cpu_gemv  # noqa: E402
from tightfit.model import host_profile as HP  # noqa: E402
from tightfit.model import placed as P  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from _placed import ladder_rows, split_plan  # noqa: E402

CTX = 32


def _model(tmp_path_factory, qtype: str):
    p = tmp_path_factory.mktemp("hprof") / f"small-{qtype}.gguf"
    make_model(p, preset="small", layers=4, qtype=qtype, seed=4)
    return p


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K"])
def model(request, tmp_path_factory):
    """Q8_0: the per-matrix `gemv` path of Group.gemv; Q4_K: the grouped SIMD kernel where the
    host has one (else per-matrix too)."""
    p = _model(tmp_path_factory, request.param)
    mf = open_model(p)
    yield p, mf
    mf.close()


def _plan(path):
    """FFN splits (gate/up split, blk.1 down wholly on the host), an attention input matrix and
    the head split, the embedding on the host."""
    return split_plan(path, CTX, ladder_rows(("ffn_gate", "ffn_up", "attn_qkv", "attn_q")),
                      host_embd=True)


def _exe(mf, plan):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=CTX, plan=plan, use_triton=False,
                                    progress=False)


def test_profile_buckets(model, monkeypatch):
    path, mf = model
    plan = _plan(path)
    monkeypatch.setattr(P, "HOST_PROFILE", True)
    exe = _exe(mf, plan)
    prof = exe.host_profile
    assert isinstance(prof, P.HostProfile)
    st = exe.new_state(CTX)
    exe.forward([3, 4, 5], st, logits="last")           # batched prefill: not profiled
    assert prof.tokens == []
    outside = []
    logits = []
    with torch.no_grad():
        for tok in (7, 8, 9):
            t0 = time.perf_counter_ns()
            exe.step_token(tok, st, head=True)
            outside.append(time.perf_counter_ns() - t0)
            logits.append(exe.logits.clone())
    assert cpu_gemv._PROF is None                        # the sink is set only inside a step
    assert len(prof.tokens) == 3
    n_groups = len(exe._hgroups)
    assert n_groups >= 5
    for rec, wall_out in zip(prof.tokens, outside):
        b = rec["b"]
        assert set(b) == set(HP.BUCKETS)
        assert all(v >= 0 for v in b.values()), b
        assert sum(b[k] for k in HP.MEASURED) <= rec["wall"]
        assert sum(b.values()) == rec["wall"]
        assert rec["wall"] <= wall_out + 50_000          # + 50 us: the call itself
        for k in ("embed", "x_wait", "kernel", "gemv_other", "copy_back", "gpu_tail"):
            assert b[k] > 0, (k, b)
        assert b["replay"] == 0                          # eager step: no segment graphs
        assert len(rec["calls"]) == n_groups             # every host group once per token
        assert sum(c[1] for c in rec["calls"]) == exe.host_cpu_bytes
        assert all(c[2] > 0 and c[3] >= c[2] for c in rec["calls"])
        assert sum(c[2] for c in rec["calls"]) == b["kernel"]
    s = prof.summary()
    assert s["tokens"] == 3 and s["host_calls_per_token"] == n_groups
    assert s["host_bytes_per_token"] == exe.host_cpu_bytes
    assert s["kernel_only_GBps"] > 0
    assert abs(sum(s["buckets_pct"].values()) - 100) < 1e-6
    assert s["call_bytes"]["min"] <= s["call_bytes"]["median"] <= s["call_bytes"]["max"]
    assert s["call_kernel_GBps"]["min"] <= s["call_kernel_GBps"]["max"]
    assert sum(e["MB_per_token"] for e in s["by_kernel"].values()) * 1e6 == \
        pytest.approx(exe.host_cpu_bytes)
    if cpu_gemv.SIMD and mf.gguf.tensors["blk.0.ffn_up.weight"].qtype in cpu_gemv.SIMD:
        assert any(lab.startswith("group:") for lab in s["by_kernel"]), s["by_kernel"]
        assert s["buckets_ms"]["x_quant"] > 0
    else:
        assert all(lab.startswith("gemv:") for lab in s["by_kernel"]), s["by_kernel"]
    assert len(s["slowest_calls"]) == min(6, n_groups)
    text = P.HostProfile.table(s)
    assert "kernel-only GB/s" in text and "gpu_tail" in text
    prof.reset()
    assert prof.summary() == {"tokens": 0}

    # the same tokens without profiling give the same logits
    exe.host_profile = None
    st2 = exe.new_state(CTX)
    exe.forward([3, 4, 5], st2, logits="last")
    with torch.no_grad():
        for tok, want in zip((7, 8, 9), logits):
            exe.step_token(tok, st2, head=True)
            assert torch.equal(exe.logits, want)
    assert prof.tokens == []


def test_failed_step_clears_the_sink(model, monkeypatch):
    path, mf = model
    monkeypatch.setattr(P, "HOST_PROFILE", True)
    exe = _exe(mf, _plan(path))
    st = exe.new_state(CTX)

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(exe, "op_commit", boom)
    with pytest.raises(RuntimeError, match="boom"):
        exe.step_token(3, st, head=True)
    assert cpu_gemv._PROF is None and exe.host_profile.tokens == []


def test_off_no_profile_object(model, monkeypatch):
    path, mf = model
    monkeypatch.setattr(P, "HOST_PROFILE", False)
    exe = _exe(mf, _plan(path))
    assert exe.host_profile is None
    seen = []
    monkeypatch.setattr(P.HostProfile, "__init__", lambda self: seen.append(1))
    st = exe.new_state(CTX)
    with torch.no_grad():
        exe.step_token(3, st, head=True)
    assert not seen and cpu_gemv._PROF is None and exe.host_profile is None


def test_flag_read_from_env_at_import():
    code = "import tightfit.model.placed as p; print(p.HOST_PROFILE)"
    for val, want in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "TIGHTFIT_HOST_PROFILE": val}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip().splitlines()[-1] == want


def test_group_hooks_report_quant_and_kernel():
    """Group.gemv / gemv report through the sink only while one is set."""
    rng = np.random.default_rng(0)
    K = 256
    w = np.zeros((64, K // 32 * 34), np.uint8)          # Q8_0 rows, fp16 scale 0 except one
    w[:, 2:34] = rng.integers(0, 256, (64, 32), dtype=np.uint8)
    w[:, 0:2] = np.array([0x3C00], np.uint16).view(np.uint8)   # d = 1.0
    x = rng.standard_normal(K).astype(np.float32)
    G = cpu_gemv.Group([(w, cpu_gemv.Q8_0)])

    class Sink:
        def __init__(self):
            self.q, self.k = 0, []

        def gemv_quant(self, t0):
            self.q += 1
            return time.perf_counter_ns()

        def gemv_kernel(self, label, nbytes, t0):
            self.k.append((label, nbytes, time.perf_counter_ns() - t0))
            return time.perf_counter_ns()
    y0 = G.gemv(x)
    sink = Sink()
    cpu_gemv.set_profile(sink)
    try:
        y1 = G.gemv(x)
    finally:
        cpu_gemv.set_profile(None)
    np.testing.assert_array_equal(y0, y1)
    assert sink.k == [(("gemv", (cpu_gemv.Q8_0,)), w.nbytes, sink.k[0][2])] and sink.k[0][2] >= 0
    G.gemv(x)
    assert len(sink.k) == 1


def test_plan_vram_profile_helpers(model, monkeypatch, capsys):
    """bench/plan_vram.py's profiled decode, thread sweep and mmap/anonymous A/B on the CPU (the
    device run has one shot)."""
    import importlib.util
    import json
    from pathlib import Path
    path, mf = model
    spec = importlib.util.spec_from_file_location(
        "plan_vram", Path(__file__).resolve().parents[1] / "bench" / "plan_vram.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(P, "HOST_PROFILE", True)
    exe = _exe(mf, _plan(path))
    st = exe.new_state(CTX)

    class A:
        profile_tokens = 2
        profile_threads = "0,-1,1"
    pool = cpu_gemv.n_threads()
    with torch.no_grad():
        res = bench.host_profile_runs(exe, st, A)
    assert cpu_gemv.n_threads() == pool and exe.host_profile is None
    json.dumps(res)                                     # the child writes it as JSON
    assert [r["threads"] for r in res["runs"]] == list(dict.fromkeys(
        [pool, max(pool - 1, 1), 1] if pool > 1 else [1]))
    for r in res["runs"]:
        assert r["tokens"] == 2 and r["kernel_only_GBps"] > 0 and "table" in r
        assert r["rusage_per_token"]["minflt"] >= 0
    f = res["facts"]
    assert f["numba_threads"] >= 1 and f["torch_threads"] >= 1 and "env" in f
    assert "kernel-only GB/s" in capsys.readouterr().out
