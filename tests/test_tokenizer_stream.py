"""Incremental detokenizer: every chunk is whole characters, nothing is held back longer than
needed, and the chunks add up to the text. The oracle is the input text itself and Python's strict
UTF-8 decoder on the accumulated bytes."""
from __future__ import annotations

import pytest

from test_tokenizer_corpus import FIXTURE, corpus
from tightfit.tokenizer import from_gguf

pytestmark = pytest.mark.skipif(not FIXTURE.is_file(), reason=f"shared fixture {FIXTURE} absent")


@pytest.fixture(scope="module")
def tok():
    return from_gguf(FIXTURE, normalize=False)


def _longest_valid_prefix(b: bytes) -> str:
    """Text of the longest prefix of `b` that is complete, valid UTF-8 (independent oracle)."""
    for cut in range(len(b), max(len(b) - 4, -1), -1):
        try:
            return b[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError("invalid UTF-8 in the middle of valid text")


def test_stream_equals_text_and_is_prompt(tok):
    n_split_chars = 0
    for s in corpus(3000, seed=5):
        ids = tok.encode(s, parse_special=True)
        d = tok.detokenizer()
        out, acc = [], b""
        for i in ids:
            chunk = d.push(i)
            acc += tok.token_to_piece(i)
            out.append(chunk)
            assert "\ufffd" not in chunk or "\ufffd" in s
            assert "".join(out) == _longest_valid_prefix(acc)      # emits as soon as complete
            n_split_chars += chunk == "" and tok.token_to_piece(i) != b""
        assert d.flush() == ""
        assert "".join(out) == s
    assert n_split_chars > 500     # CJK/emoji really are split across tokens in this corpus


def test_stream_emoji_and_cjk_one_token_at_a_time(tok):
    for s in ["👨‍👩‍👧‍👦 family", "俱乐部 新加坡", "🏳️‍🌈🇯🇵", "नमस्ते", "e\u0301\u0302"]:
        ids = tok.encode(s)
        d = tok.detokenizer()
        assert "".join(d.push(i) for i in ids) + d.flush() == s


def test_stream_invalid_bytes_do_not_stall(tok):
    """A token for a lone continuation byte (0x80) or a cut-off lead byte: U+FFFD as soon as the
    sequence is certainly broken, exactly as Python's 'replace' decoding of the whole stream."""
    from tightfit.tokenizer.bpe import BYTE_ENCODER
    byte_id = {b: tok.token_id(BYTE_ENCODER[b]) for b in range(256)}
    seqs = [[byte_id[0x80], *tok.encode("a")],
            [byte_id[0xE4], *tok.encode("x")],            # lead byte, then ASCII: broken
            [byte_id[0xE4], byte_id[0xB8], byte_id[0xAD]],  # 中 byte by byte
            [byte_id[0xF0], byte_id[0x9F]],                 # unfinished at end of stream
            [byte_id[0xFF], byte_id[0xC0], byte_id[0x41]]]
    for ids in seqs:
        d = tok.detokenizer()
        parts = [d.push(i) for i in ids]
        parts.append(d.flush())
        whole = b"".join(tok.token_to_piece(i) for i in ids)
        assert "".join(parts) == whole.decode("utf-8", errors="replace")
        assert tok.decode(ids) == whole.decode("utf-8", errors="replace")
    d = tok.detokenizer()
    assert d.push(byte_id[0x80]) == "\ufffd"                 # no waiting on a stray byte
    assert d.push(byte_id[0xE4]) == "" and d.pending == b"\xe4"
    assert d.flush() == "\ufffd" and d.pending == b""


def test_stream_special_tokens(tok):
    ids = tok.encode("hi<|im_end|>", parse_special=True)
    d = tok.detokenizer()
    assert "".join(d.push(i) for i in ids) == "hi<|im_end|>"
    d = tok.detokenizer(special=False)
    assert "".join(d.push(i) for i in ids) == "hi"
    d = tok.detokenizer()
    assert d.push_many(ids) == "hi<|im_end|>"
