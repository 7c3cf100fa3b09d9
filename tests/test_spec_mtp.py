"""The MTP head drafter. Its forward is checked against an independent float64 NumPy
implementation of the MTP graph (spec/gguf-synthetic-traps.md §5) on weights dequantized by
gguf-py (an outside reader); batched vs incremental pair processing must agree (the MTP KV
bookkeeping); and greedy speculation with the MTP drafter must emit exactly the plain greedy
tokens of the Engine."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tightfit.runtime.sampler import GREEDY
from _demo import demo_engine  # noqa: E402

N_CTX = 512


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    from tightfit.model.generate import make_model
    p = tmp_path_factory.mktemp("mtp") / "tiny-mtp-q8.gguf"
    make_model(p, preset="tiny", qtype="Q8_0", mtp=True, vocab="small:2048", seed=5)
    return p


@pytest.fixture(scope="module")
def engine(mtp_path):
    yield from demo_engine(N_CTX, mtp_path)


def _gguf_tensors(path):
    import gguf
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)]
                                                               if len(t.shape) > 1 else -1)
    return out


def _np_mtp(W, cfg, h, next_tokens):
    """Independent MTP graph in float64 over pairs at positions 0..n-1 (causal over the pairs)."""
    from tightfit.model.reference import imrope_pair_uses_position
    L, eps = cfg.n_layer, cfg.rms_eps
    p = f"blk.{L}."
    H, Hkv, D, E = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_embd

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    n = len(next_tokens)
    e = norm(W["token_embd.weight"][next_tokens], W[p + "nextn.enorm.weight"])
    x = np.concatenate([e, norm(h, W[p + "nextn.hnorm.weight"])], -1) @ W[p + "nextn.eh_proj.weight"].T
    a = norm(x, W[p + "attn_norm.weight"])
    qg = (a @ W[p + "attn_q.weight"].T).reshape(n, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(n, H * D)
    k = (a @ W[p + "attn_k.weight"].T).reshape(n, Hkv, D)
    v = (a @ W[p + "attn_v.weight"].T).reshape(n, Hkv, D)
    q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
    half = cfg.n_rot // 2
    mask = imrope_pair_uses_position(cfg.n_rot, cfg.rope_sections).numpy().astype(np.float64)
    theta = np.arange(n)[:, None] * cfg.rope_freq_base ** (-2.0 * np.arange(half) / cfg.n_rot) * mask

    def rope(t):
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        t1, t2 = t[..., :half], t[..., half:2 * half]
        return np.concatenate([t1 * c - t2 * s, t1 * s + t2 * c, t[..., 2 * half:]], -1)
    q, k = rope(q), rope(k)
    k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
    o = np.zeros((n, H, D))
    for hh in range(H):
        j = hh // (H // Hkv)
        sc = q[:, hh] @ k[:, j].T / np.sqrt(D)
        sc[np.triu_indices(n, 1)] = -np.inf
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o[:, hh] = pr @ v[:, j]
    o = o.reshape(n, H * D) / (1 + np.exp(-gate))
    x = x + o @ W[p + "attn_output.weight"].T
    f = norm(x, W[p + "post_attention_norm.weight"])
    g = f @ W[p + "ffn_gate.weight"].T
    x = x + ((g / (1 + np.exp(-g))) * (f @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return norm(x, W[p + "nextn.shared_head_norm.weight"]) @ W["output.weight"].T


def test_mtp_forward_matches_independent_numpy(engine, mtp_path):
    from tightfit.runtime.spec.mtp import MTPHead
    cfg = engine.config
    head = MTPHead.for_reference(engine.model, engine.file)
    g = np.random.default_rng(0)
    n = 6
    h = g.normal(size=(n, cfg.n_embd))
    toks = g.integers(0, cfg.n_vocab, n).tolist()
    want = _np_mtp(_gguf_tensors(mtp_path), cfg, h, toks)
    cache = head.new_cache(4)                         # also exercises growth of the KV
    got, _ = head.forward(torch.tensor(h, dtype=torch.float32), toks, cache, 0)
    scale = want.std()
    assert np.abs(got.numpy() - want).max() < 1e-3 * scale
    # the same pairs fed one at a time through the KV give the same rows
    cache2 = head.new_cache()
    rows = [head.forward(torch.tensor(h[i:i + 1], dtype=torch.float32), toks[i:i + 1], cache2, i)[0]
            for i in range(n)]
    np.testing.assert_allclose(torch.cat(rows).numpy(), got.numpy(), rtol=1e-4, atol=1e-4 * scale)


def test_greedy_with_mtp_drafter_identical_to_plain(engine):
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    se = SpeculativeEngine(engine, SpecConfig(drafters=("mtp", "ngram"), mtp_draft=3))
    assert se.mtp_head is not None
    for p in ([3, 1, 4, 1, 5, 9, 2, 6], [100, 200, 300, 100, 200, 300, 100, 200]):
        a = list(engine.generate(p, max_tokens=200, sampling=GREEDY))[-1]
        b = list(se.generate(p, max_tokens=200, sampling=GREEDY))[-1]
        assert b.tokens == a.tokens
    d = b.timings.as_dict()
    assert "mtp" in d["drafters"] and d["drafters"]["mtp"]["draft_n"] > 0


def test_mtp_observes_every_verified_position(engine):
    """After a generation the MTP KV holds one true entry per position since the prompt start,
    except the newest (its pair waits for the next token)."""
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    se = SpeculativeEngine(engine, SpecConfig(drafters=("mtp",), mtp_draft=2))
    drafters = {}
    orig = se._drafters

    def spy(sampler):
        drafters.update(orig(sampler))
        return drafters
    se._drafters = spy
    p = [9, 8, 7, 6, 5]
    last = list(se.generate(p, max_tokens=30, sampling=GREEDY))[-1]
    m = drafters["mtp"]
    assert m.n_true + len(m._pt) == len(p) + len(last.tokens) - 1


def _record_proposals(monkeypatch):
    """Every MTP draft as (target position of the draft's first token, tokens)."""
    from tightfit.runtime.spec.mtp import MTPDrafter
    log = []
    orig = MTPDrafter.propose

    def spy(self, max_k=None):
        pos = self.base + self.n_true + len(self._pt) + 1
        d = orig(self, max_k)
        log.append((pos, None if d is None else list(d.tokens)))
        return d
    monkeypatch.setattr(MTPDrafter, "propose", spy)
    return log


def _spec(engine):
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    return SpeculativeEngine(engine, SpecConfig(drafters=("mtp",), mtp_draft=3, adaptive=False))


def _direct(engine, ids, n, log):
    del log[:]
    last = list(_spec(engine).generate(list(ids), max_tokens=n, sampling=GREEDY))[-1]
    return last.tokens, list(log)


def test_mtp_through_session_sees_the_whole_context(engine, monkeypatch):
    """Issue 10: through a Session (prompt prefilled by the Session, turn 2 on the live state,
    turn 3 restored from a prompt-cache snapshot) the MTP drafter proposes exactly what it
    proposes in a direct generate of the same ids on a fresh state, i.e. its KV holds every
    earlier position, not only the tokens of the current request."""
    from tightfit.runtime.session import Session
    log = _record_proposals(monkeypatch)
    s = Session(_spec(engine))
    p1 = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    evs = list(s.generate(p1, max_tokens=10, sampling=GREEDY, checkpoints=[7]))
    g1 = evs[-1].tokens
    want1 = _direct(engine, p1, 10, log)
    del log[:]
    evs = list(s.generate(p1, max_tokens=10, sampling=GREEDY))   # same prompt: cache hit
    assert evs[-1].tokens == want1[0] and evs[-1].timings.cache_n == len(p1) - 1

    # turn 2 continues the live state (the previous request's prompt + output + new tokens)
    ids2 = p1 + g1 + [40, 41, 42, 43]
    del log[:]
    evs = list(s.generate(ids2, max_tokens=16, sampling=GREEDY))
    got2 = (evs[-1].tokens, list(log))
    assert evs[-1].timings.cache_n >= len(p1) + len(g1) - 1
    want2 = _direct(engine, ids2, 16, log)
    assert got2[0] == want2[0]
    assert len(want2[1]) > 3 and got2[1] == want2[1]

    # another sequence replaces the live state; then turn 3 of the first one restores a snapshot
    list(s.generate([5, 6, 7, 8, 9], max_tokens=4, sampling=GREEDY))
    ids3 = ids2 + evs[-1].tokens + [50, 51]
    del log[:]
    evs3 = list(s.generate(ids3, max_tokens=12, sampling=GREEDY))
    got3 = (evs3[-1].tokens, list(log))
    assert evs3[-1].timings.cache_n >= len(ids2)            # restored, not recomputed
    want3 = _direct(engine, ids3, 12, log)
    assert got3[0] == want3[0] and got3[1] == want3[1]

    # a prompt that shares only the prefix before the turn-1 checkpoint (restore at 7 tokens)
    ids4 = p1[:7] + [60, 61, 62]
    del log[:]
    evs4 = list(s.generate(ids4, max_tokens=8, sampling=GREEDY))
    assert evs4[-1].timings.cache_n == 7
    got4 = (evs4[-1].tokens, list(log))
    assert got4 == _direct(engine, ids4, 8, log)


def test_mtp_context_truncate_and_snapshot(engine):
    """The drafter's rollback: truncate(n) keeps the pairs of positions < n-1 and reopens the
    hidden row of n-1; a snapshot restores exactly that."""
    from tightfit.runtime.spec.mtp import MTPDrafter
    se = _spec(engine)
    m = MTPDrafter(se.mtp_head, 3)
    E = engine.config.n_embd
    h = torch.randn(6, E)
    m.feed(h[:4], [1, 2, 3, 4])
    assert m.n_pos == 4 and m.n_true + len(m._pt) == 3 and m.h_open is not None
    m.follow(9)
    m.observe(h[4:6], [5, 6])
    assert m.n_pos == 6 and m.h_open is None
    assert m.truncate(6) and m.n_pos == 6 and torch.equal(m.h_open, h[5:6])
    snap = m.snapshot()
    assert snap.n == 5 and m._pt == []
    m2 = MTPDrafter(se.mtp_head, 3)
    m2.restore(snap)
    assert m2.n_pos == 6 and torch.equal(m2.h_open, h[5:6])
    assert torch.equal(m2.cache.k[:5], m.cache.k[:5])
    assert not m.truncate(3) and m.n_pos == 0        # position 2's hidden row is gone: reset


@pytest.fixture(scope="module")
def gpu_engine(mtp_path):
    """The same MTP model on the GPU executor, run on the CPU (the tiny model's 64-wide rows have
    no CUDA GEMV; the 27B's head is measured on the device by bench/spec.py --forced-drafter mtp)."""
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mf = open_model(str(mtp_path))
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=N_CTX, use_triton=False)
    yield Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=N_CTX)
    torch.set_num_threads(threads)
    mf.close()


