"""`tightfit tokenize` / `tightfit detokenize`. Expected ids come from llama.cpp's test vectors for
the fixture vocabulary (the .inp/.out pair), not from our code."""
from __future__ import annotations

import json

import pytest

from test_tokenizer_corpus import FIXTURE
from tightfit.cli import main

pytestmark = pytest.mark.skipif(not FIXTURE.is_file(), reason=f"shared fixture {FIXTURE} absent")

SEP = "\n__ggml_vocab_test__\n"


def _vector(text: str) -> list[int]:
    inp = FIXTURE.with_name(FIXTURE.name + ".inp").read_text(encoding="utf-8")[:-len(SEP)].split(SEP)
    out = FIXTURE.with_name(FIXTURE.name + ".out").read_text(encoding="utf-8").split("\n")
    return [int(x) for x in out[inp.index(text)].split()]


def run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_tokenize_plain_and_json(capsys):
    want = _vector("Hello world")
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "Hello world")
    assert rc == 0 and out.split() == [str(i) for i in want]
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "--json", "Hello world")
    assert rc == 0 and json.loads(out) == want
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "--count", "Hello world")
    assert out.strip() == str(len(want))


def test_tokenize_stdin_file_and_specials(capsys, tmp_path, monkeypatch):
    text = " this is 🦙.cpp"
    f = tmp_path / "t.txt"
    f.write_bytes(text.encode())
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "--json", "-f", str(f))
    assert json.loads(out) == _vector(text)
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "--json", "<|im_end|>")
    assert json.loads(out) == [151645]          # parsed by default, like llama-tokenize
    rc, out, _ = run(capsys, "tokenize", "-m", str(FIXTURE), "--json", "--no-parse-special",
                     "<|im_end|>")
    assert len(json.loads(out)) > 1


def test_detokenize(capsys):
    ids = _vector("Hello, world!")
    rc, out, _ = run(capsys, "detokenize", "-m", str(FIXTURE), *map(str, ids))
    assert rc == 0 and out == "Hello, world!\n"
    rc, out, _ = run(capsys, "detokenize", "-m", str(FIXTURE), json.dumps(ids + [151645]))
    assert out == "Hello, world!<|im_end|>\n"
    rc, out, _ = run(capsys, "detokenize", "-m", str(FIXTURE), "--no-special", "-n",
                     ",".join(map(str, ids + [151645])))
    assert out == "Hello, world!"


@pytest.mark.parametrize("argv,msg", [
    (["detokenize", "-m", str(FIXTURE), "99999999"], "outside the vocabulary"),
    (["detokenize", "-m", str(FIXTURE), "12", "abc"], "not a token id"),
    (["detokenize", "-m", str(FIXTURE)], "no token ids"),
    (["tokenize", "-m", "/nonexistent/model.gguf", "hi"], "cannot read"),
    (["tokenize", "-m", str(FIXTURE)], "exactly one of"),
])
def test_errors_are_one_line(capsys, argv, msg):
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_invalid_utf8_file(capsys, tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"abc\xff")
    rc, _, err = run(capsys, "tokenize", "-m", str(FIXTURE), "-f", str(f))
    assert rc == 1 and "not valid UTF-8" in err


def test_default_model(capsys, tmp_path, monkeypatch):
    """Without -m the demo model is used (when that module exists)."""
    pytest.importorskip("tightfit.model.demo")
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    rc, out, err = run(capsys, "tokenize", "--json", "hi")
    assert rc == 0 and isinstance(json.loads(out), list) and "demo model" in err
