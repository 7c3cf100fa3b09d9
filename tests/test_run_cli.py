"""`tightfit run` end to end, as a user runs it (subprocess), against llama.cpp's greedy decode of
the same F32 file recorded in tests/goldens/manifest.json (regenerated here, sha256-checked)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tightfit.model.generate import make_model, sha256_file

# The golden files' bytes include the shared vocabulary fixture and chat template: without the
# shared folder the regenerated files cannot match what llama.cpp saw.
_SHARED = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared"
pytestmark = pytest.mark.skipif(not (_SHARED / "fixtures" / "Qwen3.5-4B.jinja").exists(),
                                reason=f"shared fixtures (vocabulary, chat template) not found at {_SHARED}")


ROOT = Path(__file__).resolve().parents[1]
MANIFEST = json.loads((ROOT / "tests" / "goldens" / "manifest.json").read_text())
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def tightfit(*args, check=True, env=None):
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", *args], capture_output=True, text=True,
                       env=env or ENV, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    case = next(c for c in MANIFEST["cases"] if c["id"] == "tiny-F32")
    path = tmp_path_factory.mktemp("run") / "tiny-F32.gguf"
    make_model(path, **case["args"])
    assert sha256_file(path) == case["sha256"], "generator no longer reproduces the bytes llama.cpp saw"
    return path, case["greedy"]


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_greedy_run_equals_llama_cpp(tiny_f32, kv):
    path, g = tiny_f32
    n = len(g["ids"])
    assert n >= 32
    r = tightfit("run", "-m", str(path), "--prompt-ids", " ".join(map(str, g["prompt"])), "-n", str(n),
                 "--temp", "0", "--kv-type", kv, "--ignore-eos", "--show-ids")
    ids_line = [ln for ln in r.stderr.splitlines() if ln.startswith("ids: ")][-1]
    assert [int(t) for t in ids_line[5:].split()] == g["ids"]
    assert "generated: 40 tokens" in r.stderr and "tok/s" in r.stderr
    assert "speculative:" not in r.stderr


SPEC_LINE = re.compile(r"^speculative: (\d+) rounds, (\d+) with a draft \| drafted (\d+), accepted (\d+) "
                       r"\((?:[\d.]+ %|-)\)(?: \| (.*))?$")


@pytest.mark.parametrize("spec", [["--spec", "ngram,suffix"], ["--spec", "suffix", "--draft-max", "2"]])
def test_speculative_run_equals_llama_cpp(tiny_f32, spec):
    """--spec: the same greedy ids as llama.cpp's plain decode, and the counters on one line whose
    numbers add up. The greedy continuation loops, so the drafters have matches to offer; how many
    rounds draft is the cost-aware policy's choice (measured round times), so only the sums are
    checked, per drafter where any drafted."""
    path, g = tiny_f32
    n = len(g["ids"])
    r = tightfit("run", "-m", str(path), "--prompt-ids", " ".join(map(str, g["prompt"])), "-n", str(n),
                 "--temp", "0", "--ignore-eos", "--show-ids", *spec)
    ids_line = [ln for ln in r.stderr.splitlines() if ln.startswith("ids: ")][-1]
    assert [int(t) for t in ids_line[5:].split()] == g["ids"]
    lines = [SPEC_LINE.match(ln) for ln in r.stderr.splitlines() if ln.startswith("speculative:")]
    assert len(lines) == 1 and lines[0], r.stderr
    rounds, with_draft, drafted, accepted = (int(x) for x in lines[0].groups()[:4])
    # every round emits one target token plus its accepted drafts; the first token is prefill's
    assert rounds + accepted == n - 1
    assert with_draft <= rounds and accepted <= drafted
    if with_draft:
        per = dict(x.rsplit(" ", 1) for x in lines[0].group(5).split(", "))
        assert set(per) <= set(spec[1].split(","))
        assert sum(int(v.split("/")[0]) for v in per.values()) == accepted
        assert sum(int(v.split("/")[1]) for v in per.values()) == drafted
        if "--draft-max" in spec:
            assert drafted <= with_draft * int(spec[spec.index("--draft-max") + 1])


def test_run_without_model_uses_demo(tmp_path):
    env = dict(ENV, TIGHTFIT_CACHE=str(tmp_path))
    r = tightfit("run", "-p", "Hello", "-n", "4", "--temp", "0", env=env)
    assert "demo model" in r.stderr and "RANDOM" in r.stderr
    assert r.stdout.startswith("Hello")
    assert (tmp_path / "demo-tiny-q8_0.gguf").exists()


@pytest.mark.parametrize("args,needle", [
    (["-p", ""], "prompt is empty"),
    (["--prompt-ids", "1 2 999999"], "outside the vocabulary"),
    (["--prompt-ids", "a b"], "expected integers"),
    (["-p", "word " * 300, "-c", "64"], "context"),
    (["-p", "x", "--temp", "-1"], "temperature"),
    (["-p", "x", "--spec", "ngram,lookahead"], "unknown drafter"),
    (["-p", "x", "--spec", "mtp"], "no MTP block"),
    (["-p", "x", "--spec", "ngram", "--draft-max", "0"], "--draft-max must be >= 1"),
])
def test_bad_input_is_one_line_error(tiny_f32, args, needle):
    path, _ = tiny_f32
    r = tightfit("run", "-m", str(path), *args, check=False)
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_model_of_another_arch_is_refused(tmp_path):
    import gguf
    p = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = tightfit("run", "-m", str(p), "-p", "hi", check=False)
    assert r.returncode != 0 and "qwen35" in r.stderr and "Traceback" not in r.stderr
