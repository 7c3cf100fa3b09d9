"""Byte-level BPE tokenizer built from a GGUF's `tokenizer.ggml.*` metadata.

The merging itself runs in Hugging Face `tokenizers` (Rust); this module only translates llama.cpp's
description of the vocabulary into a `tokenizers.Tokenizer` with the same behaviour as llama.cpp:

* `tokenizer.ggml.model` must be `gpt2` (byte-level BPE); `tokenizer.ggml.pre` picks the split
  regex. llama.cpp's Qwen pre-types are supported: `qwen35` and the `qwen2` family.
* The case-insensitive contraction group is spelled out (`'[sS]`, not `(?i:'s)`), as llama.cpp
  does (with Unicode case folding `(?i:'s)` may also take `'ſ`, U+017F).
* Token types: CONTROL (3) tokens are matched in the text only with `parse_special=True`;
  USER_DEFINED (4) tokens (`<think>`, `<tool_call>` …) are always matched whole, like llama.cpp.
  Tokens llama.cpp recognises by their text (end-of-generation, FIM) get the types it forces.
* NFC normalisation (what Qwen's `tokenizer.json` does) is on by default; `normalize=False` gives
  llama.cpp's behaviour, which does not normalise.
* Decoding does not go through `tokenizers`: each id maps to its bytes (GPT-2 byte alphabet undone
  for normal tokens, raw text for added tokens, nothing for unused/byte-typed rows), as llama.cpp's
  `token_to_piece` does, so streaming can work on bytes.
* `encode` normally takes the fast path in fast.py (same ids; the `tokenizers` BPE model with a
  quicker split and a piece cache) and falls back to the `tokenizers` object when that declines.
"""
from __future__ import annotations

import operator
import threading
from typing import Iterable, Mapping

from tightfit.errors import GGUFError, UserError

# llama.cpp token types (llama_token_type / gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# Split regexes of llama.cpp's pre-tokenizer types (facts from llama-vocab.cpp / the HF files).
_QWEN2_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {
    "qwen35": _QWEN35_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "kormo": _QWEN2_SPLIT,
    "megrez": _QWEN2_SPLIT,
}

# llama.cpp (llama-vocab.cpp, `load`) recognises some tokens by their text, whatever the file says:
# these are forced to CONTROL, and the end-of-generation (EOG) set is built from them.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
_FIM_PRE = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
            "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>")
_FIM_SUF = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
            "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>")
_FIM_MID = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
            "\u2581<MID>", "<|code_middle|>", "<|middle|>")
_FIM_PAD = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP = ("<|file_sep|>",)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss


