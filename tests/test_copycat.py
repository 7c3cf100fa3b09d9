"""The copying synthetic model (tightfit/model/copycat.py): same tensors and types as the random
model, and it continues text by copying from its context, on the reference forward (CPU) and on
the executor's quantized path; real drafters then meet high acceptance and greedy output stays
identical to plain decoding."""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.errors import UserError  # noqa: E402
from tightfit.model import presets  # noqa: E402
from tightfit.model.copycat import Layout, make_copycat  # noqa: E402
from tightfit.model.generate import plan_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("cc") / "copycat-small.gguf"
    make_copycat(path, "small", mix="seedmix")
    return path


def test_layout_fits_the_27b_and_small_geometries():
    big = Layout(presets.geometry("qwen3.8-27b-seedmix"))
    assert (big.rec, big.att, big.gram, big.rq, big.ra) == (0, 3, 3, 64, 256)
    assert big.c0 + big.ra <= 768                       # all in the first three 256-blocks
    s = Layout(presets.geometry("small"))
    assert s.c0 + s.ra <= 256 and s.gram == 3
    with pytest.raises(UserError, match="untied"):
        Layout(presets.geometry("small", tied=True))
    with pytest.raises(UserError, match="does not fit"):
        Layout(presets.geometry("tiny"))


def test_same_tensors_types_and_sizes_as_the_random_model(small):
    a = plan_model("small", mix="seedmix")
    b = open_model(small)
    got = {t.name: (t.type_name, t.nbytes) for t in b.gguf.tensors.values()}
    want = {t.name: (t.qtype, t.nbytes) for t in a.tensors}
    assert got == want


def _expect(ctx: list[int]) -> tuple[int, int]:
    """What the circuit computes: among earlier positions j, those whose 3 tokens before j match
    the last 3 tokens best; their most frequent successor (ties: the most recent)."""
    t = len(ctx) - 1
    levels: dict[int, list[int]] = {}
    for j in range(1, t + 1):
        m = sum(1 for s in range(3) if j - 1 - s >= 0 and ctx[t - s] == ctx[j - 1 - s])
        levels.setdefault(m, []).append(j)
    best = max(levels)
    cnt: dict[int, int] = {}
    last: dict[int, int] = {}
    for j in levels[best]:
        cnt[ctx[j]] = cnt.get(ctx[j], 0) + 1
        last[ctx[j]] = j
    return max(cnt, key=lambda v: (cnt[v], last[v])), best


def test_reference_copies_a_repeated_sequence(small):
    ref = ReferenceModel.from_model_file(open_model(small))
    rng = np.random.default_rng(1)
    seq = rng.choice(1000, 60, replace=False).tolist()
    st = ref.new_state(256)
    prompt = seq + seq[:10]
    pred = ref.forward(prompt, st, logits="all").argmax(-1).tolist()
    assert [pred[i] for i in range(60, 69)] == seq[1:10]        # teacher-forced second copy
    out, tok = [], pred[-1]
    for _ in range(25):                                         # and greedy from there on
        out.append(tok)
        tok = int(ref.forward([tok], st, logits="last").argmax())
    assert out == seq[10:35]


def test_follows_the_longest_match_where_the_text_repeats(small):
    """A text that copies an earlier stretch of itself (small alphabets: many partial matches);
    wherever a full 3-token match exists the model predicts its successor (most frequent, then
    most recent), as the circuit is built to."""
    ref = ReferenceModel.from_model_file(open_model(small))
    tot = agree = 0
    for trial, alphabet in enumerate((12, 40)):
        rng = np.random.default_rng(10 + trial)
        letters = rng.choice(1000, alphabet, replace=False)
        base = letters[rng.integers(0, alphabet, 150)].tolist()
        seq = base + base[20:120]
        pred = ref.forward(seq, ref.new_state(512), logits="all").argmax(-1).tolist()
        for t in range(20, len(seq)):
            e, level = _expect(seq[:t + 1])
            if level == 3:
                tot += 1
                agree += e == pred[t]
    assert tot > 180 and agree >= 0.95 * tot, (agree, tot)


def test_real_drafters_accept_on_the_copycat_and_output_is_unchanged(small):
    from tightfit.runtime.loader import load_engine
    from tightfit.runtime.sampler import GREEDY
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng = load_engine(str(small), n_ctx=512)
        rng = np.random.default_rng(5)
        seq = rng.choice(1000, 120, replace=False).tolist()
        prompt = seq + seq[:12]                                  # "copy this back"
        plain = list(eng.generate(prompt, max_tokens=90, sampling=GREEDY))[-1]
        assert plain.tokens[:60] == seq[12:72]                   # the model copies
        se = SpeculativeEngine(eng, SpecConfig(drafters=("ngram", "suffix"), max_draft=8))
        spec = list(se.generate(prompt, max_tokens=90, sampling=GREEDY))[-1]
        assert spec.tokens == plain.tokens
        d = spec.timings.as_dict()
        assert d["draft_n_accepted"] >= 0.8 * d["draft_n"] > 0, d
        assert d["spec_rounds"] < 0.35 * len(spec.tokens), d     # several tokens per verify
    finally:
        torch.set_num_threads(threads)


def test_cli_make_model_copycat(tmp_path, capsys):
    from tightfit.cli import main
    out = tmp_path / "cc.gguf"
    assert main(["make-model", str(out), "--preset", "small", "--qtype", "Q8_0", "--copycat"]) == 0
    desc = open_model(out).gguf.metadata["general.description"]
    assert desc.startswith("SYNTHETIC COPYING MODEL")
    assert main(["make-model", str(tmp_path / "t.gguf"), "--copycat"]) == 1          # tiny
    assert main(["make-model", str(tmp_path / "m.gguf"), "--preset", "small", "--copycat",
                 "--mtp"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "does not fit" in err[-2] and "--mtp" in err[-1]
    assert not (tmp_path / "t.gguf").exists() and not (tmp_path / "m.gguf").exists()
