"""`GGUFFile`: a validated, read-only view of a GGUF file.

Parsing is gguf-py's `GGUFReader` (read-only memmap). Before it runs, `validate.prescan` walks the
header with bounds checks, so that gguf-py never sees a length that would make it allocate or loop
without end, and every error becomes a one-line `GGUFError`. gguf-py parses arrays one element at
a time (seconds for a 248k-token vocabulary), so `_Reader` takes arrays from the prescan instead:
numeric arrays become one numpy view, string arrays are the prescan's decoded list.

Tensor bytes are never read here: `TensorInfo.raw()` returns a read-only memmap slice, and
`read_header_only` drops even the mapping.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGUFValueType as VT

from tightfit.errors import GGUFError
from tightfit.gguf import validate as V


@dataclass(frozen=True, eq=False)
class TensorInfo:
    name: str
    qtype: int                    # ggml type id
    ne: tuple[int, ...]           # ggml order: ne0 (contiguous) first
    n_elements: int
    nbytes: int
    offset: int                   # absolute file offset of the first byte
    _owner: Any = field(default=None, repr=False, compare=False)

    @property
    def type_name(self) -> str:
        return V.qtype_name(self.qtype)

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """Element shape in numpy (row-major) order: ne reversed."""
        return tuple(reversed(self.ne))

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.ne[0]

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.n_rows

    def raw(self) -> np.ndarray:
        """Read-only uint8 view of exactly this tensor's bytes (no copy, pages load on access)."""
        data = getattr(self._owner, "_data", None)
        if data is None:
            raise GGUFError(f"tensor '{self.name}': its file is closed (or was read header-only)")
        return data[self.offset:self.offset + self.nbytes]

    def rows(self) -> np.ndarray:
        """(n_rows, row_bytes) view: row r is ne0 elements of the r-th row, as stored blocks."""
        return self.raw().reshape(self.n_rows, self.row_bytes)

    def array(self) -> np.ndarray:
        """Typed view in numpy_shape for plain float/int types (F32, F16, F64, I8..I64)."""
        dt = _PLAIN_DTYPES.get(self.qtype)
        if dt is None:
            raise GGUFError(f"tensor '{self.name}' is {self.type_name}; dequantize it with tightfit.quant")
        return self.raw().view(dt).reshape(self.numpy_shape)


_PLAIN_DTYPES = {0: np.float32, 1: np.float16, 28: np.float64, 24: np.int8, 25: np.int16,
                 26: np.int32, 27: np.int64}


class _Reader(GGUFReader):
    """GGUFReader that takes arrays from the prescan (already bounds-checked) and leaves tensor
    building to GGUFFile (gguf-py's enum may lack newer type ids that tightfit.quant knows)."""

    def __init__(self, path: Path, scan: V.Prescan):
        self._arrays = scan.array_by_offset()
        self.tensor_fields: list[Any] = []
        super().__init__(path, "r")

    def _get_field_parts(self, orig_offs: int, raw_type: int):  # type: ignore[override]
        rec = self._arrays.get(orig_offs) if raw_type == VT.ARRAY else None
        if rec is None:
            return super()._get_field_parts(orig_offs, raw_type)
        head = [self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)]
        if rec.etype == VT.STRING:
            # whole region as one part; the decoded strings live in the prescan record
            return rec.size, head + [self._get(orig_offs + 12, np.uint8, rec.size - 12)], [], \
                [VT.ARRAY, VT.STRING]
        vals = self._get(orig_offs + 12, self.gguf_scalar_to_np[rec.etype], rec.count)
        return rec.size, head + [vals], [2], [VT.ARRAY, rec.etype]

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        self.tensor_fields = fields
        self.tensors = []


