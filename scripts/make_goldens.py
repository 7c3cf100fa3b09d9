#!/usr/bin/env python3
"""Record llama.cpp's logits on synthetic qwen35 files as golden fixtures (tests/goldens/).

For every case below: generate the GGUF (and its exact-F32 twin) with tightfit.model.generate,
evaluate both with llama.cpp through llama-cpp-python on the CPU, and save per-position logits
for one fixed token sequence: a 20-token prompt as one batch, then 8 tokens one at a time.
Each case runs in its own subprocess, because llama.cpp aborts the process on some bad inputs.

Settings (recorded in manifest.json): flash attention OFF, 2 threads, F32 K and V cache
(type_k = type_v = GGML_TYPE_F32 = 0, so the twin logits are plain float math), n_ctx 64,
n_batch = n_ubatch = 64, CPU weight repacking left at its default (on), seed 0.

Batch-size-dependent kernels (spec/gguf-synthetic-traps.md §5): for K/IQ weights llama.cpp's CPU
uses the tiled matmul when a ubatch has >= 8 rows and vec_dot otherwise; they quantize the
activations differently. Here positions 0..19 (one 20-row ubatch) took the tiled path and
positions 20..27 (1-row ubatches) the vec_dot path. Compare an engine's prefill with the first and
its decode with the second; expect ~5-7 % of the logit std between the two paths.

Usage: python scripts/make_goldens.py [--only ID ...] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "goldens"
N_PROMPT, N_DECODE, N_GREEDY = 20, 8, 40
TOKENS = np.random.default_rng(1234).integers(0, 997, N_PROMPT + N_DECODE).tolist()  # real BPE ids of small:1000
LLAMA_SETTINGS = dict(n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2, n_threads_batch=2, logits_all=True,
                      flash_attn=False, type_k=0, type_v=0, seed=0, verbose=False)

UNIFORM = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
           "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "TQ1_0",
           "TQ2_0", "MXFP4"]


def _case(cid: str, twin: bool = True, greedy: bool = False, **args) -> dict:
    a = dict(preset="small", seed=1, qtype=None, mix=None, vocab="small:1000", mtp=False, tied=False, layers=None)
    a.update(args)
    return {"id": cid, "args": a, "twin": twin, "greedy": greedy}


CASES = [_case(f"small-{t}", qtype=t, twin=(t != "F32"), greedy=(t == "F32")) for t in UNIFORM] + [
    _case("tiny-F32", preset="tiny", qtype="F32", twin=False, greedy=True),
    _case("tiny-Q8_0", preset="tiny", qtype="Q8_0", seed=2),
    _case("tiny-IQ4_NL-tied", preset="tiny", qtype="IQ4_NL", seed=3, tied=True),
    _case("small-seedmix-mtp", mix="seedmix", seed=4, mtp=True),
    _case("small-cover-mtp", mix="cover", seed=5, mtp=True),
    _case("small-cover-tied", mix="cover", seed=6, tied=True),
    _case("small-mqa-Q4_K-tied", preset="small-mqa", qtype="Q4_K", seed=7, tied=True),
    _case("small-mqa-F32-tied", preset="small-mqa", qtype="F32", seed=8, tied=True, twin=False),
    _case("small-mha-Q6_K-mtp", preset="small-mha", qtype="Q6_K", seed=9, mtp=True),
    _case("small-odd-IQ4_XS", preset="small-odd", qtype="IQ4_XS", seed=10),
    _case("small-odd-F16-mtp", preset="small-odd", qtype="F16", seed=11, mtp=True),
    # 27B geometry (E=5120, D=256, 16/48 GDN heads), 4-layer slice of the seed-mix recipe
    _case("27b-slice4-seedmix", preset="qwen3.8-27b-seedmix", layers=4, seed=12, twin=False),
    # the real 248,320-row vocabulary (only the first 1000 logit columns are stored, plus argmax)
    _case("tiny-Q8_0-realvocab", preset="tiny", qtype="Q8_0", seed=13, vocab="real", twin=False),
]
STORE_COLS = 1000


def _run_llama(path: str, greedy: bool) -> dict:
    from llama_cpp import Llama

    llm = Llama(path, **LLAMA_SETTINGS)
    V = llm.n_vocab()
    llm.eval(TOKENS[:N_PROMPT])
    rows = [np.array(llm.scores[i], dtype=np.float32) for i in range(N_PROMPT)]
    for t in TOKENS[N_PROMPT:]:
        llm.eval([t])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
    out = {"logits": np.stack(rows), "n_vocab": V}
    if greedy:
        llm.reset()
        llm.eval(TOKENS[:N_PROMPT])
        ids, margins = [], []
        last = np.array(llm.scores[N_PROMPT - 1], dtype=np.float32)
        for _ in range(N_GREEDY):
            top2 = np.sort(last)[-2:]
            nxt = int(np.argmax(last))
            ids.append(nxt)
            margins.append(float(top2[1] - top2[0]))
            llm.eval([nxt])
            last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        out["greedy"] = {"prompt": TOKENS[:N_PROMPT], "ids": ids, "top1_top2_margin": margins}
    return out


def child(case: dict, workdir: Path) -> dict:
    """Generate, evaluate and save one case (runs in a subprocess)."""
    from tightfit.model.generate import make_model, sha256_file

    a = case["args"]
    q = workdir / f"{case['id']}.gguf"
    tw = workdir / f"{case['id']}.f32.gguf" if case["twin"] else None
    t0 = time.time()
    make_model(q, a["preset"], seed=a["seed"], qtype=a["qtype"], mix=a["mix"], vocab=a["vocab"], mtp=a["mtp"],
               tied=a["tied"], layers=a["layers"], f32_twin_path=tw)
    res: dict = {"id": case["id"], "args": a, "sha256": sha256_file(q), "bytes": q.stat().st_size,
                 "gen_s": round(time.time() - t0, 2)}
    r = _run_llama(str(q), case["greedy"])
    arrays = {"tokens": np.array(TOKENS, dtype=np.int32), "logits": r["logits"]}
    if "greedy" in r:
        res["greedy"] = r["greedy"]
    L = r["logits"]
    res["stats"] = {"logit_std": float(L.std()), "n_vocab": r["n_vocab"]}
    if L.shape[1] > STORE_COLS:   # keep the npz small: leading columns, plus each row's argmax/max
        res["full_row_argmax"] = L.argmax(1).tolist()
        res["full_row_max"] = L.max(1).tolist()
        arrays["logits"] = L = np.ascontiguousarray(L[:, :STORE_COLS])
    if tw is not None:
        res["twin_sha256"] = sha256_file(tw)
        T = _run_llama(str(tw), False)["logits"]
        arrays["logits_twin"] = T
        d = np.abs(L - T) / float(T.std())
        res["stats"].update(twin_logit_std=float(T.std()), quant_vs_twin_max=float(d.max()),
                            quant_vs_twin_rms=float(np.sqrt((d ** 2).mean())),
                            quant_vs_twin_argmax_agree=float((L.argmax(1) == T.argmax(1)).mean()))
    np.savez_compressed(OUT / f"{case['id']}.npz", **arrays)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="case ids to (re)do; others are kept from manifest.json")
    ap.add_argument("--keep", help="keep the generated GGUFs in this directory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        res = child(json.loads(a.child), Path(a.workdir))
        print("RESULT " + json.dumps(res))
        return 0

    import llama_cpp

    OUT.mkdir(parents=True, exist_ok=True)
    man_path = OUT / "manifest.json"
    old = json.loads(man_path.read_text()) if man_path.exists() else {}
    done = {c["id"]: c for c in old.get("cases", [])}
    refused = dict(old.get("refused", {}))
    todo = [c for c in CASES if not a.only or c["id"] in a.only]
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(a.keep or tmp)
        wd.mkdir(parents=True, exist_ok=True)
        for c in todo:
            t0 = time.time()
            p = subprocess.run([sys.executable, __file__, "--child", json.dumps(c), "--workdir", str(wd)],
                               env=env, capture_output=True, text=True, timeout=900)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
                refused[c["id"]] = {"args": c["args"], "rc": p.returncode, "error": tail[-300:]}
                done.pop(c["id"], None)
                print(f"{c['id']}: REFUSED/FAILED rc={p.returncode}: {tail[-200:]}", flush=True)
                continue
            refused.pop(c["id"], None)
            done[c["id"]] = json.loads(line[-1][7:])
            s = done[c["id"]]["stats"]
            print(f"{c['id']}: ok in {time.time() - t0:.1f}s {json.dumps(s)}", flush=True)
            for f in wd.glob(f"{c['id']}*.gguf"):
                if not a.keep:
                    f.unlink()
    order = [c["id"] for c in CASES]
    manifest = {
        "what": "llama.cpp logits on synthetic qwen35 files made by tightfit.model.generate.make_model(**args)",
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "llama_settings": {k: v for k, v in LLAMA_SETTINGS.items()},
        "settings_notes": [
            "flash attention OFF; K and V cache F32 (type 0); CPU weight repacking at its default (on)",
            "logits in each .npz: float32 [28, n_vocab]; 'logits' = the quantized file, 'logits_twin' = "
            "its exact-F32 twin (absent when the file itself is all F32)",
            "positions 0..19: one 20-token batch (one ubatch of 20 rows); positions 20..27: one token "
            "per eval (1-row ubatches)",
            "batch-size-dependent kernels: for K/IQ (and Q8_0/IQ4_NL) weights llama.cpp CPU quantizes "
            "activations (Q8_K / Q8_0); ubatches of >= 8 rows use the tiled matmul, smaller ones "
            "vec_dot, which quantize differently (5-7 % of logit std max). Compare prefill with "
            "positions 0..19 and single-token decode with 20..27.",
            "expected tolerances for an engine in float32: vs logits_twin ~1e-3 of std; vs quantized "
            "logits ~10 % of std max / 2 % rms, argmax agreement >= 90 % (see stats per case)",
            "cases whose n_vocab exceeds 1000 (the real vocabulary) store only logit columns 0..999; "
            "'full_row_argmax' / 'full_row_max' give each row's argmax and max over the whole vocabulary",
            "MTP blocks are in the files but llama-cpp-python cannot run the MTP head: only main logits",
        ],
        "tokens": TOKENS, "n_prompt": N_PROMPT, "n_decode": N_DECODE,
        "cases": [done[i] for i in order if i in done],
        "refused": refused,
    }
    man_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {man_path}: {len(manifest['cases'])} cases, refused: {sorted(refused)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
