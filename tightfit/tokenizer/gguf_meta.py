"""Read the key/value metadata of a GGUF file, fast.

Why not gguf-py's `GGUFReader`: it builds one NumPy view per array element, and a Qwen vocabulary
has ~500,000 strings (tokens + merges), so opening one takes 10-20 s on a small machine. The
tokenizer only needs the header and the key/value section, which this module walks in one pass
(~0.3 s for the real vocabulary). Tensor infos and data are never touched.

`read_metadata(path)` is the single entry point the tokenizer uses; switching to the project's
`tightfit.gguf.reader.GGUFFile(path).metadata` is a one-line change there.
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from tightfit.errors import GGUFError

# GGUF value type ids (gguf spec; same numbering as gguf.GGUFValueType).
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
            7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


def read_metadata(path: str | os.PathLike) -> dict:
    """All key/value pairs of a GGUF file as plain Python values (arrays of numbers as lists)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            # mmap, not read(): a model file is many GB and only its head is metadata.
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:   # ValueError: empty file cannot be mapped
        raise GGUFError(f"{path}: cannot read as GGUF ({getattr(e, 'strerror', None) or e})") from None
    try:
        return _parse(buf)
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
        raise GGUFError(f"{path}: truncated or malformed GGUF metadata ({e})") from None
    finally:
        buf.close()


def _parse(buf: bytes) -> dict:
    if buf[:4] != b"GGUF":
        raise GGUFError("not a GGUF file (bad magic)")
    (version,) = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version} (only little-endian v2/v3)")
    _n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    off = 24
    out: dict = {}
    for _ in range(n_kv):
        key, off = _str(buf, off)
        (vtype,) = struct.unpack_from("<I", buf, off)
        off += 4
        out[key], off = _value(buf, off, vtype)
    return out


def _str(buf: bytes, off: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, off)
    end = off + 8 + n
    if end > len(buf):
        raise GGUFError("string runs past the end of the file")
    return buf[off + 8:end].decode("utf-8"), end


def _value(buf: bytes, off: int, vtype: int):
    if vtype == _STRING:
        return _str(buf, off)
    if vtype in _SCALARS:
        dt = np.dtype(_SCALARS[vtype])
        v = np.frombuffer(buf, dt, 1, off)[0].item()
        return (bool(v) if vtype == _BOOL else v), off + dt.itemsize
    if vtype == _ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if etype == _STRING:
            items = []
            append = items.append
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(n):
                (ln,) = unpack(buf, off)
                append(buf[off + 8:off + 8 + ln].decode("utf-8"))
                off += 8 + ln
            if off > len(buf):
                raise GGUFError("string array runs past the end of the file")
            return items, off
        if etype in _SCALARS:
            dt = np.dtype(_SCALARS[etype])
            if off + n * dt.itemsize > len(buf):
                raise GGUFError("array runs past the end of the file")
            arr = np.frombuffer(buf, dt, n, off)
            vals = arr.astype(bool).tolist() if etype == _BOOL else arr.tolist()
            return vals, off + n * dt.itemsize
        if etype == _ARRAY:   # nested arrays: rare, walk them one by one
            items = []
            for _ in range(n):
                v, off = _value(buf, off, _ARRAY)
                items.append(v)
            return items, off
        raise GGUFError(f"unknown GGUF array element type {etype}")
    raise GGUFError(f"unknown GGUF value type {vtype}")
