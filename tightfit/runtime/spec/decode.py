"""Speculative generation: the same Event stream as `Engine.generate`, produced in rounds.

A round: the token sampled last (`last`, not yet in the state) plus a draft d_1..d_k from the
drafter the policy picked go through one verify forward; the acceptor walks the k+1 logits rows
(`tightfit.runtime.spec.verify`), emitting accepted drafts and then one target token (the
correction at the first rejection, or the bonus after a full accept); the state keeps exactly
the block tokens before the last emitted one. So, like the plain loop, the state always holds
the history minus the newest token, also when a stop string, EOS or the length limit ends the
generation inside a round (the acceptor stops there and only that many rows are committed).

Greedy speculation emits token for token what greedy decoding emits (the target choice at every
position is the plain sampler's); sampled speculation has the target distribution (rejection
sampling). The policy (`policy.py`) picks each round's drafter and length, or no draft, by
expected tokens per ms from the round times this loop measures with the policy's `clock`
(injectable: tests drive it with a modelled cost). `SpeculativeEngine(engine)` wraps an Engine
(everything else is delegated), so a Session or the server can use it in place of the engine.
Counters go to `SpecTimings` (llama-server's `draft_n`, `draft_n_accepted`, plus per-drafter
counts and per-position accepts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tightfit.errors import UserError
from tightfit.model import onetime
from tightfit.runtime.engine import PREFILL_CHUNK, Event, Timings, _stream_decoder
from tightfit.runtime.sampler import GREEDY, Sampler, SamplingParams
from tightfit.runtime.spec.forced import ForcedAcceptance
from tightfit.runtime.spec.ngram import Draft, NGramDrafter
from tightfit.runtime.spec.policy import Policy
from tightfit.runtime.spec.suffix import SuffixCache, SuffixDrafter
from tightfit.runtime.spec.verify import Acceptor, make_verifier
from tightfit.runtime.stops import StopMatcher


@dataclass
class SpecConfig:
    drafters: tuple[str, ...] = ("ngram", "suffix", "mtp")   # mtp only where the model has it
    max_draft: int = 8                 # cap on drafted tokens per round (verify block = +1)
    ngram_k: tuple[int, int] = (2, 4)
    ngram_min_hits: int = 1
    suffix_cache: SuffixCache | None = None
    suffix_depth: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    mtp_draft: int = 3
    mtp_p_min: float = 0.0
    adaptive: bool = True              # False: always the longest draft offered (raw cost)
    verifier: str = "auto"             # auto | native | block | replay | step
    record: str = "output"             # what a finished request adds to suffix_cache: output|all|none
    force_accept: float | None = None  # benchmarks only: synthetic acceptance rate (wrong output!)


@dataclass
class SpecTimings(Timings):
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_rounds: int = 0
    rounds: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    per_drafter: dict = field(default_factory=dict)
    accepted_per_pos: list = field(default_factory=list)

    def count(self, name: str, n: int, acc: int) -> None:
        d = self.per_drafter.setdefault(name, {"draft_n": 0, "draft_n_accepted": 0, "rounds": 0})
        d["draft_n"] += n
        d["draft_n_accepted"] += acc
        d["rounds"] += 1
        self.draft_n += n
        self.draft_n_accepted += acc
        self.draft_rounds += 1
        while len(self.accepted_per_pos) < n:
            self.accepted_per_pos.append(0)
        for i in range(acc):
            self.accepted_per_pos[i] += 1

    def spec_dict(self) -> dict[str, Any]:
        return {
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "draft_acceptance": self.draft_n_accepted / self.draft_n if self.draft_n else 0.0,
            "draft_rounds": self.draft_rounds,
            "spec_rounds": self.rounds,
            "draft_ms": self.draft_ms,
            "verify_ms": self.verify_ms,
            "drafters": {k: dict(v) for k, v in self.per_drafter.items()},
            "accepted_per_pos": list(self.accepted_per_pos),
        }

    def as_dict(self) -> dict[str, Any]:
        d = super().as_dict()
        d.update(self.spec_dict())
        return d


class SpeculativeEngine:
    """An Engine whose `generate`/`chat` speculate. Policy statistics persist across requests."""

    def __init__(self, engine, config: SpecConfig | None = None, policy: Policy | None = None,
                 mtp_head=None, extra_drafters: dict[str, Callable[[int], Any]] | None = None,
                 mtp_required: bool = False):
        """`policy`: e.g. one with an injected clock (its `adaptive` is used, not the config's);
        `extra_drafters`: name -> factory(max_draft) of further cheap drafters (begin / extend /
        propose, as NGramDrafter), built per request (tests, experiments); `mtp_required`: the
        user named the MTP drafter (--spec mtp), so a head that cannot be built is an error;
        otherwise (the default drafter list) it is left out with a warning."""
        self.engine = engine
        self.spec = config or SpecConfig()
        self.verifier = make_verifier(engine.model, self.spec.verifier)
        from tightfit.model.verify_graph import unplanned_verify
        if unplanned_verify(engine.model):
            import warnings
            warnings.warn("this model's plan has no verify region, so speculative blocks run "
                          "eagerly: slower than plain decoding and beside the plan's memory. Plan "
                          "with batch = most drafted tokens + 1 (plan_for(..., batch=...), "
                          "load_engine(..., batch=...); serve --spec does it)", RuntimeWarning,
                          stacklevel=2)
        self.policy = policy or Policy(adaptive=self.spec.adaptive)
        self.mtp_head = mtp_head
        self.extra_drafters = dict(extra_drafters or {})
        if mtp_head is None and "mtp" in self.spec.drafters and engine.config.nextn_layers:
            from tightfit.runtime.spec.mtp import MTPHead
            from tightfit.runtime.spec.verify import BlockVerifier, NativeVerifier
            if isinstance(self.verifier, NativeVerifier):
                self.mtp_head = MTPHead.for_reference(engine.model, engine.file)
            elif isinstance(self.verifier, BlockVerifier):
                try:
                    self.mtp_head = MTPHead.on_gpu_model(engine.model, engine.file)
                except UserError as e:
                    if mtp_required:
                        raise
                    import warnings
                    warnings.warn(f"speculative decoding without the MTP drafter: {e}",
                                  RuntimeWarning, stacklevel=2)

    def __getattr__(self, name: str) -> Any:      # everything not speculative: the engine's
        return getattr(self.engine, name)

    def chat(self, messages: list[dict], tools: list | None = None,
             chat_template_kwargs: dict | None = None, **gen_kwargs) -> Iterator[Event]:
        prompt = self.engine.render_chat(messages, tools=tools, **(chat_template_kwargs or {}))
        return self.generate(prompt, **gen_kwargs)

    # ---- per-sequence context (a Session's sequence across requests) ----------------------------
    def new_context(self) -> "SpecContext":
        """What a Session keeps for its sequence: the MTP drafter with its KV over every position
        the state holds (None without an MTP head), rolled back and snapshotted with the state."""
        mtp = None
        if "mtp" in self.spec.drafters and self.mtp_head is not None:
            from tightfit.runtime.spec.mtp import MTPDrafter
            mtp = MTPDrafter(self.mtp_head, self.spec.mtp_draft, self.spec.mtp_p_min)
        return SpecContext(mtp)

    def prefill_context(self, ids: Sequence[int], state, context: "SpecContext | None") -> None:
        """State-only prefill of prompt tokens (a Session's prefill) that also gives the context's
        MTP drafter the target's hidden rows, so that it sees the whole prompt, as a direct
        `generate` does."""
        ids = list(ids)
        if not ids:
            return
        m = context.mtp if context is not None else None
        if m is not None and m.base == 0 and m.n_pos == state.pos:
            if not _prefill_mtp(self.verifier, ids, state, m)[1]:
                m.reset()           # no hidden rows from this verifier: no context (n_pos 0)
            return
        if m is not None:
            m.reset()
        for i in range(0, len(ids), PREFILL_CHUNK):
            self.engine.model.forward(ids[i:i + PREFILL_CHUNK], state, logits="none")

    def _drafters(self, sampler: Sampler, context: "SpecContext | None" = None) -> dict[str, Any]:
        s = self.spec
        out: dict[str, Any] = {}
        if "ngram" in s.drafters:
            out["ngram"] = NGramDrafter(s.ngram_k[0], s.ngram_k[1], s.max_draft, s.ngram_min_hits)
        if "suffix" in s.drafters:
            out["suffix"] = SuffixDrafter(s.suffix_cache, s.suffix_depth, s.max_draft,
                                          s.max_spec_factor, s.max_spec_offset, s.min_token_prob)
        if "synthetic" in s.drafters:        # benchmarks: always drafts max_draft tokens
            out["synthetic"] = SyntheticDrafter(s.max_draft)
        for name, make in self.extra_drafters.items():
            out[name] = make(s.max_draft)
        if "mtp" in s.drafters and self.mtp_head is not None:
            from tightfit.runtime.spec.mtp import MTPDrafter
            rng = np.random.default_rng(int(sampler.rng.integers(1 << 62)))
            if context is not None and context.mtp is not None:
                context.mtp.set_sampling(sampler.params, rng)
                out["mtp"] = context.mtp
            else:
                out["mtp"] = MTPDrafter(self.mtp_head, s.mtp_draft, s.mtp_p_min, sampler.params, rng)
        return out

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 state=None, n_past: int = 0,
                 should_stop: Callable[[], bool] | None = None,
                 context: "SpecContext | None" = None) -> Iterator[Event]:
        """As Engine.generate; `context` (from `new_context`, with `state`) carries the MTP
        drafter's view of the first `n_past` positions from earlier requests."""
        eng = self.engine
        ids = eng.encode_prompt(prompt)
        if max_tokens is not None and max_tokens < 0:
            raise UserError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(ids) >= eng.n_ctx:
            raise UserError(f"the prompt has {len(ids)} tokens; the context is {eng.n_ctx} "
                            f"(raise -c / --ctx-size)")
        sampler = Sampler(sampling or GREEDY)
        acc = Acceptor(sampler)
        if state is None:
            state, n_past, context = eng.new_state(), 0, None
        if not 0 <= n_past < len(ids):
            raise ValueError("n_past must leave at least one prompt token to prefill")
        return self._run(ids, max_tokens, sampler, acc, stop, state, n_past, should_stop, context)

    def _run(self, ids, max_tokens, sampler, acc, stop, state, n_past, should_stop,
             context=None) -> Iterator[Event]:
        eng, s, pol, ver = self.engine, self.spec, self.policy, self.verifier
        drafters = self._drafters(sampler, context) if context is not None else self._drafters(sampler)
        mtp = drafters.get("mtp")
        timings = SpecTimings(prompt_n=len(ids) - n_past, cache_n=n_past)
        t0 = time.perf_counter()
        if mtp is not None:
            if not (context is not None and context.mtp is mtp and mtp.base == 0
                    and mtp.n_pos == n_past):
                mtp.reset(n_past)   # else the context holds positions 0..n_past-1: go on
            logits, fed = _prefill_mtp(ver, ids[n_past:], state, mtp)
            if not fed:                 # this verifier cannot give hidden states: no MTP
                drafters.pop("mtp")
                mtp.reset()
                mtp = None
        else:
            logits = eng.prefill(ids[n_past:], state)
            if context is not None:
                context.reset()
        timings.prompt_ms = (time.perf_counter() - t0) * 1000.0
        for name, d in drafters.items():
            if name != "mtp":
                d.begin(ids)

        detok = _stream_decoder(eng.tokenizer)
        stops = StopMatcher(stop)
        eos = set(eng.tokenizer.eos_ids)
        history = list(ids)
        generated: list[int] = []
        limit = eng.n_ctx - len(ids)
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        forced = ForcedAcceptance(s.force_accept) if s.force_accept is not None else None

        def push(tok: int) -> tuple[str | None, str]:
            generated.append(tok)
            history.append(tok)
            if tok in eos:
                return "eos", ""
            text = stops.feed(detok.push(tok))
            return ("word" if stops.stopped else None), text

        def finish_stats() -> None:
            timings.predicted_n = len(generated)
            timings.predicted_ms = (time.perf_counter() - t1) * 1000.0
            if s.suffix_cache is not None and s.record != "none" and generated:
                s.suffix_cache.add(list(ids) + generated if s.record == "all" else generated)

        t1 = time.perf_counter()
        finish = "length"
        if limit > 0 and not (should_stop is not None and should_stop()):
            tok = sampler(logits, history)
            status, text = push(tok)
            if mtp is not None:
                mtp.follow(tok)
            for name, d in drafters.items():
                if name != "mtp":
                    d.extend([tok])
            if status == "word":
                finish_stats()
                yield Event(text, tok, "stop", timings, generated)
                return
            if status == "eos":
                finish = "stop"
            else:
                yield Event(text, tok)
        elif limit > 0:
            finish = "cancelled"
        while finish == "length" and len(generated) < limit:
            if should_stop is not None and should_stop():
                finish = "cancelled"
                break
            room = limit - len(generated) - 1
            tr, once = pol.clock(), onetime.count()
            draft, name = self._propose(drafters, room)
            timings.draft_ms += self._draft_ms
            dtoks = draft.tokens if draft is not None else []
            block = [generated[-1]] + dtoks
            tv = pol.clock()
            rnd = ver.begin(block, state)
            emitted: list[int] = []
            events: list[Event] = []
            n_acc, status, rejected = 0, None, False
            n_forced = forced.accepted(len(dtoks)) if forced is not None else 0
            # greedy without penalties: the round's argmaxes in one small copy, no rows
            am = rnd.argmaxes() if acc.argmax_only and hasattr(rnd, "argmaxes") else None
            for i in range(len(block)):
                row = rnd.row(i) if am is None else None
                if i < len(dtoks):
                    q = draft.q[i] if draft.q else None
                    if forced is not None:
                        ok = i < n_forced
                        tok = dtoks[i] if ok else \
                            (am[i] if am is not None else acc.target(row, history))
                    elif am is not None:
                        tok = am[i]
                        ok = tok == dtoks[i]
                    else:
                        tok, ok = acc.step(row, history, dtoks[i], q)
                else:
                    tok, ok = (am[i] if am is not None else acc.target(row, history)), False
                status, text = push(tok)
                emitted.append(tok)
                if ok:
                    n_acc += 1
                elif i < len(dtoks):
                    rejected = True
                if status is None:
                    events.append(Event(text, tok))
                elif status == "word":
                    events.append(Event(text, tok, "stop", timings, generated))
                if status is not None or not ok or len(generated) >= limit:
                    break
            rnd.commit(len(emitted))
            timings.verify_ms += (pol.clock() - tv) * 1000.0
            timings.rounds += 1
            if name is not None:
                timings.count(name, len(dtoks), n_acc)
                pol.record_accept(name, draft.match_len, len(dtoks), n_acc,
                                  censored=not rejected and n_acc < len(dtoks))
            if forced is None:          # forced acceptance has nothing to do with the tokens
                self._shadow(name, emitted)
            else:
                self._cheap = {}
            if mtp is not None and rnd.hidden is not None:
                mtp.observe(rnd.hidden[: len(emitted)], emitted)
            for dn, d in drafters.items():
                if dn != "mtp":
                    d.extend(emitted)
            # the whole round as the loop sees it (cheap drafters, verify forward, acceptance,
            # commit, bookkeeping: per-round work every option pays), less the on-demand drafter's
            # time, which the policy adds per drafter; keyed by the draft length
            if onetime.count() == once:   # a round that captured a graph timed one-time work
                pol.record_round(len(dtoks), (pol.clock() - tr) * 1000.0 - self._ondemand_ms)
            if status == "word":
                finish_stats()
                yield from events
                return
            if status == "eos":
                finish = "stop"
            yield from events
        tail = stops.feed(detok.flush()) + stops.flush()
        finish_stats()
        yield Event(tail, None, finish, timings, generated)

    # ---- drafting ---------------------------------------------------------------------------
    def _propose(self, drafters: dict, room: int) -> tuple[Draft | None, str | None]:
        s, pol = self.spec, self.policy
        self._cheap: dict[str, Draft] = {}
        self._draft_ms = 0.0
        self._ondemand_ms = 0.0
        room = min(room, s.max_draft, getattr(self.verifier, "max_draft", None) or room)
        if room <= 0:
            return None, None
        cands: dict[str, tuple[int, int]] = {}
        for name, d in drafters.items():
            if name == "mtp":
                cands[name] = (min(d.max_draft, room), 0)
                continue
            t = pol.clock()
            dr = d.propose(room)
            # paid every round whatever the choice: timings only, not the policy's comparison
            self._draft_ms += (pol.clock() - t) * 1000.0
            if dr is not None and dr.tokens:
                self._cheap[name] = dr
                cands[name] = (len(dr.tokens), dr.match_len)
        name, k = pol.choose(cands)
        if name is None or k <= 0:
            return None, None
        if name == "mtp":
            t = pol.clock()
            dr = drafters["mtp"].propose(k)
            ms = (pol.clock() - t) * 1000.0
            self._draft_ms += ms
            self._ondemand_ms = ms
            pol.record_draft("mtp", ms, len(dr.tokens) if dr else 1, per_token=True)
            return (dr, "mtp") if dr is not None else (None, None)
        dr = self._cheap.pop(name)
        dr.tokens = dr.tokens[:k]
        if dr.q is not None:
            dr.q = dr.q[:k]
        return dr, name

    def _shadow(self, chosen: str | None, emitted: list[int]) -> None:
        """Score the unverified cheap drafts against what was emitted."""
        for name, dr in getattr(self, "_cheap", {}).items():
            if name == chosen:
                continue
            m = 0
            while m < len(dr.tokens) and m < len(emitted) and dr.tokens[m] == emitted[m]:
                m += 1
            censored = m == len(emitted) and m < len(dr.tokens)
            self.policy.record_accept(name, dr.match_len, len(dr.tokens), m, censored=censored,
                                      verified=False)
        self._cheap = {}


class SpecContext:
    """Per-sequence speculative state that outlives a request (held by a Session): the MTP
    drafter whose KV covers the positions the Session's state holds."""

    def __init__(self, mtp=None):
        self.mtp = mtp

    @property
    def n_pos(self) -> int:
        return self.mtp.n_pos if self.mtp is not None else 0

    def reset(self) -> None:
        if self.mtp is not None:
            self.mtp.reset()

    def truncate(self, n: int) -> bool:
        """Keep the first n positions (the state was rolled back or is reused at n)."""
        return self.mtp.truncate(n) if self.mtp is not None else True

    def snapshot(self, n: int):
        """Host snapshot for a prompt-cache entry of n positions (None: nothing valid to keep)."""
        if self.mtp is None or self.mtp.base != 0 or self.mtp.n_pos != n:
            return None
        return self.mtp.snapshot()

    def restore(self, snap) -> None:
        if self.mtp is None:
            return
        if snap is None:
            self.mtp.reset()
        else:
            self.mtp.restore(snap)


class SyntheticDrafter:
    """Drafts k copies of the last token (for forced-acceptance benchmarks; llama.cpp's
    --spec-synth-len): the cost of drafting is nil and the length is fixed."""
    name = "synthetic"

    def __init__(self, k: int):
        self.k = int(k)
        self.last = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self.last = int(prompt[-1]) if len(prompt) else 0

    def extend(self, tokens: Sequence[int]) -> None:
        if len(tokens):
            self.last = int(tokens[-1])

    def propose(self, max_k: int | None = None) -> Draft | None:
        k = self.k if max_k is None else min(self.k, max_k)
        return Draft([self.last] * k, self.name, match_len=k) if k > 0 else None


def _prefill_mtp(ver, ids: Sequence[int], state, mtp) -> tuple[np.ndarray, bool]:
    """Prefill the prompt and give the MTP drafter the target's hidden rows chunk by chunk: each
    chunk's pairs go through the head (its KV rows) before the next chunk, so the prompt's
    hidden rows are never all held at once. (The last token's logits, whether the drafter got
    the rows: False when the verifier has none.)"""
    def sink(rows, part) -> None:
        mtp.feed(rows, part)
        mtp.flush()
    if hasattr(ver, "prefill_into"):
        return ver.prefill_into(ids, state, sink), True
    logits, hidden = ver.prefill(ids, state)
    if hidden is None:
        return logits, False
    sink(hidden, list(ids))
    return logits, True


DRAFTER_NAMES = ("ngram", "suffix", "mtp")


def parse_drafters(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'ngram,suffix,mtp' -> ('ngram', 'suffix', 'mtp'); unknown or repeated names are UserErrors."""
    names = [x.strip() for x in (spec.split(",") if isinstance(spec, str) else spec)]
    names = [x for x in names if x]
    if not names:
        raise UserError(f"--spec needs at least one drafter ({', '.join(DRAFTER_NAMES)})")
    for x in names:
        if x not in DRAFTER_NAMES:
            raise UserError(f"--spec: unknown drafter {x!r} (choose from {', '.join(DRAFTER_NAMES)})")
    if len(set(names)) != len(names):
        raise UserError(f"--spec: a drafter is named twice in {','.join(names)!r}")
    return tuple(names)


def build_speculative(engine, drafters: str | Sequence[str], max_draft: int = 8,
                      mtp_draft: int = 3, suffix_cache: SuffixCache | None = None,
                      **config) -> SpeculativeEngine:
    """The server's speculative engine: `engine` wrapped with the named drafters, a SuffixCache
    shared by every request (kept for the engine's lifetime) and a persistent policy."""
    names = parse_drafters(drafters)
    if max_draft < 1:
        raise UserError(f"--draft-max must be >= 1, got {max_draft}")
    if "mtp" in names and not engine.config.nextn_layers:
        raise UserError("--spec mtp: this model has no MTP block (qwen35.nextn_predict_layers = 0)")
    cfg = SpecConfig(drafters=names, max_draft=int(max_draft), mtp_draft=min(int(mtp_draft), int(max_draft)),
                     suffix_cache=(suffix_cache if suffix_cache is not None else SuffixCache())
                     if "suffix" in names else None, **config)
    return SpeculativeEngine(engine, cfg, mtp_required="mtp" in names)


def speculative_generate(engine, prompt, config: SpecConfig | None = None, **gen) -> Iterator[Event]:
    """One-off speculative generation with a fresh policy."""
    return SpeculativeEngine(engine, config).generate(prompt, **gen)
