"""Assembles the CUDA GEMV translation unit from tightfit/kernels/cuda (CONTRACT.md):
common + tables (cuda/tables.py:tables_source(), if present) + main formats + low-bit formats (if
present) [+ the device kernel]. Used by the NVRTC path (gemv_cuda), the host harness (cuda_host)
and the offline nvcc report."""
from __future__ import annotations

import hashlib
import importlib
import re
from pathlib import Path

CUDA_DIR = Path(__file__).with_name("cuda")
COMMON = "gemv_common.cuh"
MAIN = "gemv_fmt_main.cuh"
LOWBIT = "gemv_fmt_lowbit.cuh"
KERNEL = "gemv_kernel.cuh"

_FMT_RE = re.compile(r"X\(\s*(F_\w+)\s*,\s*(\d+)\s*\)")


def _read(name: str) -> str:
    return (CUDA_DIR / name).read_text()


def tables_source() -> str:
    """C source of the lookup tables (cuda/tables.py, written by the low-bit formats), or ''."""
    try:
        mod = importlib.import_module("tightfit.kernels.cuda.tables")
    except ImportError:
        return ""
    fn = getattr(mod, "tables_source", None)
    return fn() if fn is not None else ""


def has_lowbit() -> bool:
    return (CUDA_DIR / LOWBIT).exists()


def formats_source(with_kernel: bool, lowbit: bool | None = None) -> str:
    """The whole translation unit (without the host driver); lowbit None: include
    gemv_fmt_lowbit.cuh (and tables) when the file exists."""
    lowbit = has_lowbit() if lowbit is None else lowbit
    parts = [f"// ---- {COMMON}\n", _read(COMMON)]
    tab = tables_source() if lowbit else ""
    if tab:
        parts += ["\n// ---- tables.py:tables_source()\n", tab]
    parts += [f"\n// ---- {MAIN}\n", _read(MAIN)]
    if lowbit:
        parts += [f"\n// ---- {LOWBIT}\n", _read(LOWBIT)]
    else:
        parts.append("\n#define TF_LOWBIT_FORMATS(X)\n")
    if with_kernel:
        parts += [f"\n// ---- {KERNEL}\n", _read(KERNEL)]
    return "".join(parts)


def format_list(src: str | None = None) -> list[tuple[str, int]]:
    """[(struct name, GGML type id)] from the TF_MAIN_FORMATS / TF_LOWBIT_FORMATS X-macro lists."""
    src = formats_source(False) if src is None else src
    out: list[tuple[str, int]] = []
    for m in re.finditer(r"#define\s+TF_(?:MAIN|LOWBIT)_FORMATS\(X\)((?:[^\n]*\\\n)*[^\n]*)", src):
        out += [(n, int(t)) for n, t in _FMT_RE.findall(m.group(1))]
    return out


def source_hash(src: str) -> str:
    return hashlib.sha256(src.encode()).hexdigest()[:20]
