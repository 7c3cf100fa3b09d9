"""Shrink a Triton cache to what loading a compiled kernel needs, so it fits the device's 64 MiB carry.

Triton finds a compiled kernel through its group file (`__grp__<name>.json`), which lists every file
the compiler wrote (IR at each level, PTX, the cubin, the metadata). Loading needs only the metadata
and the cubin: a group whose listed files all exist is a hit. This rewrites every group to list those
two and deletes the rest (about 85 % of the bytes). Launcher stubs (*.so) are kept.

    python3 scripts/prune_triton_cache.py .tcache
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP = (".json", ".cubin")


def prune(cache: Path) -> tuple[int, int]:
    groups = removed = 0
    for grp in cache.glob("*/__grp__*.json"):
        data = json.loads(grp.read_text())
        paths = data.get("child_paths") or {}
        keep = {name: p for name, p in paths.items() if name.endswith(KEEP)}
        for name in paths.keys() - keep.keys():
            f = grp.parent / Path(paths[name]).name
            if f.exists():
                f.unlink()
                removed += 1
        data["child_paths"] = keep
        grp.write_text(json.dumps(data))
        groups += 1
    for f in cache.glob("*/*.source"):   # written beside groups by newer Tritons, never read back
        f.unlink()
        removed += 1
    return groups, removed


if __name__ == "__main__":
    g, r = prune(Path(sys.argv[1] if len(sys.argv) > 1 else ".tcache"))
    print(f"pruned Triton cache: {g} kernels kept, {r} files removed")
