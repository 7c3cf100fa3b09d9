"""Fast encode path: the same pipeline as the `tokenizers` object, with the slow stages swapped.

Profile of `tokenizers` on 1 MB of mixed text (one thread): its Oniguruma split alone costs more
than tiktoken's whole encode, and its per-character offset bookkeeping roughly doubles that. The
merges are cheap. So this path keeps `tokenizers`' BPE model (Rust) for the merges and changes
the rest:

1. added tokens are cut out with one regex alternation, longest first (leftmost-longest, the
   order `tokenizers` and llama.cpp use; Qwen's added tokens never overlap);
2. NFC (when on) is skipped for text Python already reports NFC-normal, else done by the same
   `tokenizers` NFC normaliser (see `_nfc` for why that skip is exact);
3. the split regex runs in the `regex` module (C), and each piece's ids come from a piece cache,
   filled by the BPE model of the `tokenizers` object on a miss (one `model.tokenize` call per
   new piece: measured quicker than sending all new pieces of a text through one pre-tokenized
   `encode_batch_fast` call, whose Encoding and added-token bookkeeping cost more than the
   per-call overhead saved; the merges themselves are most of the cost of a new piece).

Equivalence: `regex`, Oniguruma and llama.cpp classify every code point assigned in Python's
Unicode database identically for this split (checked exhaustively in the tests). Code points
Python does not know (assigned in a later Unicode version) make `encode` return None, and the
caller uses the `tokenizers` object for that text.
"""
from __future__ import annotations

import unicodedata

from tightfit.tokenizer.bpe import SPELL

_CACHE_LIMIT = 300_000          # pieces; the cache is simply dropped when it grows past this


class FastEncoder:
    def __init__(self, pattern: str, model, normalizer, added: dict[str, int], control: set[str]):
        import regex   # installed with transformers; without it the caller keeps the slow path

        self._split = regex.compile(pattern).findall
        self._tokenize = model.tokenize
        self._nfc = normalizer.normalize_str if normalizer is not None else None
        self._added = added
        texts = sorted(added, key=len, reverse=True)
        user = [t for t in texts if t not in control]
        self._re_all = regex.compile("|".join(map(regex.escape, texts))) if texts else None
        self._re_user = regex.compile("|".join(map(regex.escape, user))) if user else None
        self._cache: dict[str, tuple[int, ...]] = {}
        self._known: set[str] = set()      # non-ASCII characters Python's Unicode data knows

    def _all_known(self, text: str) -> bool:
        if text.isascii():
            return True
        new = set(text) - self._known
        if not new:
            return True
        category = unicodedata.category
        for ch in new:
            if category(ch) == "Cn":
                return False
        if len(self._known) < 1_000_000:
            self._known |= new
        return True

    def encode(self, text: str, parse_special: bool) -> list[int] | None:
        if not self._all_known(text):
            return None
        rx = self._re_all if parse_special else self._re_user
        out: list[int] = []
        if rx is None:
            return self._encode_segment(text, out)
        pos = 0
        for m in rx.finditer(text):
            if m.start() > pos and self._encode_segment(text[pos:m.start()], out) is None:
                return None
            out.append(self._added[m.group()])
            pos = m.end()
        if pos < len(text) and self._encode_segment(text[pos:], out) is None:
            return None
        return out

    def _encode_segment(self, seg: str, out: list[int]) -> list[int] | None:
        if self._nfc is not None and not unicodedata.is_normalized("NFC", seg):
            # Python (newer tables) says not NFC: let `tokenizers`' own NFC decide what changes,
            # line by line (NFC never acts across "\n": a starter nothing composes with), so
            # only the lines that need it pay for it. The other way round is exact: a string
            # NFC-normal under newer Unicode tables is left unchanged by older ones (characters
            # they lack are inert starters to them).
            nfc, is_nfc = self._nfc, unicodedata.is_normalized
            seg = "\n".join(line if is_nfc("NFC", line) else nfc(line) for line in seg.split("\n"))
        pieces = self._split(seg)
        if sum(map(len, pieces)) != len(seg):     # the pattern covers all text; never skip any
            return None
        cache = self._cache
        get = cache.get
        extend = out.extend
        tokenize = self._tokenize
        for p in pieces:
            ids = get(p)
            if ids is None:
                # A tuple, not a list: tuples of ints drop out of the garbage collector's
                # tracking, so the cache does not make every collection walk it (measured: cold
                # encode of 1 MB of mixed text ~18% quicker, and a full cache costs nothing).
                ids = tuple([t.id for t in
                             tokenize(p.encode("utf-8").decode("latin-1").translate(SPELL))])
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[p] = ids
            extend(ids)
        return out
