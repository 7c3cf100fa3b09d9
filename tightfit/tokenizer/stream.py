"""Incremental detokenizer: token ids in, text out, never a broken UTF-8 character.

A byte-level BPE token can end inside a multi-byte character (CJK, emoji: one character is often
two or three tokens). The bytes of each token go through Python's incremental UTF-8 decoder, which
holds back an unfinished sequence until the next token completes it. Bytes that can never become
valid UTF-8 (a stray continuation byte, a sequence cut by a different character) come out as one
U+FFFD each, as soon as that is certain, so a stream never stalls. `flush()` ends the stream and
turns a still-unfinished tail into U+FFFD.

Concatenating everything `push` and `flush` return equals `tok.decode(all_ids)`.
"""
from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    def __init__(self, tokenizer, special: bool = True):
        self._tok = tokenizer
        self._special = special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text that became complete with this token ('' while a character is unfinished)."""
        return self._dec.decode(self._tok.token_to_piece(token_id, self._special), final=False)

    def push_many(self, ids) -> str:
        return self._dec.decode(b"".join(self._tok.token_to_piece(i, self._special) for i in ids),
                                final=False)

    @property
    def pending(self) -> bytes:
        """Bytes held back (the start of an unfinished character)."""
        return self._dec.getstate()[0]

    def flush(self) -> str:
        """End of stream: whatever is still held back, as U+FFFD."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out

    def reset(self) -> None:
        self._dec.reset()