def test_gpu_model_head_matches_independent_numpy(gpu_engine, mtp_path):
    """MTPHead.on_gpu_model (the executor's LM head, the block in bf16) against the float64 NumPy
    graph, within bf16 weight rounding; nothing but the block and its vectors is added."""
    from tightfit.runtime.spec.mtp import MTPHead
    cfg = gpu_engine.config
    shapes = cfg.block_tensor_shapes(cfg.n_layer)
    head = MTPHead.on_gpu_model(gpu_engine.model, gpu_engine.file)
    mats = [n for n in shapes if len(shapes[n]) == 2]
    assert all(head.w[n].dtype == torch.bfloat16 for n in mats)
    assert "output.weight" not in head.w and "token_embd.weight" not in head.w   # no head copy
    assert head.device_bytes == sum(v.numel() * v.element_size() for v in head.w.values())
    err = head_error(head, cfg, mtp_path, seed=1)
    assert err < 3e-2, err


def head_error(head, cfg, path, seed: int, n: int = 5) -> float:
    """Max |head.forward - float64 NumPy graph| / std over n random pairs (fresh cache)."""
    g = np.random.default_rng(seed)
    h = g.normal(size=(n, cfg.n_embd))
    toks = g.integers(0, cfg.n_vocab, n).tolist()
    want = _np_mtp(_gguf_tensors(path), cfg, h, toks)
    got, _ = head.forward(torch.tensor(h, dtype=torch.float32), toks, head.new_cache(), 0)
    return float(np.abs(got.cpu().numpy() - want).max() / want.std())


