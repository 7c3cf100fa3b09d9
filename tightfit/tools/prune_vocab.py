"""`tightfit prune-vocab`: drop tokens of unwanted scripts (and optionally rare Latin leaves) from
a GGUF's byte-level BPE vocabulary, with the matching rows of `token_embd` and `output`.

Selection (all on the metadata; no tensor is read):

1. **Script phase.** A NORMAL token is dropped when it cannot occur in text written only in the
   kept scripts (Unicode Script property, `regex`'s `\\p{Script=...}`). A token is byte-level BPE,
   so it may start or end inside a UTF-8 character: each character fragment is checked against
   every code point it could be part of, and the token stays if every fragment *could* belong to
   a kept-script character. Consequently every token (and so every merge) that tokenizing
   kept-script text can produce survives, and that text tokenizes exactly as before. Token
   bytes that are not valid UTF-8 in any context are dropped too (no text produces them).
   Always kept: the 256 single-byte tokens (any text still encodes) and every non-NORMAL token
   (control, user-defined); UNUSED padding rows are dropped unless `keep_unused`.
2. **Leaf phase** (`drop_rare_latin=N`). The N rarest Latin-script tokens (rarity = highest id,
   i.e. latest BPE rank, as a proxy for frequency) that are leaves of the merge graph: no kept
   merge takes them as input. Removing a leaf removes the merge that built it, which may make
   its parts leaves in turn (they join the candidates). A token some kept merge needs is never
   removed, so every kept token stays reachable.

A merge `a b` is kept when a, b and ab are all kept; the kept tokens keep their order (new ids
are the ranks among the kept). The output file records `tightfit.vocab.original_ids` (UINT32,
new id -> id in the source vocabulary) and `tightfit.vocab.original_n_vocab`. Rows of
`token_embd.weight` and `output.weight` are copied as whole blocks (rows are independent, any
quantized type), so kept rows are bit-identical.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from tightfit.errors import UserError
from tightfit.tools import gguf_rewrite as G

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
KEY_IDS = "tightfit.vocab.original_ids"
KEY_N = "tightfit.vocab.original_n_vocab"
VOCAB_TENSORS = ("token_embd.weight", "output.weight")
VOCAB_TENSOR_SUFFIXES = (".nextn.embed_tokens.weight", ".nextn.shared_head_head.weight")
_ROWS_PER_CHUNK = 4096


# ---- which code points are in the kept scripts -------------------------------------------------
@lru_cache(maxsize=8)
def script_mask(scripts: tuple[str, ...]) -> np.ndarray:
    """bool[0x110000]: code point is in one of `scripts` (Unicode Script property)."""
    try:
        import regex
    except ImportError:
        raise UserError("prune-vocab needs the 'regex' package for Unicode scripts "
                        "(pip install regex)") from None
    if not scripts:
        raise UserError("--keep-scripts: give at least one script name")
    try:
        cls = regex.compile("[" + "".join(rf"\p{{Script={s}}}" for s in scripts) + "]+")
    except regex.error as e:
        raise UserError(f"--keep-scripts {','.join(scripts)}: unknown Unicode script ({e})") from None
    # every code point except the surrogates, one string; matches come back as runs
    cps = np.concatenate([np.arange(0xD800), np.arange(0xE000, 0x110000)]).astype("<u4")
    text = cps.tobytes().decode("utf-32-le")
    mask = np.zeros(0x110000, dtype=bool)
    for mt in cls.finditer(text):
        a, b = mt.span()
        mask[cps[a]:cps[b - 1] + 1] = True
    return mask


class _Fragments:
    """Answers 'can these token bytes occur in text made only of kept code points?'."""

    def __init__(self, keep: np.ndarray):
        k = np.zeros(0x200000, dtype=bool)
        k[:0x110000] = keep
        self.k1 = k[:0x80].copy()
        k2 = k[:0x800].copy()
        k2[:0x80] = False                               # overlong
        k3 = k[:0x10000].copy()
        k3[:0x800] = False
        k3[0xD800:0xE000] = False                       # surrogates are not UTF-8
        k4 = k.copy()
        k4[:0x10000] = False
        self.kl = {2: k2.reshape(32, 64), 3: k3.reshape(16, 64, 64), 4: k4.reshape(8, 64, 64, 64)}

    def _any(self, L: int, fixed: dict[int, int]) -> bool:
        idx = tuple(fixed.get(p, slice(None)) for p in range(L))
        return bool(self.kl[L][idx].any())

    def possible(self, b: bytes) -> bool:
        n = len(b)
        r = 0
        while r < n and 0x80 <= b[r] < 0xC0:
            r += 1
        if r > 3:
            return False
        if r:
            g = [x & 0x3F for x in b[:r]]
            if r == n:      # only continuation bytes: any position inside a 2..4-byte character
                ok = any(self._any(L, {s + j: g[j] for j in range(r)})
                         for L in range(2, 5) for s in range(1, L - r + 1))
            else:           # the tail of a character
                ok = any(self._any(L, {L - r + j: g[j] for j in range(r)}) for L in range(r + 1, 5))
            if not ok:
                return False
        i = r
        while i < n:
            c = b[i]
            if c < 0x80:
                if not self.k1[c]:
                    return False
                i += 1
                continue
            if c < 0xC2 or c > 0xF4:                    # stray continuation, overlong lead, > U+10FFFF
                return False
            L = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            fixed = {0: c & (0x1F if L == 2 else 0x0F if L == 3 else 0x07)}
            j = 1
            while j < L and i + j < n:
                if not 0x80 <= b[i + j] < 0xC0:
                    return False
                fixed[j] = b[i + j] & 0x3F
                j += 1
            if not self._any(L, fixed):                 # complete, or cut off by the token's end
                return False
            i += L
        return True


def _is_latin_word(b: bytes, latin: np.ndarray) -> bool:
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return any(latin[ord(ch)] for ch in s)


# ---- the selection ---------------------------------------------------------------------------------
@dataclass
class PrunePlan:
    keep_ids: np.ndarray                    # sorted original ids that stay (new id = index)
    keep_merges: list[int]                  # indices into the original merge list
    n_vocab: int
    n_merges: int
    dropped_script: int = 0
    dropped_unused: int = 0
    dropped_leaves: int = 0
    leaf_ids: list[int] = field(default_factory=list)

    @property
    def n_kept(self) -> int:
        return int(self.keep_ids.size)

    def summary(self) -> str:
        return (f"vocabulary {self.n_vocab} -> {self.n_kept} tokens ({self.dropped_script} other-script, "
                f"{self.dropped_unused} unused, {self.dropped_leaves} rare Latin leaves dropped); "
                f"merges {self.n_merges} -> {len(self.keep_merges)}")


def _unspell_all(tokens: Sequence[str]) -> list[bytes]:
    from tightfit.tokenizer.bpe import BYTE_DECODER
    table = {ord(c): b for c, b in BYTE_DECODER.items()}
    out = []
    for t in tokens:
        s = t.translate(table)
        try:
            out.append(s.encode("latin-1"))
        except UnicodeEncodeError:        # outside the byte alphabet: not a byte-level token
            out.append(t.encode("utf-8"))
    return out


def split_merge(m: str) -> tuple[str, str]:
    p = m.find(" ", 1)                    # llama.cpp: first space after position 0
    if p < 0:
        raise UserError(f"malformed merge {m!r} (no space)")
    return m[:p], m[p + 1:]


def plan_prune(tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], *,
               keep_scripts: Iterable[str] = ("Han", "Latin", "Common"), drop_rare_latin: int = 0,
               keep_unused: bool = False) -> PrunePlan:
    """Which tokens and merges stay (metadata only; see the module doc)."""
    scripts = tuple(s.strip() for s in keep_scripts if s.strip())
    frag = _Fragments(script_mask(scripts))
    n = len(tokens)
    if len(types) != n:
        raise UserError(f"token_type has {len(types)} entries for {n} tokens")
    raw = _unspell_all(tokens)
    keep = np.ones(n, dtype=bool)
    n_script = n_unused = 0
    for i, (b, ty) in enumerate(zip(raw, types)):
        if ty == UNUSED and not keep_unused:
            keep[i] = False
            n_unused += 1
        elif ty == NORMAL and len(b) > 1 and not frag.possible(b):
            keep[i] = False
            n_script += 1
    t2i = {t: i for i, t in enumerate(tokens)}
    trip = np.full((len(merges), 3), -1, dtype=np.int64)
    for k, m in enumerate(merges):
        a, b = split_merge(m)
        trip[k] = (t2i.get(a, -1), t2i.get(b, -1), t2i.get(a + b, -1))
    valid = (trip >= 0).all(axis=1)
    alive = valid.copy()
    alive[valid] &= keep[trip[valid]].all(axis=1)

    leaf_ids: list[int] = []
    if drop_rare_latin > 0:
        latin = script_mask(("Latin",))
        uses = np.zeros(n, dtype=np.int64)                 # kept merges taking a token as input
        for col in (0, 1):
            np.add.at(uses, trip[alive, col], 1)
        made_by: dict[int, list[int]] = {}
        for k in np.nonzero(alive)[0]:
            made_by.setdefault(int(trip[k, 2]), []).append(int(k))

        def candidate(i: int) -> bool:
            return bool(keep[i]) and types[i] == NORMAL and len(raw[i]) > 1 and _is_latin_word(raw[i], latin)
        heap = [-i for i in range(n) if uses[i] == 0 and candidate(i)]
        heapq.heapify(heap)
        while heap and len(leaf_ids) < drop_rare_latin:
            i = -heapq.heappop(heap)
            if not keep[i] or uses[i]:
                continue
            keep[i] = False
            leaf_ids.append(i)
            for k in made_by.pop(i, []):
                alive[k] = False
                for part in (int(trip[k, 0]), int(trip[k, 1])):     # "a a" counts twice, as above
                    uses[part] -= 1
                    if uses[part] == 0 and candidate(part):
                        heapq.heappush(heap, -part)
    return PrunePlan(keep_ids=np.nonzero(keep)[0], keep_merges=[int(k) for k in np.nonzero(alive)[0]],
                     n_vocab=n, n_merges=len(merges), dropped_script=n_script, dropped_unused=n_unused,
                     dropped_leaves=len(leaf_ids), leaf_ids=leaf_ids)


# ---- rewriting the metadata and the file -------------------------------------------------------------
def pruned_metadata(kvs: Mapping[str, G.KV], plan: PrunePlan) -> dict[str, G.KV]:
    """The changed/added tokenizer keys (tokens, types, scores, merges, *_token_id, mapping)."""
    ids = plan.keep_ids
    new_id = np.full(plan.n_vocab, -1, dtype=np.int64)
    new_id[ids] = np.arange(ids.size)
    out: dict[str, G.KV] = {}
    for key, kv in kvs.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        if kv.vtype == G.ARRAY and key != "tokenizer.ggml.merges" and len(kv.value) == plan.n_vocab:
            v = kv.value
            nv = [v[i] for i in ids] if isinstance(v, list) else np.asarray(v)[ids]
            out[key] = G.KV(key, kv.vtype, nv, kv.etype)
        elif key.endswith("_token_id") and kv.vtype != G.ARRAY:
            old = int(kv.value)
            if 0 <= old < plan.n_vocab:
                if new_id[old] < 0:
                    raise UserError(f"{key} = {old} names a token the pruning dropped")
                out[key] = G.KV(key, kv.vtype, int(new_id[old]))
    m = kvs["tokenizer.ggml.merges"]
    out[m.key] = G.KV(m.key, m.vtype, [m.value[k] for k in plan.keep_merges], m.etype)
    out[KEY_IDS] = G.KV(KEY_IDS, G.ARRAY, ids.astype(np.uint32), G.UINT32)
    out[KEY_N] = G.KV(KEY_N, G.UINT32, int(plan.n_vocab))
    return out


def is_vocab_tensor(name: str) -> bool:
    return name in VOCAB_TENSORS or name.endswith(VOCAB_TENSOR_SUFFIXES)


def _row_chunks(rows: np.ndarray, ids: np.ndarray):
    for i in range(0, ids.size, _ROWS_PER_CHUNK):
        yield rows[ids[i:i + _ROWS_PER_CHUNK]]


@dataclass
class PruneReport:
    plan: PrunePlan
    bytes_in: int
    bytes_out: int
    tensor_bytes: dict[str, tuple[int, int]]

    def lines(self) -> list[str]:
        out = [self.plan.summary()]
        out += [f"{n}: {a} -> {b} bytes" for n, (a, b) in self.tensor_bytes.items()]
        out.append(f"file {self.bytes_in} -> {self.bytes_out} bytes ({self.bytes_in - self.bytes_out} saved)")
        return out


def _vocab_arrays(lay: G.GGUFLayout) -> tuple[list[str], list[int], list[str]]:
    tokens = lay.get("tokenizer.ggml.tokens")
    merges = lay.get("tokenizer.ggml.merges")
    if tokens is None or merges is None:
        raise UserError(f"{lay.path.name}: no BPE vocabulary (tokenizer.ggml.tokens/merges missing)")
    if lay.get("tokenizer.ggml.model") != "gpt2":
        raise UserError(f"{lay.path.name}: only byte-level BPE ('gpt2') vocabularies can be pruned")
    types = lay.get("tokenizer.ggml.token_type")
    types = [NORMAL] * len(tokens) if types is None else [int(t) for t in types]
    return tokens, types, merges


def prune_file(src: str, dst: str, *, keep_scripts: Iterable[str] = ("Han", "Latin", "Common"),
               drop_rare_latin: int = 0, keep_unused: bool = False) -> PruneReport:
    if Path(dst).exists() and Path(dst).resolve() == Path(src).resolve():
        raise UserError(f"output {dst} is the input file; write to a new path")
    lay = G.read_gguf(src)
    if lay.get(KEY_IDS) is not None:
        raise UserError(f"{lay.path.name} is already pruned ({KEY_IDS} present); prune the original")
    tokens, types, merges = _vocab_arrays(lay)
    plan = plan_prune(tokens, types, merges, keep_scripts=keep_scripts,
                      drop_rare_latin=drop_rare_latin, keep_unused=keep_unused)
    kvs = lay.kvs_with(pruned_metadata(lay.kvs, plan))
    out, sizes = [], {}
    for t in lay.tensors:
        if not is_vocab_tensor(t.name):
            out.append(G.OutTensor.copy_of(lay, t))
            continue
        if len(t.ne) != 2 or t.ne[1] != plan.n_vocab:
            raise UserError(f"{lay.path.name}: tensor '{t.name}' has shape {list(t.ne)}, expected "
                            f"[n_embd, {plan.n_vocab}]")
        ot = G.OutTensor(t.name, (t.ne[0], plan.n_kept), t.type_id,
                         (lambda t=t: _row_chunks(lay.rows(t), plan.keep_ids)))
        sizes[t.name] = (t.nbytes, ot.nbytes)
        out.append(ot)
    size = G.write_gguf(dst, kvs, out, alignment=lay.alignment, version=lay.version)
    return PruneReport(plan, Path(src).stat().st_size, size, sizes)


def original_ids(path_or_metadata) -> np.ndarray | None:
    """new id -> original id of a pruned file (None if the file is not pruned)."""
    if isinstance(path_or_metadata, Mapping):
        v = path_or_metadata.get(KEY_IDS)
        v = v.value if isinstance(v, G.KV) else v
    else:
        v = G.read_gguf(path_or_metadata).get(KEY_IDS)
    return None if v is None else np.asarray(v, dtype=np.int64)
