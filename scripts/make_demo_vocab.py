"""Extract the demo model's vocabulary (the first 2045 tokens of the Qwen2-size test vocabulary in
../shared/fixtures/ggml-vocab-qwen35.gguf and the merges among them) into tightfit/data, so that an
installed tightfit can build its demo model without the shared folder."""
import gzip
import json
from pathlib import Path

from tightfit.model import generate as G

N = 2048
root = Path(__file__).resolve().parents[1]
tokens, types, merges = G._fixture_vocab(str(G._vocab_fixture_path()))
keep = tokens[: N - 3]
ks = set(keep)
mer = [m for m in merges if (lambda a, b: a in ks and b in ks and a + b in ks)(*m.split(" ", 1))]
out = root / "tightfit" / "data" / "demo-vocab.json.gz"
with gzip.open(out, "wt", encoding="utf-8") as f:
    json.dump({"source": "ggml-vocab-qwen35.gguf (first 2045 tokens)", "tokens": keep,
               "types": [1] * len(keep), "merges": mer}, f, ensure_ascii=False)
print(out, out.stat().st_size, "bytes", len(keep), "tokens", len(mer), "merges")