def test_gpu_model_head_refuses_a_placed_model(gpu_engine):
    from tightfit.errors import UserError
    from tightfit.runtime.spec.mtp import MTPHead

    class Placed:                                        # what a placed executor looks like here
        placed = object()
        lin = gpu_engine.model.lin
        hostw = {"output.weight": object()}
    with pytest.raises(UserError, match="whole model on the GPU"):
        MTPHead.on_gpu_model(Placed(), gpu_engine.file)


def test_greedy_with_mtp_on_the_gpu_executor_identical_to_plain(gpu_engine):
    """Through the block verifier and MTPHead.on_gpu_model (the engine builds it)."""
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    from tightfit.runtime.spec.verify import BlockVerifier
    se = SpeculativeEngine(gpu_engine, SpecConfig(drafters=("mtp",), mtp_draft=3))
    assert isinstance(se.verifier, BlockVerifier) and se.mtp_head is not None
    assert se.mtp_head.device_bytes > 0
    p = [3, 1, 4, 1, 5, 9, 2, 6]
    a = list(gpu_engine.generate(p, max_tokens=60, sampling=GREEDY))[-1]
    b = list(se.generate(p, max_tokens=60, sampling=GREEDY))[-1]
    assert b.tokens == a.tokens
    assert b.timings.as_dict()["drafters"]["mtp"]["draft_n"] > 0


def test_an_mtp_head_that_cannot_be_built(gpu_engine, monkeypatch):
    """Named by the user (--spec mtp): a clear error; only implied by the default drafter list: the
    engine runs without it and says so."""
    from tightfit.errors import UserError
    from tightfit.runtime.spec import SpeculativeEngine, build_speculative
    from tightfit.runtime.spec.mtp import MTPHead

    def refuse(model, mf):
        raise UserError("the MTP drafter needs 900 MiB on the GPU for its block and 12 MiB are free")
    monkeypatch.setattr(MTPHead, "on_gpu_model", classmethod(lambda cls, m, f: refuse(m, f)))
    with pytest.raises(UserError, match="MiB are free"):
        build_speculative(gpu_engine, "mtp,ngram")
    with pytest.warns(RuntimeWarning, match="without the MTP drafter"):
        se = SpeculativeEngine(gpu_engine)
    assert se.mtp_head is None
    p = [3, 1, 4, 1, 5]
    a = list(gpu_engine.generate(p, max_tokens=20, sampling=GREEDY))[-1]
    b = list(se.generate(p, max_tokens=20, sampling=GREEDY))[-1]
    assert b.tokens == a.tokens and "mtp" not in b.timings.as_dict()["drafters"]
