"""The engine: a loaded model (weights + forward backend), its tokenizer and chat template, and
the generation loop shared by `tightfit run`, `tightfit chat` and the server.

Generation = state-only prefill of the prompt (only the last prompt token produces logits), then
one token at a time: sample -> emit text (UTF-8-safe, stop strings held back) -> forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tightfit.errors import UserError
from tightfit.runtime.sampler import GREEDY, Sampler, SamplingParams
from tightfit.runtime.stops import StopMatcher

PREFILL_CHUNK = 512  # tokens per prefill forward; bounds activation memory on long prompts


@dataclass
class Timings:
    """llama-server's `timings` object."""
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_n: int = 0

    def as_dict(self) -> dict[str, Any]:
        def per_s(n: int, ms: float) -> float:
            return n / ms * 1000.0 if ms > 0 else 0.0

        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": per_s(self.prompt_n, self.prompt_ms),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / self.predicted_n if self.predicted_n else 0.0,
            "predicted_per_second": per_s(self.predicted_n, self.predicted_ms),
        }


@dataclass
class Event:
    """One step of a generation: new text (possibly empty while a stop string or a split UTF-8
    character is held back) and the sampled token; the last event has `finish_reason`."""
    text: str
    token: int | None = None
    finish_reason: str | None = None   # "stop" | "length"
    timings: Timings | None = None
    tokens: list[int] = field(default_factory=list)  # on the last event: all generated ids


class Engine:
    def __init__(self, model_file: Any, model: Any, tokenizer: Any, n_ctx: int | None = None,
                 chat_template: str | None = None):
        self.file = model_file
        self.config = model_file.config
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = int(n_ctx or min(self.config.n_ctx_train, 4096))
        self.chat_template = chat_template
        self._template = None

    # ---- low level ----------------------------------------------------------------------------
    def new_state(self):
        return self.model.new_state(self.n_ctx)

    def check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < self.config.n_vocab]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        return ids

    def prefill(self, ids: Sequence[int], state) -> np.ndarray:
        """Feed prompt tokens; only the last one produces logits (state-only prefill)."""
        last = None
        for i in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[i:i + PREFILL_CHUNK]
            final = i + PREFILL_CHUNK >= len(ids)
            last = self.model.forward(chunk, state, logits="last" if final else "none")
        return _row(last)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits at every position for a fresh sequence, float32 [n_tokens, n_vocab]."""
        ids = self.check_ids(token_ids)
        if not ids:
            raise UserError("no tokens given")
        if len(ids) > self.n_ctx:
            raise UserError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        state = self.new_state()
        out = self.model.forward(ids, state, logits="all")
        return _numpy(out)

    # ---- text ---------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            # like llama.cpp's CLI: special tokens written in the prompt are parsed
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        else:
            ids = list(prompt)
        ids = self.check_ids(ids)
        if not ids:
            raise UserError("the prompt is empty")
        return ids

    def render_chat(self, messages: list[dict], tools: list | None = None,
                    add_generation_prompt: bool = True, **template_kwargs) -> str:
        if self._template is None:
            if not self.chat_template:
                raise UserError("this model has no chat template (tokenizer.chat_template)")
            from tightfit.tokenizer.chat import ChatTemplate
            self._template = ChatTemplate(self.chat_template)
        return self._template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     **template_kwargs)

    # ---- generation ---------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 state=None, n_past: int = 0,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Stream a completion. `state`/`n_past`: continue from a restored state that already holds
        the first `n_past` prompt tokens (the prompt cache); only the rest is prefilled."""
        ids = self.encode_prompt(prompt)
        if max_tokens is not None and max_tokens < 0:
            raise UserError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(ids) >= self.n_ctx:
            raise UserError(f"the prompt has {len(ids)} tokens; the context is {self.n_ctx} "
                            f"(raise -c / --ctx-size)")
        sampler = Sampler(sampling or GREEDY)
        if state is None:
            state, n_past = self.new_state(), 0
        if not 0 <= n_past < len(ids):
            raise ValueError("n_past must leave at least one prompt token to prefill")
        timings = Timings(prompt_n=len(ids) - n_past, cache_n=n_past)
        t0 = time.perf_counter()
        logits = self.prefill(ids[n_past:], state)
        timings.prompt_ms = (time.perf_counter() - t0) * 1000.0

        detok = _stream_decoder(self.tokenizer)
        stops = StopMatcher(stop)
        eos = set(self.tokenizer.eos_ids)
        history = list(ids)
        generated: list[int] = []
        limit = self.n_ctx - len(ids)
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        # greedy without penalties on an executor that takes the argmax itself (GPUModel.greedy:
        # the step's argmax on the device, its status checked): one id a token crosses to the
        # host instead of a row of n_vocab logits (~0.2 ms a token on the 27B, session 22)
        fast = sampler.params.greedy and not sampler.params.penalized and \
            hasattr(self.model, "greedy")
        nxt: int | None = None
        t1 = time.perf_counter()
        finish = "length"
        while len(generated) < limit:
            if should_stop is not None and should_stop():
                finish = "cancelled"
                break
            tok = sampler(logits, history) if nxt is None else nxt
            generated.append(tok)
            history.append(tok)
            if tok in eos:
                finish = "stop"
                break
            text = stops.feed(detok.push(tok))
            if stops.stopped:
                timings.predicted_n = len(generated)
                timings.predicted_ms = (time.perf_counter() - t1) * 1000.0
                yield Event(text, tok, "stop", timings, generated)
                return
            yield Event(text, tok)
            if len(generated) >= limit:
                break
            if fast:
                nxt = self.model.greedy(tok, state, 1)[0]
            else:
                logits = _row(self.model.forward([tok], state, logits="last"))
        tail = stops.feed(detok.flush()) + stops.flush()  # bytes of a split character, held text
        timings.predicted_n = len(generated)
        timings.predicted_ms = (time.perf_counter() - t1) * 1000.0
        yield Event(tail, None, finish, timings, generated)

    def chat(self, messages: list[dict], tools: list | None = None,
             chat_template_kwargs: dict | None = None, **gen_kwargs) -> Iterator[Event]:
        prompt = self.render_chat(messages, tools=tools, **(chat_template_kwargs or {}))
        return self.generate(prompt, **gen_kwargs)


def _stream_decoder(tok):
    """The tokenizer's incremental detokenizer (`detokenizer()`; `stream_decoder()` accepted)."""
    make = getattr(tok, "detokenizer", None) or getattr(tok, "stream_decoder")
    return make()


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def _row(x) -> np.ndarray:
    a = _numpy(x)
    return a[-1] if a.ndim == 2 else a
