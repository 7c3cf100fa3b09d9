"""llama.cpp's own tokenizer test vectors for the `qwen35` pre-tokenizer
(`../shared/fixtures/ggml-vocab-qwen35.gguf` + `.inp`/`.out`), llama.cpp itself on that file, and
bad input (files without a tokenizer, unknown ids, invalid UTF-8)."""
from __future__ import annotations

import ctypes
import unicodedata

import pytest

from test_tokenizer_corpus import FIXTURE, corpus
from tightfit.errors import GGUFError, UserError
from tightfit.tokenizer import TokenizerError, from_gguf

SEP = "\n__ggml_vocab_test__\n"

pytestmark = pytest.mark.skipif(not FIXTURE.is_file(),
                                reason=f"shared fixture {FIXTURE} absent (outside this workplace)")


def _cases():
    """(text, expected ids): every text in .inp ends with the separator; .out has one line each."""
    inp = FIXTURE.with_name(FIXTURE.name + ".inp").read_text(encoding="utf-8")
    out = FIXTURE.with_name(FIXTURE.name + ".out").read_text(encoding="utf-8")
    assert inp.endswith(SEP)
    texts = inp[:-len(SEP)].split(SEP)
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(texts)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


@pytest.fixture(scope="module")
def fx():
    return from_gguf(FIXTURE, normalize=False)


@pytest.fixture(scope="module")
def fx_nfc():
    return from_gguf(FIXTURE)


def test_llama_cpp_vectors(fx, fx_nfc):
    cases = _cases()
    assert len(cases) >= 45
    n_nfc = 0
    for text, want in cases:
        assert fx.encode(text) == want, repr(text)
        assert fx.decode(want) == text
        if unicodedata.normalize("NFC", text) == text:      # NFC cannot change these
            n_nfc += 1
            assert fx_nfc.encode(text) == want, repr(text)
    assert n_nfc >= 40


def test_fixture_metadata(fx):
    assert fx.n_vocab == 151_936 and fx.pre == "qwen35"
    assert {151643, 151645} <= fx.eos_ids          # <|endoftext|>, <|im_end|> (+ llama.cpp's </s>)
    assert fx.encode("<|im_end|>", parse_special=True) == [151645]
    assert fx.encode("<|im_end|>") != [151645]
    assert fx.decode([151645]) == "<|im_end|>" and fx.decode([151645], special=False) == ""


@pytest.mark.llama
def test_llama_cpp_on_fixture(fx):
    """llama.cpp on the same file: ids on a corpus, every token's piece, the end-of-gen set."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    ll = llama_cpp.Llama(str(FIXTURE), vocab_only=True, verbose=False)
    for s in corpus(1500, seed=99):
        for ps in (False, True):
            assert fx.encode(s, parse_special=ps) == ll.tokenize(s.encode(), add_bos=False,
                                                                 special=ps), repr(s[:60])
    vocab = ll._model.vocab
    buf = ctypes.create_string_buffer(1024)
    for special in (True, False):
        for i in range(fx.n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
            assert fx.token_to_piece(i, special) == buf.raw[:n], (i, special)
    assert fx.eos_ids == {i for i in range(fx.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}


# ---- bad input -----------------------------------------------------------------------------
def _write_gguf(path, kv):
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen35")
    for k, (v, t) in kv.items():
        w.add_key_value(k, v, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_without_tokenizer(tmp_path):
    import gguf
    p = _write_gguf(tmp_path / "notok.gguf", {"qwen35.block_count": (4, gguf.GGUFValueType.UINT32)})
    with pytest.raises(GGUFError, match="no tokenizer metadata"):
        from_gguf(p)


def test_unsupported_tokenizer_model_and_pre(tmp_path):
    import gguf
    T = gguf.GGUFValueType
    base = {"tokenizer.ggml.tokens": (["a", "b", "ab"], T.ARRAY),
            "tokenizer.ggml.merges": (["a b"], T.ARRAY)}
    p = _write_gguf(tmp_path / "spm.gguf", dict(base, **{"tokenizer.ggml.model": ("llama", T.STRING)}))
    with pytest.raises(GGUFError, match="not supported"):
        from_gguf(p)
    p = _write_gguf(tmp_path / "pre.gguf", dict(base, **{"tokenizer.ggml.model": ("gpt2", T.STRING),
                                                          "tokenizer.ggml.pre": ("llama3", T.STRING)}))
    with pytest.raises(GGUFError, match="pre-tokenizer 'llama3'"):
        from_gguf(p)


def test_not_a_gguf_and_truncated(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(GGUFError, match="not a GGUF"):
        from_gguf(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFError):
        from_gguf(empty)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(FIXTURE.read_bytes()[:100_000])
    with pytest.raises(GGUFError):
        from_gguf(trunc)
    with pytest.raises(GGUFError, match="cannot read"):
        from_gguf(tmp_path / "missing.gguf")


def test_decode_unknown_ids_and_bad_text(fx):
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        fx.decode([1, 2, fx.n_vocab])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        fx.decode([-1])
    with pytest.raises(TokenizerError, match="not an integer"):
        fx.decode(["x"])
    assert issubclass(TokenizerError, UserError)
    with pytest.raises(TokenizerError, match="not valid UTF-8"):
        fx.encode(b"ok \xff\xfe bad")
    assert fx.encode("héllo".encode()) == fx.encode("héllo")
    with pytest.raises(TokenizerError, match="surrogate"):
        fx.encode("a\udc80b")
    with pytest.raises(TokenizerError):
        fx.encode(123)
    assert fx.encode("") == []
    # A lone continuation byte decodes to U+FFFD, never raises.
    assert fx.decode([fx.encode("é")[0]]) in ("é", "\ufffd")


def test_add_special_flags():
    """Qwen vocabularies add nothing; a file asking for BOS/EOS gets them (llama.cpp semantics)."""
    from tightfit.tokenizer.gguf_meta import read_metadata
    md = read_metadata(FIXTURE)
    assert from_gguf(md, normalize=False).encode("hi", add_special=True) == [6023]
    md2 = dict(md, **{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    assert from_gguf(md2).encode("hi", add_special=True) == [151643, 6023, 151643]
    assert from_gguf(md2).encode("hi") == [6023]
