"""An installed tightfit (no ../shared folder) still builds its demo model: the packaged demo
vocabulary must equal the shared fixture's first tokens and merges, read by gguf-py."""
from pathlib import Path

import pytest

from tightfit.model import generate as G

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "ggml-vocab-qwen35.gguf"


@pytest.mark.skipif(not FIXTURE.exists(), reason="../shared/fixtures not present outside this workplace")
def test_packaged_demo_vocab_matches_fixture():
    import gguf
    r = gguf.GGUFReader(str(FIXTURE))
    f = r.fields["tokenizer.ggml.tokens"]
    first = [bytes(f.parts[i]).decode() for i in f.data[:2045]]
    tokens, types, merges = G._packaged_demo_vocab()
    assert tokens == first
    m = r.fields["tokenizer.ggml.merges"]
    ks = set(first)
    # every packaged merge is a fixture merge among kept tokens, in the fixture's order
    fixture_merges = [bytes(m.parts[i]).decode() for i in m.data[:20000]]
    expected = [x for x in fixture_merges if all(p in ks for p in x.split(" ", 1)) and x.replace(" ", "", 1) in ks]
    assert merges[: len(expected)] == expected[: len(merges)]
    assert len(merges) > 1500


def test_demo_model_builds_without_shared_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "shared_file", lambda rel, env=None: None)
    from tightfit.tokenizer import from_gguf
    from tightfit.tokenizer.chat import ChatTemplate
    path = tmp_path / "demo.gguf"
    G.make_model(path, preset="tiny", seed=1, qtype="Q8_0", vocab="small:2048")
    tok = from_gguf(str(path))
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
    from tightfit.gguf import GGUFFile
    with GGUFFile(str(path)) as f:
        tpl = f.metadata["tokenizer.chat_template"]
    text = ChatTemplate(tpl).render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
