"""A Session: one model sequence (one `State`) reused across requests, with a hybrid prompt cache.

A hybrid model's recurrent state cannot be rolled back the way a KV cache can (it is a lossy
summary of every token so far), so reusing a previous prompt needs a *snapshot* of the whole state
taken exactly at the reused position. The Session takes self-contained snapshots
(`State.snapshot(include_kv=True)`, moved to host RAM) at three kinds of points:

* a *message boundary* (chat): the end of the rendered conversation before the generation prompt
  (`<|im_start|>assistant\\n<think>\\n`). The next turn's prompt starts with exactly these tokens,
  even though the template drops the previous turn's thinking, so this is where turn N+1 matches;
* the end of the prompt minus its last token, so that the same prompt again (another sample, a
  retry) prefills one token only;
* the end of each generation: the prompt plus the generated tokens the state holds, for clients
  that continue the text verbatim (raw completions).

Each snapshot is keyed by the token ids the state holds. A request restores the snapshot with the
longest key that is a prefix of its prompt and leaves at least one prompt token to prefill (the
last prompt token must run through the model to give the first logits); the live state is reused
without a copy when it already holds such a prefix. Snapshots live in an LRU bounded by bytes.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from tightfit.errors import UserError
from tightfit.runtime.engine import PREFILL_CHUNK, Event
from tightfit.runtime.sampler import SamplingParams

DEFAULT_CACHE_BYTES = 2 << 30  # 2 GiB of host RAM for prompt-cache snapshots


class PromptCache:
    """Snapshots keyed by the token ids their state holds; least recently used evicted first so
    that the total stays within `budget_bytes`."""

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_BYTES):
        if budget_bytes < 0:
            raise UserError(f"the prompt-cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = int(budget_bytes)
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._sizes: dict[tuple[int, ...], int] = {}
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[int, ...]]:
        return list(self._entries)

    def lookup(self, ids: Sequence[int], max_len: int) -> tuple[int, object | None]:
        """(length, snapshot) of the longest entry that is a prefix of `ids` no longer than
        `max_len`; (0, None) when there is none."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            n = len(key)
            if n == 0 or n > max_len or (best is not None and n <= len(best)):
                continue
            if tuple(ids[:n]) == key:
                best = key
        if best is None:
            self.misses += 1
            return 0, None
        self.hits += 1
        self._entries.move_to_end(best)
        return len(best), self._entries[best]

    def __contains__(self, key: Sequence[int]) -> bool:
        return tuple(key) in self._entries

    def put(self, key: Sequence[int], snap) -> bool:
        """Store a snapshot (replacing one with the same key). False when it alone exceeds the
        budget (then nothing is stored)."""
        key = tuple(int(t) for t in key)
        size = int(snap.nbytes())
        if not key or size > self.budget:
            return False
        self.discard(key)
        while self._entries and self.nbytes + size > self.budget:
            old, _ = self._entries.popitem(last=False)
            self.nbytes -= self._sizes.pop(old)
        self._entries[key] = snap
        self._sizes[key] = size
        self.nbytes += size
        return True

    def discard(self, key: tuple[int, ...]) -> None:
        if key in self._entries:
            del self._entries[key]
            self.nbytes -= self._sizes.pop(key)

    def clear(self) -> None:
        self._entries.clear()
        self._sizes.clear()
        self.nbytes = 0


@dataclass
class ChatPrompt:
    """A rendered chat request: the prompt text, its token ids, and the message boundary (the
    number of tokens before the generation prompt, or None when it is not a clean token boundary)."""
    text: str
    ids: list[int]
    boundary: int | None


class _Entry:
    """A prompt-cache entry: the State snapshot and, with a speculative engine, the snapshot of
    its per-sequence context (the MTP drafter's KV over the same positions; None: none valid)."""
    __slots__ = ("state", "ctx")

    def __init__(self, state, ctx=None):
        self.state, self.ctx = state, ctx

    def nbytes(self) -> int:
        return int(self.state.nbytes()) + (int(self.ctx.nbytes()) if self.ctx is not None else 0)


