"""Speculative decoding benchmark (issue 10): acceptance and tok/s, plain vs speculative.

  python3 bench/spec.py --model M.gguf --device cuda --max-tokens 256
  python3 bench/spec.py --device cuda --force-accept 0.0,0.5,0.8,1.0 --synth-k 2,4,8   # forced mode
  python3 bench/spec.py --device cpu                     # tiny synthetic model with MTP, on CPU

Without --model a synthetic model is generated (--preset, default tiny, with an MTP block).
On CUDA the engine uses the GPU executor (`tightfit.model.executor.GPUModel`) through
`load_engine(device=cuda)`; its verifier is chosen by `make_verifier` ('step' for one-token
step executors: sequential verify with early exit, so it shows the drafting overhead and the
acceptance but no batching gain until the executor has a multi-token verify step). The MTP head
runs on the same device from its own weights (`--mtp`).

Modes:
* real: drafters (--drafters ngram,suffix[,mtp]) on the prompt set, greedy; checks that the
  speculative tokens equal the plain ones and prints acceptance per drafter and tok/s;
* forced acceptance (--force-accept r[,r..] with --synth-k k[,k..]): a synthetic drafter drafts
  k tokens every round and each is accepted with probability r regardless of the target
  (llama.cpp's --spec-synth-*): the upper bound the verify path allows at that acceptance.
Prints a table last; JSON lines go to --out/spec.jsonl when --out is given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from tightfit.runtime.sampler import GREEDY  # noqa: E402
from tightfit.runtime.spec import SpecConfig, SpeculativeEngine, SuffixCache  # noqa: E402

SEED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "seeds")

CODE = ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
        "def fib_memo(n, memo={}):\n    if n in memo:\n        return memo[n]\n    if n < 2:\n"
        "        return n\n    memo[n] = fib_memo(n - 1) + fib_memo(n - 2)\n    return memo[n]\n\n"
        "Rewrite fib_memo with functools.lru_cache and keep the same docstring style:\n")
PROSE = "Explain in three short paragraphs why speculative decoding helps a memory-bound GPU.\n"


def prompts(engine, n_ctx: int) -> dict[str, list[int]]:
    out = {"code": CODE, "prose": PROSE}
    try:
        seeds = sorted(f for f in os.listdir(SEED) if f.startswith("004_"))
        if seeds:
            with open(os.path.join(SEED, seeds[0]), encoding="utf-8") as f:
                out["zh-seed004"] = f.read()[:1500] + "\n总结上文：\n"
    except OSError:
        pass
    ids = {}
    for k, v in out.items():
        t = engine.encode_prompt(v)[: n_ctx // 2]
        ids[k] = t
    return ids


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_one(gen, ids, max_tokens, device):
    sync(device)
    t = time.perf_counter()
    last = None
    for ev in gen(ids, max_tokens=max_tokens, sampling=GREEDY):
        last = ev
    sync(device)
    dt = time.perf_counter() - t
    tm = last.timings
    return last, dt, tm.predicted_n / (tm.predicted_ms / 1000.0) if tm.predicted_ms else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--qtype", default="Q8_0")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--drafters", default="ngram,suffix,mtp")
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--mtp-draft", type=int, default=3)
    ap.add_argument("--verifier", default="auto")
    ap.add_argument("--force-accept", default="")
    ap.add_argument("--synth-k", default="4")
    ap.add_argument("--repeat", type=int, default=2, help="requests per prompt (the 2nd sees the suffix cache)")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.manual_seed(0)

    from tightfit.runtime.loader import load_engine
    path = a.model
    if path is None:
        from tightfit.model.generate import make_model
        path = os.path.join(tempfile.mkdtemp(), f"spec-{a.preset}.gguf")
        make_model(path, preset=a.preset, qtype=a.qtype, mtp=True, vocab="small:2048", seed=1)
    kw = {"n_ctx": a.n_ctx}
    engine = load_engine(path, device=a.device, **kw)
    dev = a.device
    print(f"model {path} device {dev} executor {type(engine.model).__name__}", flush=True)

    mtp_head = None
    drafters = tuple(x for x in a.drafters.split(",") if x)
    if "mtp" in drafters and engine.config.nextn_layers and dev != "cpu":
        from tightfit.runtime.spec.mtp import MTPHead
        mtp_head = MTPHead.from_model_file(engine.file, device=dev)
    rows = []
    outf = open(os.path.join(a.out, "spec.jsonl"), "w") if a.out else None

    def emit(rec):
        rows.append(rec)
        if outf:
            outf.write(json.dumps(rec) + "\n")
            outf.flush()

    P = prompts(engine, a.n_ctx)
    # warm-up (graph capture, JIT)
    list(engine.generate(P["prose"][:8], max_tokens=4, sampling=GREEDY))
    if a.force_accept:
        for k in (int(x) for x in a.synth_k.split(",")):
            cfg = SpecConfig(drafters=("synthetic",), max_draft=k, adaptive=False, verifier=a.verifier)
            for r in (float(x) for x in a.force_accept.split(",")):
                cfg.force_accept = r
                se = SpeculativeEngine(engine, cfg)
                ids = P["prose"]
                base, tb, tps0 = run_one(engine.generate, ids, a.max_tokens, dev)
                last, ts, tps = run_one(se.generate, ids, a.max_tokens, dev)
                d = last.timings.as_dict()
                emit(dict(mode="forced", k=k, rate=r, plain_tps=tps0, spec_tps=tps,
                          speedup=tps / tps0 if tps0 else 0, acc=d["draft_acceptance"],
                          rounds=d["spec_rounds"], verify_ms=d["verify_ms"]))
                print(json.dumps(rows[-1]), flush=True)
    else:
        cache = SuffixCache()
        cfg = SpecConfig(drafters=drafters, max_draft=a.max_draft, mtp_draft=a.mtp_draft,
                         suffix_cache=cache, verifier=a.verifier)
        se = SpeculativeEngine(engine, cfg, mtp_head=mtp_head)
        for name, ids in P.items():
            for rep in range(a.repeat):
                base, tb, tps0 = run_one(engine.generate, ids, a.max_tokens, dev)
                last, ts, tps = run_one(se.generate, ids, a.max_tokens, dev)
                d = last.timings.as_dict()
                emit(dict(mode="real", prompt=name, rep=rep, n=len(last.tokens),
                          same=last.tokens == base.tokens, plain_tps=tps0, spec_tps=tps,
                          speedup=tps / tps0 if tps0 else 0, acc=d["draft_acceptance"],
                          draft_n=d["draft_n"], draft_n_accepted=d["draft_n_accepted"],
                          rounds=d["spec_rounds"], draft_ms=d["draft_ms"], verify_ms=d["verify_ms"],
                          drafters=d["drafters"]))
                print(json.dumps(rows[-1]), flush=True)
    print()
    print(f"{'mode':7} {'what':14} {'plain t/s':>9} {'spec t/s':>9} {'x':>5} {'acc':>5}  same")
    for r in rows:
        what = r.get("prompt", f"k={r.get('k')} r={r.get('rate')}") + (f"#{r['rep']}" if "rep" in r else "")
        print(f"{r['mode']:7} {what:14} {r['plain_tps']:9.1f} {r['spec_tps']:9.1f} {r['speedup']:5.2f} "
              f"{r['acc']:5.2f}  {r.get('same', '-')}")
    return 0 if all(r.get("same", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
