"""Shared fixtures. Model files here are written with gguf-py's GGUFWriter (an outside writer), so
reader tests do not depend on tightfit's own generator."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# a ggml abort inside llama.cpp (an oracle) must fail fast, not hang in its gdb backtrace hook
__import__("os").environ.setdefault("GGML_NO_BACKTRACE", "1")

# CI runs every property test on the same examples (a red CI must be reproducible); locally
# hypothesis explores new ones on every run.
try:
    import os

    from hypothesis import settings as _hsettings
    _hsettings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    if os.environ.get("CI"):
        _hsettings.load_profile("ci")
except ImportError:   # pragma: no cover - hypothesis is a test dependency
    pass


def shared_path(rel: str) -> Path:
    """A file under ../shared, or skip the test when the folder is absent (outside this workplace)."""
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"shared file {p} is absent (tests expect the shared folder at {SHARED})")
    return p


def write_qwen35(path: Path, cfg=None, *, matrix_type: str | Callable[[str], str] = "F32",
                 mtp: bool = False, drop: Iterable[str] = (), shapes: Mapping[str, tuple] | None = None,
                 types: Mapping[str, str] | None = None, meta_override: Mapping[str, tuple] | None = None,
                 meta_drop: Iterable[str] = (), extra_tensors: Mapping[str, tuple] | None = None,
                 n_tokens: int | None = None, tied: bool = False, seed: int = 0) -> Path:
    """Write a qwen35 GGUF with GGUFWriter. Matrices get random bytes of `matrix_type` (a name or
    a function name -> type name); vectors are F32. `shapes`/`types` override single tensors,
    `meta_override` maps key -> (value, GGUFValueType name[, element type name])."""
    import gguf
    from gguf.constants import GGUFValueType as VT
    from tightfit.model.config import TINY, Qwen35Config

    cfg = cfg or TINY
    if mtp and not cfg.nextn_layers:
        cfg = dataclasses.replace(cfg, nextn_layers=1)
    if tied:
        cfg = dataclasses.replace(cfg, tied_output=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="qwen35")   # writes general.architecture itself
    n_tok = cfg.n_vocab if n_tokens is None else n_tokens
    meta = {k: v for k, v in cfg.to_metadata().items() if k != "general.architecture"}
    meta.update({
        "tokenizer.ggml.model": ("gpt2", "STRING"),
        "tokenizer.ggml.pre": ("qwen35", "STRING"),
        "tokenizer.ggml.tokens": ([f"tok{i}" for i in range(n_tok)], "ARRAY_STRING"),
        "tokenizer.ggml.token_type": ([1] * (n_tok - 2) + [3, 3], "ARRAY_INT32"),
        "tokenizer.ggml.merges": (["t o", "to k"], "ARRAY_STRING"),
        "tokenizer.ggml.eos_token_id": (n_tok - 1, "UINT32"),
        "tokenizer.ggml.padding_token_id": (n_tok - 2, "UINT32"),
        "tokenizer.chat_template": ("{% for m in messages %}{{ m.content }}{% endfor %}", "STRING"),
    })
    meta.update(meta_override or {})
    for k in meta_drop:
        meta.pop(k, None)
    for key, spec in meta.items():
        val, tname = spec[0], spec[1]
        if tname.startswith("ARRAY_"):
            w.add_key_value(key, list(val), VT.ARRAY, sub_type=VT[tname[6:]])
        else:
            w.add_key_value(key, val, VT[tname])

    all_shapes = dict(cfg.tensor_shapes(include_mtp=True))
    all_shapes.update(shapes or {})
    all_shapes.update(extra_tensors or {})
    for name in drop:
        all_shapes.pop(name, None)
    for name, ne in all_shapes.items():
        if types and name in types:
            tname = types[name]
        elif Qwen35Config.is_vector_tensor(name):
            tname = "F32"
        else:
            tname = matrix_type(name) if callable(matrix_type) else matrix_type
        qt = gguf.GGMLQuantizationType[tname]
        np_shape = tuple(reversed(ne))
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, rng.standard_normal(np_shape).astype(np.float32))
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, rng.standard_normal(np_shape).astype(np.float16))
        else:
            blck, size = gguf.GGML_QUANT_SIZES[qt]
            byte_shape = np_shape[:-1] + (np_shape[-1] // blck * size,)
            raw = rng.integers(0, 256, size=byte_shape, dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """TINY geometry, F32 vectors, Q8_0/F16 matrices, MTP block: written once per session."""
    def mix(name: str) -> str:
        return "F16" if "ffn_" in name else "Q8_0"
    return write_qwen35(tmp_path_factory.mktemp("tiny") / "tiny-mix-mtp.gguf",
                        matrix_type=mix, mtp=True)


@pytest.fixture
def make_qwen35(tmp_path) -> Callable[..., Path]:
    """Factory: make_qwen35(name="m.gguf", **write_qwen35 kwargs) -> path under tmp_path."""
    def make(name: str = "m.gguf", **kw) -> Path:
        return write_qwen35(tmp_path / name, **kw)
    return make