class GGUFFile:
    """Open and validate a GGUF file.

    Attributes: path, version, alignment, data_offset, file_size, metadata (key -> python value;
    arrays are lists), metadata_types (key -> GGUFValueType), array_types (array key -> element
    GGUFValueType), tensors (name -> TensorInfo, file order).
    """

    def __init__(self, path: str | os.PathLike[str], *, validate: bool = True):
        self.path = Path(path)
        self.name = self.path.name
        self._data: np.ndarray | None = None
        self._reader: _Reader | None = None
        try:
            self.file_size = self.path.stat().st_size
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror or e}") from None
        if self.path.is_dir():
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        if self.file_size < 24:
            raise GGUFError(f"{self.name}: not a GGUF file ({self.file_size} bytes, too short for a header)")

        scan = self._prescan()
        try:
            reader = _Reader(self.path, scan)
        except GGUFError:
            raise
        except Exception as e:  # gguf-py raises ValueError/KeyError/IndexError on bad input
            raise GGUFError(f"{self.name}: gguf-py cannot parse the file: {type(e).__name__}: {e}") from None
        # (if a future gguf-py renames the hooks above, fall back to its own tensor list)
        tfields = reader.tensor_fields or [t.field for t in reader.tensors]
        if reader.data_offset != scan.data_offset or len(tfields) != len(scan.tensors):
            raise GGUFError(f"{self.name}: header parse disagrees with gguf-py (data offset "
                            f"{scan.data_offset} vs {reader.data_offset})")
        self._reader, self._data = reader, reader.data
        self.version, self.alignment = scan.version, scan.alignment
        self.data_offset = scan.data_offset

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, VT] = {}
        self.array_types: dict[str, VT] = {}
        for key, rec in scan.kvs.items():
            f = reader.fields[key]
            self.metadata_types[key] = rec.vtype
            if rec.vtype == VT.ARRAY:
                self.array_types[key] = rec.etype  # type: ignore[assignment]
                self.metadata[key] = rec.strings if rec.strings is not None else f.parts[f.data[0]].tolist()
            else:
                try:
                    self.metadata[key] = f.contents()
                except UnicodeDecodeError:
                    raise GGUFError(f"{self.name}: metadata key '{key}' is not valid UTF-8") from None

        self.tensors: dict[str, TensorInfo] = {}
        for t, fld in zip(scan.tensors, tfields):
            if fld.name != t.name or int(fld.parts[5][0]) != t.rel_offset:
                raise GGUFError(f"{self.name}: tensor '{t.name}' parse disagrees with gguf-py")
            self.tensors[t.name] = TensorInfo(t.name, t.qtype, t.ne, t.n_elements, t.nbytes, t.offset, self)
        if validate:
            V.check_metadata_types(self.metadata, self.metadata_types, self.array_types, self.name)

    def _prescan(self) -> V.Prescan:
        with open(self.path, "rb") as fh:
            try:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError) as e:
                raise GGUFError(f"{self.name}: cannot map file: {e}") from None
        try:
            return V.prescan(mm, self.file_size, self.name)
        finally:
            mm.close()

    # ---- conveniences ---------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def array(self, key: str) -> np.ndarray:
        """A numeric metadata array as a numpy array (no list round trip)."""
        if self.metadata_types.get(key) != VT.ARRAY or self.array_types.get(key) == VT.STRING:
            raise GGUFError(f"{self.name}: metadata key '{key}' is not a numeric array")
        if self._reader is None:
            return np.asarray(self.metadata[key])
        f = self._reader.fields[key]
        return np.asarray(f.parts[f.data[0]])

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    def close(self) -> None:
        """Drop the mapping; views already handed out stay valid until they are freed."""
        self._reader = None
        self._data = None

    @property
    def closed(self) -> bool:
        return self._data is None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")


def read_header_only(path: str | os.PathLike[str], *, validate: bool = True) -> GGUFFile:
    """Metadata and tensor infos without keeping the file mapped (for the planner). Tensor
    `raw()` raises on the result; no tensor data page is ever read."""
    f = GGUFFile(path, validate=validate)
    f.close()
    return f
