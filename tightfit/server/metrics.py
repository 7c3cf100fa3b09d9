"""Prometheus metrics with llama-server's names (`llamacpp:*`, spec landscape §8), plus a few
`tightfit:*` ones for the prompt cache and the queue. Exposed as text by GET /metrics.

Counters are updated by the worker thread when a generation ends; gauges are read at scrape time.
A private CollectorRegistry per server keeps several servers in one process (tests) apart.
"""
from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Stats:
    def __init__(self):
        self._lock = threading.Lock()
        self.prompt_tokens_total = 0          # prompt tokens evaluated (cached ones excluded)
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.tokens_predicted_seconds_total = 0.0
        self.n_decode_total = 0               # model forward calls
        self.n_tokens_max = 0                 # largest context used by one request
        self.requests_total = 0
        self.requests_rejected_total = 0      # refused with 503 (queue full)
        self.requests_cancelled_total = 0
        self.cache_tokens_total = 0           # prompt tokens served from the prompt cache
        self.processing = 0
        self.deferred = 0
        # speculative decoding (llama-server's spec_decode_* counters; zero without --spec)
        self.spec_draft_tokens_total = 0      # drafted tokens sent to verification
        self.spec_accepted_tokens_total = 0   # of those, accepted
        self.spec_drafts_total = 0            # drafts verified (rounds with a draft)
        self.spec_accepted_per_pos: list[int] = []   # accepted drafts reaching position i (0-based)

    def queue_changed(self, processing: int, deferred: int) -> None:
        with self._lock:
            self.processing, self.deferred = processing, deferred

    def rejected(self) -> None:
        with self._lock:
            self.requests_rejected_total += 1

    def record(self, timings, n_prompt_total: int, cancelled: bool = False) -> None:
        """A generation ended; `timings` is the engine's Timings."""
        with self._lock:
            self.requests_total += 1
            self.requests_cancelled_total += int(cancelled)
            if timings is None:
                return
            self.prompt_tokens_total += timings.prompt_n
            self.prompt_seconds_total += timings.prompt_ms / 1000.0
            self.tokens_predicted_total += timings.predicted_n
            self.tokens_predicted_seconds_total += timings.predicted_ms / 1000.0
            self.cache_tokens_total += timings.cache_n
            # one forward per prompt chunk is not tracked separately: count prefill as one decode
            rounds = getattr(timings, "rounds", None)
            if rounds is None:
                self.n_decode_total += (1 if timings.prompt_n else 0) + max(0, timings.predicted_n - 1)
            else:                             # speculative: one verify forward per round
                self.n_decode_total += (1 if timings.prompt_n else 0) + rounds
            if hasattr(timings, "draft_n"):
                self.spec_draft_tokens_total += timings.draft_n
                self.spec_accepted_tokens_total += timings.draft_n_accepted
                self.spec_drafts_total += timings.draft_rounds
                per = self.spec_accepted_per_pos
                for i, n in enumerate(timings.accepted_per_pos):
                    if i >= len(per):
                        per.append(0)
                    per[i] += n
            self.n_tokens_max = max(self.n_tokens_max, n_prompt_total + timings.predicted_n)


class _Collector:
    def __init__(self, stats: Stats, cache_info: Callable[[], tuple[int, int, int]]):
        self.stats = stats
        self.cache_info = cache_info

    def collect(self):
        s = self.stats
        with s._lock:
            v = dict(vars(s))
            v["spec_accepted_per_pos"] = list(s.spec_accepted_per_pos)
        def counter(name, doc, value):
            f = CounterMetricFamily(name, doc)
            f.add_metric([], value)
            return f

        def gauge(name, doc, value):
            f = GaugeMetricFamily(name, doc)
            f.add_metric([], value)
            return f

        def rate(n, secs):
            return n / secs if secs > 0 else 0.0

        yield counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.",
                      v["prompt_tokens_total"])
        yield counter("llamacpp:prompt_seconds", "Prompt process time",
                      v["prompt_seconds_total"])
        yield counter("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                      v["tokens_predicted_total"])
        yield counter("llamacpp:tokens_predicted_seconds", "Predict process time",
                      v["tokens_predicted_seconds_total"])
        yield counter("llamacpp:n_decode", "Total number of llama_decode() calls",
                      v["n_decode_total"])
        yield gauge("llamacpp:n_tokens_max", "Largest observed n_tokens.", v["n_tokens_max"])
        yield gauge("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                    1.0 if v["n_decode_total"] else 0.0)
        yield gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                    rate(v["prompt_tokens_total"], v["prompt_seconds_total"]))
        yield gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                    rate(v["tokens_predicted_total"], v["tokens_predicted_seconds_total"]))
        yield gauge("llamacpp:requests_processing", "Number of requests processing.", v["processing"])
        yield gauge("llamacpp:requests_deferred", "Number of requests deferred.", v["deferred"])
        yield counter("llamacpp:spec_decode_num_draft_tokens", "Number of draft tokens verified.",
                      v["spec_draft_tokens_total"])
        yield counter("llamacpp:spec_decode_num_accepted_tokens", "Number of draft tokens accepted.",
                      v["spec_accepted_tokens_total"])
        yield counter("llamacpp:spec_decode_num_drafts", "Number of drafts verified.",
                      v["spec_drafts_total"])
        f = CounterMetricFamily("llamacpp:spec_decode_num_accepted_tokens_per_pos",
                                "Number of accepted draft tokens at each draft position (0-based).",
                                labels=["position"])
        for i, n in enumerate(v["spec_accepted_per_pos"]):
            f.add_metric([str(i)], n)
        yield f
        yield counter("tightfit:requests", "Generations finished (completed or cancelled).",
                      v["requests_total"])
        yield counter("tightfit:requests_rejected", "Requests refused because the queue was full.",
                      v["requests_rejected_total"])
        yield counter("tightfit:requests_cancelled", "Generations stopped by a client disconnect.",
                      v["requests_cancelled_total"])
        yield counter("tightfit:prompt_cache_tokens", "Prompt tokens reused from the prompt cache.",
                      v["cache_tokens_total"])
        entries, nbytes, budget = self.cache_info()
        yield gauge("tightfit:prompt_cache_entries", "Snapshots held by the prompt cache.", entries)
        yield gauge("tightfit:prompt_cache_bytes", "Host bytes held by the prompt cache.", nbytes)
        yield gauge("tightfit:prompt_cache_budget_bytes", "Prompt cache budget in bytes.", budget)


def make_registry(stats: Stats, cache_info: Callable[[], tuple[int, int, int]]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(stats, cache_info))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
