"""The MTP drafter's one-token steps as CUDA graphs.

Why: eager, one drafted token of the 27B's MTP head is ~14 GEMV launches (each with its own
activation quantization) and ~60 small torch ops, ~3.8-5.8 ms from Python (bench/NOTES.md,
session 15) against a 7.3 ms target step; the same work replayed as one graph is launch-free.

Two graphs over the same static buffers (the head's `step_pair`, shapes fixed by the cache's
planned capacity):
  * `kv`: the pair (h, tok) at cache row `at` writes its K/V row only, then at, pos += 1 (a
    verified pair whose draft nobody needs: no attention, FFN or LM head);
  * `draft`: the full pair, then the LM head; d = argmax(logits) is written to out[j] and becomes
    the next pair's token, h' its hidden row; at, pos, j += 1. Replaying it k times drafts k
    greedy tokens with no host sync in between (the token never leaves the device);
  * `sample` (temperature > 0): as `draft`, but d is SAMPLED from the draft distribution q over the
    logits' top QK candidates, filtered as the sampler filters (top-k within QK, then top-p and
    min-p on the temperature-1 probabilities, then the temperature), by Gumbel-max with uniforms
    the drafter's own numpy RNG wrote before the round (a seed reproduces the drafts); q's ids and
    probabilities are kept per draft for the verifier's rejection sampling, which needs only
    that q be exactly what d was drawn from (it is: softmax of the kept logits).
The token's embedding is looked up on the device inside the graph (the executor's device
embedding: embed_rows over the table in device memory), so a graph exists only when the model
has one (MTPHead.embed_dev). Both graphs share one private memory pool: what
tightfit.plan.mtp.mtp_scratch_bytes prices as the step's scratch.

Off CUDA (tests) the same bodies run eagerly on the same buffers: the bookkeeping and the
static-shape attention are checked there against the eager forward.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

# candidates of the sampled draft distribution: a top-k past QK (or none) is cut to QK. The draft
# distribution only has to be known exactly, not equal to the target's (rejection sampling keeps
# the output distribution); past the top 64 the 27B-class heads leave ~no mass.
QK = 64


class MTPStepGraph:
    def __init__(self, head: Any, cache: Any):
        if head.embed_dev is None:
            raise ValueError("MTPStepGraph needs the head's device embedding (MTPHead.embed_dev)")
        if not cache.fixed:
            raise ValueError("MTPStepGraph needs a fixed-capacity MTPCache")
        c, dev = head.config, head.device
        self.head, self.cache = head, cache
        self.h = torch.zeros(1, c.n_embd, dtype=torch.float32, device=dev)
        self.tok = torch.zeros(1, dtype=torch.int64, device=dev)
        self.at = torch.zeros(1, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self.j = torch.zeros(1, dtype=torch.int64, device=dev)
        # the decode attention kernel's view of the row: T = status[2] + 1 (int32, as the step's)
        self.status = torch.zeros(4, dtype=torch.int32, device=dev)
        self.out = torch.zeros(64, dtype=torch.int64, device=dev)   # drafted ids of a round
        # sampled drafting: per draft j, the uniforms of its Gumbel-max draw and its q (ids, probs);
        # sp = (1 / temperature, top_p, min_p, top_k within QK) as the round's sampling sets them
        self.u = torch.full((64, QK), 0.5, dtype=torch.float32, device=dev)
        self.q_ids = torch.zeros(64, QK, dtype=torch.int64, device=dev)
        self.q_p = torch.zeros(64, QK, dtype=torch.float32, device=dev)
        self.sp = torch.tensor([1.0, 2.0, 0.0, float(QK)], dtype=torch.float32, device=dev)
        self._ar = torch.arange(QK, dtype=torch.float32, device=dev)
        self.use_graphs = dev.type == "cuda"
        self._graphs: dict[str, Any] = {}
        self.replays = 0
        self.capture_s = 0.0           # warm-up + capture time (bench: kept out of the round cost)

    @property
    def max_draft(self) -> int:
        return int(self.out.numel())

    # ---- bodies (captured as they are) ----------------------------------------------------------
    def _kv_body(self) -> None:
        hd = self.head
        hd.step_pair(hd.embed_dev(self.tok), self.h, self.cache, self.at, self.pos, full=False)
        self._advance()

    def _advance(self) -> None:
        self.at.add_(1)
        self.pos.add_(1)
        self.status[2:3].add_(1)

    def _draft_body(self) -> None:
        hd = self.head
        h2 = hd.step_pair(hd.embed_dev(self.tok), self.h, self.cache, self.at, self.pos, full=True,
                          status=self.status)
        d = torch.argmax(hd.head_fn(h2).reshape(-1)).reshape(1)
        self.out.index_copy_(0, self.j, d)
        self.tok.copy_(d)
        self.h.copy_(h2)
        self._advance()
        self.j.add_(1)

    def _sample_body(self) -> None:
        hd = self.head
        h2 = hd.step_pair(hd.embed_dev(self.tok), self.h, self.cache, self.at, self.pos, full=True,
                          status=self.status)
        vals, ids = torch.topk(hd.head_fn(h2).reshape(-1).float(), QK)     # sorted, descending
        sp, ar = self.sp, self._ar
        z = torch.where(ar < sp[3], vals - vals[0], float("-inf"))          # top-k within QK
        p1 = torch.softmax(z, 0)                                           # temperature 1
        keep = (ar < sp[3]) & (torch.cumsum(p1, 0) - p1 < sp[1]) & (p1 >= sp[2] * p1[0])
        keep = keep | (ar == 0)
        lt = torch.where(keep, z * sp[0], float("-inf"))
        q = torch.softmax(lt, 0)
        u = self.u.index_select(0, self.j).reshape(-1)
        d = ids.index_select(0, torch.argmax(lt - torch.log(-torch.log(u))).reshape(1))
        self.q_ids.index_copy_(0, self.j, ids.reshape(1, QK))
        self.q_p.index_copy_(0, self.j, q.reshape(1, QK))
        self.out.index_copy_(0, self.j, d)
        self.tok.copy_(d)
        self.h.copy_(h2)
        self._advance()
        self.j.add_(1)

    def _bodies(self):
        return {"kv": self._kv_body, "draft": self._draft_body, "sample": self._sample_body}

    def _capture(self, name: str):
        g = self._graphs.get(name)
        if g is not None:
            return g
        import time
        t0 = time.perf_counter()
        body = self._bodies()[name]
        # warm-up (JIT compiles, lazy GEMV setup) on a side stream, then capture; the static
        # buffers and the KV row at `at` are restored / rewritten before any real use
        keep = [t.clone() for t in self._state()]
        row = int(keep[2].item())
        kv = (self.cache.k[row].clone(), self.cache.v[row].clone())
        torch.cuda.synchronize(self.h.device)
        side = torch.cuda.Stream(self.h.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream().wait_stream(side)
        self._restore(keep)
        pool = next(iter(self._graphs.values())).pool() if self._graphs else None
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            body()
        self._restore(keep)
        self.cache.k[row].copy_(kv[0])
        self.cache.v[row].copy_(kv[1])
        self._graphs[name] = g
        self.capture_s += time.perf_counter() - t0
        return g

    def _state(self):
        return (self.h, self.tok, self.at, self.pos, self.j, self.status)

    def _restore(self, keep) -> None:
        for t, v in zip(self._state(), keep):
            t.copy_(v)

    def _run(self, name: str) -> None:
        self.replays += 1
        if self.use_graphs:
            self._capture(name).replay()
        else:
            self._bodies()[name]()

    # ---- one round ------------------------------------------------------------------------------
    def _start(self, hidden: torch.Tensor, tokens: list[int], at: int, k: int) -> bool:
        """Pairs (hidden[i], tokens[i]) at cache rows at.. (KV only but the last): the static
        buffers then hold the last pair, ready to draft k tokens (False: nothing to draft)."""
        n = len(tokens)
        if n == 0 or k < 1:
            return False
        if k > self.max_draft:
            raise ValueError(f"MTP graph drafts at most {self.max_draft} tokens per round")
        if at + n - 1 + k > self.cache.capacity:
            raise ValueError("MTP graph: the round would pass the cache's capacity")
        self.at.fill_(at)
        self.status[2:3].fill_(at)
        self.pos.fill_(self.cache.base + at)
        self.j.zero_()
        for i in range(n):
            self.h.copy_(hidden[i:i + 1])
            self.tok.fill_(int(tokens[i]))
            if i < n - 1:
                self._run("kv")
        return True

    def draft(self, hidden: torch.Tensor, tokens: list[int], at: int, k: int) -> list[int]:
        """Pairs (hidden[i], tokens[i]) at cache rows at.. (KV only but the last), then k greedy
        drafts from the last pair; one host sync for the k ids. Rows at .. at + len - 1 + k - 1
        are written (the drafts' rows are overwritten by the next round's pairs)."""
        if not self._start(hidden, tokens, at, k):
            return []
        for _ in range(k):
            self._run("draft")
        return [int(x) for x in self.out[:k].tolist()]

    def draft_sampled(self, hidden: torch.Tensor, tokens: list[int], at: int, k: int,
                      sampling, rng: np.random.Generator):
        """As `draft`, but each token sampled from its draft distribution (see the module
        docstring): (ids, [(q ids, q probs) per draft]), q as numpy arrays; one host read."""
        if not self._start(hidden, tokens, at, k):
            return [], []
        tk = int(sampling.top_k)
        self.sp.copy_(torch.tensor([1.0 / float(sampling.temperature),
                                    float(sampling.top_p) if sampling.top_p < 1.0 else 2.0,
                                    max(0.0, float(sampling.min_p)),
                                    float(min(tk, QK) if tk > 0 else QK)], dtype=torch.float32))
        # open interval: u in (0, 1) keeps both logs finite
        u = np.clip(rng.random((k, QK)), 1e-12, 1.0 - 2.0 ** -24).astype(np.float32)
        self.u[:k].copy_(torch.from_numpy(u))
        for _ in range(k):
            self._run("sample")
        out = self.out[:k].cpu().numpy()
        ids, probs = self.q_ids[:k].cpu().numpy(), self.q_p[:k].cpu().numpy().astype(np.float64)
        return [int(x) for x in out], [(ids[i], probs[i]) for i in range(k)]
