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
    greedy tokens with no host sync in between (the token never leaves the device).
The token's embedding is looked up on the device inside the graph (the executor's device
embedding: embed_rows over the table in device memory), so a graph exists only when the model
has one (MTPHead.embed_dev). Both graphs share one private memory pool: what
tightfit.plan.mtp.mtp_scratch_bytes prices as the step's scratch.

Off CUDA (tests) the same bodies run eagerly on the same buffers: the bookkeeping and the
static-shape attention are checked there against the eager forward.
"""
from __future__ import annotations

from typing import Any

import torch


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

    def _bodies(self):
        return {"kv": self._kv_body, "draft": self._draft_body}

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
    def draft(self, hidden: torch.Tensor, tokens: list[int], at: int, k: int) -> list[int]:
        """Pairs (hidden[i], tokens[i]) at cache rows at.. (KV only but the last), then k greedy
        drafts from the last pair; one host sync for the k ids. Rows at .. at + len - 1 + k - 1
        are written (the drafts' rows are overwritten by the next round's pairs)."""
        n = len(tokens)
        if n == 0 or k < 1:
            return []
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
        for _ in range(k):
            self._run("draft")
        return [int(x) for x in self.out[:k].tolist()]