def _to_host(snap):
    """Snapshots live in host RAM, whatever device the state is on."""
    if snap.kv is not None:
        snap.kv = [(k.to("cpu"), v.to("cpu")) for k, v in snap.kv]
    return snap


class Session:
    """One sequence of `engine` reused across requests. Not thread-safe: one generation at a time
    (the server runs every request on one worker thread)."""

    def __init__(self, engine, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.engine = engine
        self.cache = PromptCache(cache_bytes)
        self.state = None
        self._live: tuple[int, ...] | None = None   # token ids the live state holds (None: unknown)
        self._busy = False
        # a speculative engine's per-sequence context (the MTP drafter's KV), kept in step with
        # the state: fed by the prefill, rolled back with it, snapshotted with it
        make = getattr(engine, "new_context", None)
        self.ctx = make() if callable(make) else None

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    # ---- prompts ------------------------------------------------------------------------------
    def prepare_chat(self, messages: list[dict], tools: list | None = None,
                     chat_template_kwargs: dict | None = None) -> ChatPrompt:
        kw = dict(chat_template_kwargs or {})
        text = self.engine.render_chat(messages, tools=tools, add_generation_prompt=True, **kw)
        ids = self.engine.encode_prompt(text)
        boundary = None
        try:
            base = self.engine.render_chat(messages, tools=tools, add_generation_prompt=False, **kw)
        except UserError:
            base = ""
        if base and text.startswith(base) and len(base) < len(text):
            bids = self.engine.tokenizer.encode(base, add_special=True, parse_special=True)
            if 0 < len(bids) < len(ids) and ids[:len(bids)] == bids:
                boundary = len(bids)
        return ChatPrompt(text, ids, boundary)

    def check_request(self, n_prompt: int, max_tokens: int | None) -> None:
        """Refuse, before any work, a request that cannot fit the context."""
        if n_prompt <= 0:
            raise UserError("the prompt is empty")
        if n_prompt >= self.n_ctx:
            raise UserError(f"the prompt has {n_prompt} tokens; the context is {self.n_ctx} tokens")
        if max_tokens is not None:
            if max_tokens < 0:
                raise UserError(f"max_tokens must be >= 0, got {max_tokens}")
            if n_prompt + max_tokens > self.n_ctx:
                raise UserError(f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) "
                                f"exceeds the context of {self.n_ctx} tokens")

    # ---- generation ---------------------------------------------------------------------------
    def chat(self, messages: list[dict], chat_template_kwargs: dict | None = None,
             tools: list | None = None, max_tokens: int | None = 128,
             sampling: SamplingParams | None = None, stop: Sequence[str] = (),
             should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Render the conversation with the model's template and stream the reply; the end of the
        last message is a cache checkpoint, so the next turn prefills only what it adds."""
        p = self.prepare_chat(messages, tools=tools, chat_template_kwargs=chat_template_kwargs)
        return self.generate(p.ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                             should_stop=should_stop, checkpoints=[p.boundary] if p.boundary else ())

    def complete(self, prompt_or_ids: str | Sequence[int], max_tokens: int | None = 128,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Stream a raw completion of a prompt (text: special tokens parsed, as `tightfit run`)."""
        return self.generate(self.engine.encode_prompt(prompt_or_ids), max_tokens=max_tokens,
                             sampling=sampling, stop=stop, should_stop=should_stop)

    def generate(self, ids: Sequence[int], max_tokens: int | None = 128,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 should_stop: Callable[[], bool] | None = None,
                 checkpoints: Sequence[int] = ()) -> Iterator[Event]:
        """Stream a completion of the token ids `ids`, reusing the longest cached prefix. The last
        event's timings count the reused tokens as `cache_n` and only the rest as `prompt_n`."""
        ids = self.engine.check_ids(ids)
        self.check_request(len(ids), None)
        if max_tokens is not None and max_tokens < 0:
            raise UserError(f"max_tokens must be >= 0, got {max_tokens}")
        return self._generate(ids, max_tokens, sampling, stop, should_stop, checkpoints)

    def _generate(self, ids, max_tokens, sampling, stop, should_stop, checkpoints) -> Iterator[Event]:
        if self._busy:
            raise RuntimeError("this Session is already generating (one request at a time)")
        self._busy = True
        history: list[int] = list(ids)
        ok = False      # False after an exception inside the model: the state is not trusted
        try:
            n_cached, t_prefill = self._prefill(ids, checkpoints)
            n_own = len(ids) - 1 - n_cached      # prompt tokens prefilled here (the engine does 1)
            extra = {"context": self.ctx} if self.ctx is not None else {}
            for ev in self.engine.generate(ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                           state=self.state, n_past=len(ids) - 1,
                                           should_stop=should_stop, **extra):
                if ev.finish_reason is not None:
                    history = list(ids) + list(ev.tokens)
                elif ev.token is not None:
                    history.append(ev.token)
                if ev.finish_reason is not None and ev.timings is not None:
                    ev.timings.cache_n = n_cached
                    ev.timings.prompt_n += n_own
                    ev.timings.prompt_ms += t_prefill
                try:
                    yield ev
                except GeneratorExit:   # the consumer stopped early: the state is consistent
                    ok = True
                    raise
            ok = True
        finally:
            self._busy = False
            self._after(history, ok)

    def _prefill(self, ids: list[int], checkpoints: Sequence[int]) -> tuple[int, float]:
        """Restore the best cached prefix, then prefill up to len(ids)-1 with snapshots at the
        checkpoints and at the end. Returns (tokens reused, milliseconds spent)."""
        eng = self.engine
        if self.state is None:
            self.state = eng.new_state()
        limit = len(ids) - 1
        n_cached, snap = self.cache.lookup(ids, limit)
        live = self._live
        ctx = self.ctx
        if live is not None and len(live) >= max(n_cached, 1) and len(live) <= limit \
                and tuple(ids[:len(live)]) == live and self.state.pos == len(live):
            n_cached, snap = len(live), None      # the live state already holds this prefix
            if ctx is not None:
                ctx.truncate(len(live))
        elif snap is not None:
            self.state.restore(snap.state)
            if ctx is not None:
                ctx.restore(snap.ctx)
        else:
            n_cached = 0
            self.state.reset()
            if ctx is not None:
                ctx.reset()
        self._live = None                          # until this request finishes cleanly
        t0 = time.perf_counter()
        points = sorted({int(c) for c in checkpoints if n_cached < int(c) < limit} | {limit})
        pos = n_cached
        for p in points:
            if p <= pos:
                continue
            for i in range(pos, p, PREFILL_CHUNK):
                chunk = ids[i:min(p, i + PREFILL_CHUNK)]
                if ctx is not None:
                    eng.prefill_context(chunk, self.state, ctx)
                else:
                    eng.model.forward(chunk, self.state, logits="none")
            pos = p
            self.cache.put(ids[:p], self._entry(p))
        return n_cached, (time.perf_counter() - t0) * 1000.0

    def _entry(self, n: int) -> _Entry:
        """Snapshot of the state (n positions) and of the context over the same positions."""
        snap = _to_host(self.state.snapshot(include_kv=True))
        return _Entry(snap, self.ctx.snapshot(n) if self.ctx is not None else None)

    def _after(self, history: list[int], ok: bool) -> None:
        """Record what the state holds; snapshot the end of the turn."""
        st = self.state
        if st is None:
            return
        ctx = self.ctx
        if not ok or st.pos > len(history):
            self._live = None
            st.reset()
            if ctx is not None:
                ctx.reset()
            return
        key = tuple(history[:st.pos])
        self._live = key
        if ctx is not None:
            ctx.truncate(st.pos)       # the newest token is not in the state: nor in the context
        if key and key not in self.cache:
            try:
                self.cache.put(key, self._entry(st.pos))
            except UserError:
                self._live = None
                st.reset()
                if ctx is not None:
                    ctx.reset()

    def reset(self) -> None:
        """Forget the live state and every cached snapshot."""
        self.cache.clear()
        self._live = None
        if self.state is not None:
            self.state.reset()
        if self.ctx is not None:
            self.ctx.reset()

