"""32 concurrent streaming requests against a live server: all complete, none is lost or mixed
up, each output equals a sequential run of the engine with the same prompt and seed (the engine
called directly, cold, one request at a time), and the event loop keeps answering /health while
the worker generates."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tightfit.runtime.sampler import SamplingParams
from tightfit.tokenizer.parse import parse_assistant_output
from _demo import demo_engine  # noqa: E402

N_CTX = 256
MAX_TOKENS = 6
# 8 distinct jobs (kind, prompt, seed); each is sent 4 times, interleaved
JOBS = [("completion", "The sea", 3), ("completion", "The sea", 1001),
        ("completion", "A robot walked", 3), ("completion", "Numbers: 1, 2,", 1001),
        ("chat", "The sea", 3), ("chat", "A robot walked", 1001),
        ("chat", "Once upon", 3), ("chat", "Once upon", 1001)]


@pytest.fixture(scope="module")
def engine():
    yield from demo_engine(N_CTX)


def _sampling(seed):
    return SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=seed)


def _requests():
    return [JOBS[i % len(JOBS)] for i in range(32)]


def _expected(engine, kind, prompt, seed):
    if kind == "completion":
        return "".join(e.text for e in engine.generate(prompt, max_tokens=MAX_TOKENS,
                                                        sampling=_sampling(seed)))
    text = engine.render_chat([{"role": "user", "content": prompt}])
    out = "".join(e.text for e in engine.generate(text, max_tokens=MAX_TOKENS, sampling=_sampling(seed)))
    r = parse_assistant_output(out, thinking_started=True)
    return (r.reasoning_content or "", r.content)


async def _one(client, kind, prompt, seed):
    common = {"max_tokens": MAX_TOKENS, "temperature": 0.9, "top_k": 40, "top_p": 0.95,
              "min_p": 0.05, "seed": seed, "stream": True}
    if kind == "completion":
        url, body = "/v1/completions", {"prompt": prompt, **common}
    else:
        url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **common}
    text, reasoning, content, done, ids = [], [], [], False, set()
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
                continue
            c = json.loads(line[6:])
            assert "error" not in c, c
            ids.add(c["id"])
            ch = c["choices"][0]
            if kind == "completion":
                text.append(ch["text"])
            else:
                reasoning.append(ch["delta"].get("reasoning_content") or "")
                content.append(ch["delta"].get("content") or "")
    assert done and len(ids) == 1
    return ("".join(text) if kind == "completion" else ("".join(reasoning), "".join(content))), ids.pop()


async def _health_latency(client, stop: asyncio.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        t0 = time.perf_counter()
        r = await client.get("/health")
        assert r.status_code == 200
        worst = max(worst, time.perf_counter() - t0)
        await asyncio.sleep(0.05)
    return worst


def test_32_concurrent_streams(engine):
    from tightfit.server.app import ServerThread, create_app
    reqs = _requests()
    assert len(reqs) == 32 and len(set(reqs)) == 8

    async def main(url):
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=url, timeout=180, limits=limits) as client:
            stop = asyncio.Event()
            probe = asyncio.create_task(_health_latency(client, stop))
            results = await asyncio.gather(*(_one(client, *r) for r in reqs))
            stop.set()
            return results, await probe

    with ServerThread(create_app(engine, queue_size=64)) as srv:
        results, worst = asyncio.run(main(srv.url))
        metrics = httpx.get(srv.url + "/metrics").text
    assert len({rid for _, rid in results}) == 32            # 32 distinct responses
    expected = {job: _expected(engine, *job) for job in set(reqs)}
    for job, (out, _) in zip(reqs, results):
        assert out == expected[job], job
    assert worst < 2.0, f"/health took {worst:.2f}s while generating"
    assert "tightfit:requests_total 32.0" in metrics
