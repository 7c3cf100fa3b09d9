"""scripts/prune_triton_cache.py keeps what Triton needs to load a cached kernel (the metadata
and the cubin named in the group file, launcher stubs) and nothing else; a pruned group must
still be a hit for Triton's own FileCacheManager.get_group (every listed file exists)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _prune():
    spec = importlib.util.spec_from_file_location("prune", ROOT / "scripts/prune_triton_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.prune


def test_prune_keeps_metadata_and_cubin(tmp_path, monkeypatch):
    d = tmp_path / "cache" / "HASH1"
    d.mkdir(parents=True)
    names = ["k.json", "k.cubin", "k.ptx", "k.ttir", "k.ttgir", "k.llir", "k.source"]
    for n in names:
        (d / n).write_text(n)
    (d / "__grp__k.json").write_text(json.dumps({"child_paths": {n: str(d / n) for n in names}}))
    (tmp_path / "cache" / "LAUNCH").mkdir()
    (tmp_path / "cache" / "LAUNCH" / "launcher.so").write_bytes(b"\x7fELF")
    groups, removed = _prune()(tmp_path / "cache")
    assert (groups, removed) == (1, 5)
    assert sorted(p.name for p in d.iterdir()) == ["__grp__k.json", "k.cubin", "k.json"]
    assert (tmp_path / "cache" / "LAUNCH" / "launcher.so").exists()
    kept = json.loads((d / "__grp__k.json").read_text())["child_paths"]
    assert sorted(kept) == ["k.cubin", "k.json"]
    # Triton's own lookup accepts the pruned group (None would mean a recompile)
    from triton.runtime.cache import FileCacheManager
    from triton import knobs
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "cache"))
    got = FileCacheManager("HASH1").get_group("k.json")
    assert got is not None and sorted(got) == ["k.cubin", "k.json"]
