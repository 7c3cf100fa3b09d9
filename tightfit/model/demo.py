"""The built-in demo model: what `tightfit run` uses when no -m is given.

A tiny qwen35 file with RANDOM weights (its text is gibberish; it only shows the engine working)
and a real byte-level BPE vocabulary: the first 2045 tokens of the Qwen vocabulary plus the three
ChatML control tokens, and the Qwen3.5 chat template. It is generated once into the user cache
directory ($TIGHTFIT_CACHE, else $XDG_CACHE_HOME/tightfit, else ~/.cache/tightfit) and generated
again when it is missing or its bytes no longer match the sha256 recorded beside it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tightfit.errors import UserError

#: Generator arguments of the demo model (stored beside it; a change triggers regeneration).
DEMO_ARGS = dict(preset="tiny", seed=20260101, qtype="Q8_0", vocab="small:2048", mtp=False, tied=False)
DEMO_NAME = "demo-tiny-q8_0.gguf"


def cache_dir() -> Path:
    env = os.environ.get("TIGHTFIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tightfit" if xdg else Path.home() / ".cache" / "tightfit"


def _valid(path: Path, side: Path) -> bool:
    from tightfit.model.generate import sha256_file

    if not path.exists() or not side.exists():
        return False
    try:
        info = json.loads(side.read_text())
    except (OSError, ValueError):
        return False
    return info.get("args") == DEMO_ARGS and info.get("sha256") == sha256_file(path)


def demo_model_path(regenerate: bool = False) -> Path:
    """Path of the demo GGUF, generating it first if needed (about a second)."""
    from tightfit.model.generate import make_model, sha256_file

    d = cache_dir()
    path, side = d / DEMO_NAME, d / (DEMO_NAME + ".json")
    if not regenerate and _valid(path, side):
        return path
    try:
        d.mkdir(parents=True, exist_ok=True)
        make_model(path, **DEMO_ARGS)          # writes a .partial then renames: never half a file
    except OSError as e:
        raise UserError(f"cannot write the demo model into {d}: {e.strerror or e} "
                        "(set TIGHTFIT_CACHE to a writable directory)") from None
    side.write_text(json.dumps({"args": DEMO_ARGS, "sha256": sha256_file(path)}, indent=1))
    return path