class TokenizerError(UserError):
    """Bad tokenizer input: an id outside the vocabulary, text that is not UTF-8."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable stand-in character -> the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


BYTE_DECODER = _byte_decoder()
BYTE_ENCODER = {b: c for c, b in BYTE_DECODER.items()}
# str.translate tables: stand-in character <-> the byte as a latin-1 character.
_UNSPELL = {ord(c): b for c, b in BYTE_DECODER.items()}
SPELL = {b: c for c, b in BYTE_DECODER.items()}


def _unspell(token: str) -> bytes:
    """Bytes of a byte-level spelled token. A character outside the alphabet (a malformed
    vocabulary) is kept as its own UTF-8 instead of failing."""
    s = token.translate(_UNSPELL)
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(bytes([ord(ch)]) if ord(ch) < 256 else ch.encode("utf-8") for ch in s)


def _plain(meta: Mapping) -> dict:
    """Accept both plain metadata values and the `(value, GGUFValueType)` pairs vocab.py makes."""
    out = {}
    for k, v in meta.items():
        if isinstance(v, tuple) and len(v) == 2 and type(v[1]).__name__ == "GGUFValueType":
            v = v[0]
        out[k] = v
    return out


class Tokenizer:
    """Encode/decode for one vocabulary. Build it with `from_gguf`."""

    def __init__(self, metadata: Mapping, *, normalize: bool = True, fast: bool = True,
                 source: str = "metadata"):
        meta = _plain(metadata)
        self.source = source
        model = meta.get("tokenizer.ggml.model")
        if model is None or "tokenizer.ggml.tokens" not in meta:
            raise GGUFError(f"{source}: no tokenizer metadata (tokenizer.ggml.model/tokens missing)")
        if model != "gpt2":
            raise GGUFError(f"{source}: tokenizer model {model!r} is not supported (only 'gpt2' "
                            "byte-level BPE)")
        self.pre = meta.get("tokenizer.ggml.pre", "default")
        if self.pre not in PRE_SPLITS:
            raise GGUFError(f"{source}: pre-tokenizer {self.pre!r} is not supported "
                            f"(supported: {', '.join(sorted(PRE_SPLITS))})")
        tokens = list(meta["tokenizer.ggml.tokens"])
        if not tokens:
            raise GGUFError(f"{source}: tokenizer.ggml.tokens is empty")
        types = meta.get("tokenizer.ggml.token_type")     # may be a NumPy array: no `or` here
        types = [NORMAL] * len(tokens) if types is None else [int(t) for t in types]
        if len(types) != len(tokens):
            raise GGUFError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for "
                            f"{len(tokens)} tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise GGUFError(f"{source}: tokenizer.ggml.merges missing (needed for gpt2 BPE)")
        self.n_vocab = len(tokens)
        self.normalize = bool(normalize)

        def _id(key):
            v = meta.get(key)
            if v is None:
                return None
            if not 0 <= int(v) < len(tokens):
                raise GGUFError(f"{source}: {key}={v} is outside the vocabulary ({len(tokens)})")
            return int(v)

        self.bos_id = _id("tokenizer.ggml.bos_token_id")
        self.eos_id = _id("tokenizer.ggml.eos_token_id")
        self.pad_id = _id("tokenizer.ggml.padding_token_id")
        # llama.cpp: BPE vocabularies default to add_bos=false, add_eos=false.
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        if self.add_bos and self.bos_id is None:
            raise GGUFError(f"{source}: add_bos_token is set but bos_token_id is missing")
        if self.add_eos and self.eos_id is None:
            raise GGUFError(f"{source}: add_eos_token is set but eos_token_id is missing")

        token_to_id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if not t:                     # llama.cpp renames empty tokens the same way
                tokens[i] = t = f"[EMPTY_{i}]"
            if token_to_id.setdefault(t, i) != i:
                raise GGUFError(f"{source}: duplicate token {t!r} (ids {token_to_id[t]} and {i})")
        self._token_to_id = token_to_id
        self.tokens = tokens
        self.types = types
        self.eos_ids = self._end_of_generation(meta, types)
        self._pieces = [self._piece(t, ty) for t, ty in zip(tokens, types)]
        self._hf = self._build_hf(tokens, types, merges, token_to_id)
        self._lock = threading.Lock()
        self._fast = self._build_fast() if fast else None

    # ---- construction -----------------------------------------------------------------------
    def _end_of_generation(self, meta: dict, types: list[int]) -> frozenset[int]:
        """llama.cpp's end-of-generation set, with the type overrides it applies on the way.

        Approximation: where llama.cpp picks the *first* FIM token of a kind in hash-map order,
        all tokens of that kind are taken (vocabularies hold at most one of each in practice)."""
        t2i = self._token_to_id
        eog = set()
        for names in (_FIM_PRE, _FIM_SUF, _FIM_MID, _FIM_PAD, _FIM_REP, _FIM_SEP):
            for name in names:
                if name in t2i:
                    types[t2i[name]] = CONTROL
                    if names in (_FIM_PAD, _FIM_REP, _FIM_SEP):
                        eog.add(t2i[name])
        for text in _EOG_TEXTS:
            if text in t2i:
                eog.add(t2i[text])
                types[t2i[text]] = CONTROL
        for text in _ALWAYS_RENDERED:
            if text in t2i:
                types[t2i[text]] = USER_DEFINED
        for key in ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep"):
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            if i is not None and 0 <= int(i) < len(types):
                eog.add(int(i))
        if self.eos_id is not None:
            eog.add(self.eos_id)
        present = {self.tokens[i] for i in eog}
        if "<|end|>" in present and (("<|return|>" in present and "<|call|>" in present)
                                     or ("<|calls|>" in present and "<|flush|>" in present)):
            eog.discard(t2i["<|end|>"])            # harmony / solar-open: <|end|> is not EOG
            types[t2i["<|end|>"]] = USER_DEFINED
        if "<|tool_response>" in present and "</s>" in present:
            eog.discard(t2i["</s>"])               # gemma4 / paddleocr: </s> is plain text
            types[t2i["</s>"]] = NORMAL
        return frozenset(eog)

    @staticmethod
    def _piece(token: str, ttype: int) -> bytes | None:
        if ttype == NORMAL:
            return _unspell(token)
        if ttype in (CONTROL, UNKNOWN, USER_DEFINED):
            return token.encode("utf-8")        # added tokens are stored as plain text
        return None                              # UNUSED / BYTE: llama.cpp renders nothing

    def _build_hf(self, tokens, types, merges, token_to_id):
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        pairs = []
        for m in merges:
            p = m.find(" ", 1)          # llama.cpp splits at the first space after position 0
            if p < 0:
                raise GGUFError(f"{self.source}: malformed merge {m!r} (no space)")
            pairs.append((m[:p], m[p + 1:]))
        try:
            bpe = models.BPE(vocab=token_to_id, merges=pairs, fuse_unk=False, byte_fallback=False,
                             ignore_merges=False)
        except Exception as e:      # tokenizers raises a bare Exception for a bad merge table
            raise GGUFError(f"{self.source}: inconsistent vocabulary/merges ({e})") from None
        hf = HFTokenizer(bpe)
        if self.normalize:
            hf.normalizer = normalizers.NFC()
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_SPLITS[self.pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        hf.decoder = decoders.ByteLevel()
        special = [AddedToken(t, special=True, normalized=False)
                   for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN) and t]
        user = [AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types) if ty == USER_DEFINED and t]
        if special:
            hf.add_special_tokens(special)
        if user:
            hf.add_tokens(user)
        # Specials are only recognised on request (parse_special); see encode().
        hf.encode_special_tokens = True
        return hf

    def _build_fast(self):
        try:
            from tightfit.tokenizer.fast import FastEncoder
            added = {t: i for i, (t, ty) in enumerate(zip(self.tokens, self.types))
                     if ty in (CONTROL, UNKNOWN, USER_DEFINED)}
            control = {t for t, i in added.items() if self.types[i] != USER_DEFINED}
            return FastEncoder(PRE_SPLITS[self.pre], self._hf.model, self._hf.normalizer,
                               added, control)
        except ImportError:          # no `regex` module: every text takes the tokenizers path
            return None

    # ---- encoding ---------------------------------------------------------------------------
    def encode(self, text: str | bytes, add_special: bool = False,
               parse_special: bool = False) -> list[int]:
        """Token ids of `text`. `add_special` adds BOS/EOS where the vocabulary asks for them
        (never for Qwen3.5); `parse_special` lets `<|im_start|>`-style control tokens in the text
        become their ids (user-defined tokens like `<think>` always do)."""
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as e:
                raise TokenizerError(f"input is not valid UTF-8 (byte {e.start}: "
                                     f"{bytes(text)[e.start:e.start + 1]!r})") from None
        elif not isinstance(text, str):
            raise TokenizerError(f"cannot tokenize a {type(text).__name__}; give text")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        if text:
            try:
                ids.extend(self._encode_text(text, parse_special))
            except Exception:
                _check_encodable(text)           # a lone surrogate: say so in one line
                raise
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _encode_text(self, text: str, parse_special: bool) -> list[int]:
        if self._fast is not None:
            ids = self._fast.encode(text, parse_special)
            if ids is not None:
                return ids
        # The tokenizers object: characters newer than Python's Unicode data, or no `regex`.
        # encode_batch_fast skips the offset bookkeeping encode() does.
        if not parse_special:
            return self._hf.encode_batch_fast([text], add_special_tokens=False)[0].ids
        with self._lock:                        # the flag is per object: toggle under a lock
            self._hf.encode_special_tokens = False
            try:
                return self._hf.encode_batch_fast([text], add_special_tokens=False)[0].ids
            finally:
                self._hf.encode_special_tokens = True

    def encode_batch(self, texts: list[str], parse_special: bool = False) -> list[list[int]]:
        """Many texts at once (in parallel threads inside `tokenizers`)."""
        for t in texts:
            if not isinstance(t, str):
                raise TokenizerError(f"cannot tokenize a {type(t).__name__}; give text")
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            try:
                encs = self._hf.encode_batch_fast(texts, add_special_tokens=False)
            except Exception:
                for t in texts:
                    _check_encodable(t)
                raise
            finally:
                self._hf.encode_special_tokens = True
        return [e.ids for e in encs]

    # ---- decoding ---------------------------------------------------------------------------
    def _check_id(self, i) -> int:
        try:
            i = operator.index(i)
        except TypeError:
            raise TokenizerError(f"token id {i!r} is not an integer") from None
        if not 0 <= i < self.n_vocab:
            raise TokenizerError(f"token id {i} is outside the vocabulary (0..{self.n_vocab - 1})")
        return i

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character). Control tokens
        give their text when `special`, else nothing; unused rows give nothing (llama.cpp)."""
        i = self._check_id(token_id)
        if not special and self.types[i] in (CONTROL, UNKNOWN):
            return b""
        return self._pieces[i] or b""

    def decode_bytes(self, ids: Iterable[int], special: bool = True) -> bytes:
        return b"".join(self.token_to_piece(i, special) for i in ids)

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Text of `ids`. Bytes that do not form valid UTF-8 (a token sequence cut inside a
        character) become U+FFFD. Unknown ids raise TokenizerError."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def detokenizer(self, special: bool = True):
        """A fresh incremental detokenizer for streaming (see tightfit.tokenizer.stream)."""
        from tightfit.tokenizer.stream import IncrementalDetokenizer
        return IncrementalDetokenizer(self, special=special)

    # ---- lookups ----------------------------------------------------------------------------
    def token_id(self, text: str) -> int | None:
        """Id of a token by its stored text (e.g. `<|im_end|>`), or None."""
        return self._token_to_id.get(text)

    def token_type(self, token_id: int) -> int:
        return self.types[self._check_id(token_id)]

    def is_control(self, token_id: int) -> bool:
        return self.types[self._check_id(token_id)] in (CONTROL, UNKNOWN)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eos_ids

    @property
    def hf(self):
        """The underlying `tokenizers.Tokenizer` (control tokens not parsed)."""
        return self._hf

    def __repr__(self) -> str:
        return (f"Tokenizer(n_vocab={self.n_vocab}, pre={self.pre!r}, normalize={self.normalize}, "
                f"eos_ids={sorted(self.eos_ids)})")


def _check_encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"text holds a lone surrogate (U+{ord(text[e.start]):04X} at "
                             f"character {e.start}); it is not valid Unicode") from None
