"""Tokenizer of a qwen35 GGUF (byte-level BPE from `tokenizer.ggml.*`), streaming detokenizer.

    tok = tightfit.tokenizer.from_gguf("model.gguf")
    ids = tok.encode("Hello", parse_special=True)
    tok.decode(ids); tok.token_to_piece(ids[0]) -> bytes; tok.eos_ids; tok.n_vocab
    d = tok.detokenizer(); d.push(id) -> str (never a broken UTF-8 character); d.flush()
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
