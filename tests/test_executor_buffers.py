"""Every device allocation of the placed GPU executor lives in the plan (issue 5 + issue 7).

The executor is built on the CPU device path (torch fallbacks). The outside oracle is counting:
the bytes of the tensors the executor and its state actually hold (tensor.nbytes), compared with
the plan's lines and with the same figures derived by hand from the geometry (for the 27B: 65,536
B of FP16 KV per token and 3,268,608 B of recurrent state per GDN layer per bank)."""
from __future__ import annotations

import dataclasses

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.model.config import QWEN35_27B  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.plan.budget import PlanOptions, plan_model  # noqa: E402
from tightfit.plan.placement import inventory_from_gguf, inventory_from_preset  # noqa: E402

CTX = 40


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("bufs") / "small-q8.gguf"
    make_model(p, preset="small", layers=4, qtype="Q8_0", mtp=True, seed=3)
    mf = open_model(p)
    yield p, mf
    mf.close()


def _tensors(obj, seen=None, depth=0):
    """Every torch tensor reachable from obj's attributes (lists, tuples, dicts, dataclasses,
    slotted objects), with a path for the messages."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield "", obj
        return
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__slots__"):
        items = [(k, getattr(obj, k, None)) for k in obj.__slots__]
    else:
        return
    for k, v in items:
        for path, t in _tensors(v, seen, depth + 1):
            yield f"{k}.{path}" if path else str(k), t


# the executor's attributes that are not device memory: the model file and its mmap, the host
# rows (numpy views of the mmap), the placement glue (holds the arena itself), the batched forward
HOST_SIDE = {"_tensors", "_embd_info", "placed", "hostw", "_pinned", "_io", "_batch", "config"}


def _in(t: torch.Tensor, buf: torch.Tensor, region: tuple[int, int] | None = None) -> bool:
    lo = buf.data_ptr() + (region[0] if region else 0)
    hi = lo + (region[1] if region else buf.numel())
    return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi


@pytest.mark.parametrize("kv_type", ["f16", "tq3"])
def test_every_allocation_is_a_plan_line(small, kv_type):
    from tightfit.model.executor import GPUModel
    path, mf = small
    c = mf.config
    inv = inventory_from_gguf(path)
    plan = plan_model(inv, PlanOptions(ctx=CTX, available=1 << 34, kv_type=kv_type, reserve=0,
                                       prefill_chunk=16, host_embd="no"))
    exe = GPUModel.from_model_file(mf, device="cpu", plan=plan, use_triton=False, progress=False)
    st = exe.new_state(CTX)
    arena = exe.placed.arena
    buf = arena.buffer
    assert buf.numel() == plan.arena_bytes                       # ONE allocation, the plan's size

    # (1) nothing the executor or the state holds lies outside that allocation
    held = [(f"exe.{k}.{p}".rstrip("."), t) for k, v in vars(exe).items() if k not in HOST_SIDE
            for p, t in _tensors(v)]
    held += [(f"state.{k}", t) for k, t in vars(st).items() if isinstance(t, torch.Tensor)]
    assert len(held) > 50
    outside = [name for name, t in held if not _in(t, buf)]
    assert not outside, outside

    # (2) per category, the bytes held equal the plan's line and the hand-derived figure
    L = plan.line
    n_attn, n_rec = len(c.attention_ids), len(c.recurrent_ids)
    kv_row = 2 * c.head_dim if kv_type == "f16" else c.head_dim // 32 * 14       # tq3: 14 B / 32
    assert st.k.nbytes + st.v.nbytes == L("kv_cache").bytes == CTX * n_attn * 2 * c.n_head_kv * kv_row
    rec = (c.ssm_conv_kernel - 1) * c.conv_dim + c.ssm_v_heads * c.ssm_state * c.ssm_state
    assert st.conv.nbytes + st.ssm.nbytes == L("recurrent_state").bytes == 2 * n_rec * rec * 4
    for bank in (0, 1):
        region = arena.regions[f"recurrent_state.bank{bank}"]
        assert region[1] == n_rec * rec * 4
    ws = exe.buffers()
    assert sum(t.nbytes for t in ws.values()) == L("workspace").bytes == exe.workspace_bytes()
    wreg = arena.regions["workspace"]
    assert all(_in(t, buf, wreg) for t in ws.values())
    H, D, E, V = c.n_head, c.head_dim, c.n_embd, c.n_vocab
    assert ws["logits"].nbytes == V * 4 and ws["x"].nbytes == E * 4
    assert ws["cos"].nbytes == ws["sin"].nbytes == CTX * (c.n_rot // 2) * 4
    assert ws["attn_acc"].nbytes == H * -(-CTX // 512) * D * 4
    assert ws["tok_id"].nbytes == 8 and ws["status"].nbytes == 16
    assert st.status.data_ptr() == ws["status"].data_ptr()
    # the step's buffers ARE the named workspace buffers
    for name in ("x", "xn", "logits", "cos", "sin", "tok_id", "ids_ring", "h", "ao"):
        assert getattr(exe, name).data_ptr() == ws[name].data_ptr(), name
    for t in (exe.ws if kv_type == "f16" else (exe.ws.m, exe.ws.l, exe.ws.acc, exe.ws.R,
                                                 exe.kvw.k, exe.kvw.v, exe.kvw.R)):
        assert _in(t, buf, wreg)
    # weights: the matrices' device rows + the F32 vectors + the table = the weights line, which
    # is the exact byte count of the file's non-MTP tensors
    mats = sum(l.nbytes for k, l in exe.lin.items() if not (k == "output.weight"
                                                             and "output.weight" not in inv.tensors))
    vecs = sum(v.nbytes for n, v in exe.vec.items() if "vec:" + n not in ws)
    emb = inv.tensors["token_embd.weight"].nbytes
    assert mats + vecs + emb == L("weights").bytes == sum(
        t.nbytes for n, t in inv.tensors.items() if not n.startswith(f"blk.{c.n_layer}."))
    # the arena = the lines (their alignment padding included); the reserve is not allocated and
    # the scratch line is torch's (the batched forward), beside the arena
    assert plan.total_bytes - L("reserve").bytes - L("scratch").bytes == plan.arena_bytes
    assert "scratch" not in {n for n, _o, _b in plan.layout()}


def test_27b_plan_arithmetic():
    """The 27B seed mix: the plan's lines from the geometry alone (no executor: 15 GB)."""
    inv = inventory_from_preset("qwen3.8-27b-seedmix")
    p = plan_model(inv, PlanOptions(ctx=8192, available=64 << 30, host_embd="no"))
    assert p.line("kv_cache").details["bytes_per_token"] == 65_536
    assert p.line("kv_cache").bytes == 512 << 20
    r = p.line("recurrent_state")
    assert r.details["bytes_per_layer"] == 3_268_608 and r.details["bytes_per_bank"] == 156_893_184
    assert [n for n, _o, b in p.layout() if n.startswith("recurrent")] == \
        ["recurrent_state.bank0", "recurrent_state.bank1"]
    assert all(b == 156_893_184 for n, _o, b in p.layout() if n.startswith("recurrent"))
    b = p.line("workspace").details["buffers"]
    E, V, H, D = 5120, 248_320, 24, 256
    assert b["logits"] == V * 4 and b["x"] == E * 4 and b["g"] == 17_408 * 4
    assert b["cos"] == 8192 * 32 * 4                 # n_rot 64: 32 angle pairs per position
    assert b["attn_acc"] == H * 16 * D * 4 and b["attn_m"] == H * 16 * 4     # 8192 / 512 chunks
    # the seed mix's quantized FFN reads int8 copies of its inputs (q + fp32 scale per 32)
    assert any(k.startswith("act_h_") for k in b) and any(k.startswith("act_xn_") for k in b)
    assert p.line("workspace").bytes == sum(b.values())
    q = plan_model(inv, PlanOptions(ctx=8192, available=64 << 30, host_embd="no", kv_type="tq3"))
    bq = q.line("workspace").details["buffers"]
    assert bq["kvq_R"] == D * D * 4 and bq["kvq_q_rot"] == H * D * 4
    assert q.line("kv_cache").bytes == 8192 * 16 * 2 * (1024 // 32 * 14)
