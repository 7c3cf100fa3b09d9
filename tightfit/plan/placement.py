"""Which tensors, and which rows of them, live where (seed 000 '实测' §3, seed 004 §1.1).

The planner works on an *inventory*: name, ggml type, `ne` and exact byte count of every tensor,
taken either from a GGUF header (never the weight data) or from a named preset. A `Placement` then
says, per tensor, which row ranges sit in the device arena (at which offset) and which are read in
place from the read-only mmap of the file. `rowsplit.check_exact_cover` proves a placement valid.
"""
from __future__ import annotations

from functools import lru_cache

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tightfit.errors import GGUFError, UserError
from tightfit.model.config import ConfigError, Qwen35Config, QWEN35_27B, TINY

#: Every region of the arena starts at a multiple of this. 256 B covers the widest vector load of
#: any GEMV kernel and the CUDA allocator's own granularity for sub-buffers; on the 27B seed mix it
#: costs exactly the "6KB 对齐损耗" of seed 000 (48 ssm_dt + 48 ssm_a vectors of 192 B, 64 B each).
ARENA_ALIGN = 256

GPU = "gpu"
HOST = "host"


# ---- type sizes ------------------------------------------------------------------------------
def _quant_size(qtype: int) -> tuple[int, int]:
    """(elements per block, bytes per block). tightfit.quant.traits is the project table; gguf-py's
    GGML_QUANT_SIZES is the fallback while that module is in flux."""
    try:
        from tightfit.quant.traits import traits
        t = traits(int(qtype))
        return t.block_size, t.type_size
    except ImportError:  # pragma: no cover - only before tightfit.quant lands
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        return GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))]


def type_name(qtype: int) -> str:
    try:
        from tightfit.quant.traits import traits
        return traits(int(qtype)).name
    except (ImportError, UserError):
        return str(qtype)


def type_id(name: str) -> int:
    from gguf.constants import GGMLQuantizationType
    return int(GGMLQuantizationType[name])


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as the planner sees it. `offset` is the absolute byte offset of its data in the
    file (None for presets, which have no file)."""
    name: str
    qtype: int
    ne: tuple[int, ...]
    nbytes: int
    offset: int | None = None

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        # ggml nb1 = ne0 / block_size * type_size; a row is always whole blocks (quant-formats §4.1)
        bs, ts = _quant_size(self.qtype)
        return self.ne[0] // bs * ts

    @property
    def block_bytes(self) -> int:
        return _quant_size(self.qtype)[1]

    @property
    def is_matrix(self) -> bool:
        return len(self.ne) >= 2 and self.ne[1] > 1

    @property
    def layer(self) -> int | None:
        if self.name.startswith("blk."):
            return int(self.name.split(".")[1])
        return None


def spec_for(name: str, qtype: int, ne: Iterable[int], offset: int | None = None) -> TensorSpec:
    ne = tuple(int(d) for d in ne)
    bs, ts = _quant_size(qtype)
    if ne[0] % bs:
        raise GGUFError(f"tensor {name}: row length {ne[0]} is not a multiple of the "
                        f"{type_name(qtype)} block size {bs}")
    n = 1
    for d in ne:
        n *= d
    return TensorSpec(name, int(qtype), ne, n // bs * ts, offset)


@dataclass
class ModelInventory:
    config: Qwen35Config
    tensors: dict[str, TensorSpec]
    source: str                  # file path or "preset:<name>"
    path: str | None = None      # the GGUF file, when there is one

    def needed(self, include_mtp: bool = False) -> list[TensorSpec]:
        """Tensors the executor reads. In single-token mode the MTP (nextn) blocks are validated
        but never uploaded (seed 000 '实测' §1)."""
        return [t for t in self.tensors.values()
                if include_mtp or t.layer is None or t.layer < self.config.n_layer]

    def excluded(self, include_mtp: bool = False) -> list[TensorSpec]:
        keep = {t.name for t in self.needed(include_mtp)}
        return [t for t in self.tensors.values() if t.name not in keep]


# ---- presets ---------------------------------------------------------------------------------
def seed_mix_type(name: str, cfg: Qwen35Config) -> str:
    """Quant type of a tensor in the benchmark mix of shared/bench/seed-mix.md: the generator's
    recipe (tightfit.model.presets), so the planner and the generated file never disagree."""
    types = _seed_mix_types(cfg)
    if name not in types:
        raise ConfigError(f"seed mix has no type for tensor {name}")
    return types[name]


@lru_cache(maxsize=4)
def _seed_mix_types(cfg: Qwen35Config) -> dict[str, str]:
    from tightfit.model.presets import tensor_types
    return tensor_types(cfg, mix="seedmix")


def _tiny_mix(name: str, cfg: Qwen35Config) -> str:
    return "F32" if cfg.is_vector_tensor(name) else "Q8_0"


def _preset_27b_seedmix() -> tuple[Qwen35Config, Callable[[str, Qwen35Config], str]]:
    from dataclasses import replace
    return replace(QWEN35_27B, nextn_layers=1), seed_mix_type


def _preset_27b_ternary() -> tuple[Qwen35Config, Callable[[str, Qwen35Config], str]]:
    from tightfit.model.presets import tensor_types

    def ternary(name: str, cfg: Qwen35Config) -> str:
        return tensor_types(cfg, mix="ternary")[name]
    return QWEN35_27B, ternary


PRESETS: dict[str, Callable[[], tuple[Qwen35Config, Callable[[str, Qwen35Config], str]]]] = {
    # The benchmark model of shared/bench/seed-mix.md, with its MTP block (blk.64).
    "qwen3.8-27b-seedmix": _preset_27b_seedmix,
    # The 8 GB card's model (seed 004): every matrix ternary (TQ2_0), generator's recipe.
    "qwen3.8-27b-ternary": _preset_27b_ternary,
    "tiny": lambda: (TINY, _tiny_mix),
}


def inventory_from_preset(name: str) -> ModelInventory:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    cfg, mix = PRESETS[name]()
    tensors = {n: spec_for(n, type_id(mix(n, cfg)), ne)
               for n, ne in cfg.tensor_shapes(include_mtp=True).items()}
    return ModelInventory(cfg, tensors, f"preset:{name}")


# ---- GGUF header -----------------------------------------------------------------------------
def _field_value(f: Any) -> Any:
    from gguf.constants import GGUFValueType
    if not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    return f.parts[f.data[0]].tolist()[0]


def inventory_from_gguf(path: str | os.PathLike) -> ModelInventory:
    """Header only: gguf-py maps the file but builds lazy views; no weight byte is touched here.
    Tokenizer arrays are skipped (the vocabulary size is token_embd's ne1)."""
    import gguf
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: no such file")
    try:
        r = gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf-py raises ValueError/struct errors on malformed headers
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from e
    md = {k: _field_value(f) for k, f in r.fields.items()
          if not k.startswith("tokenizer.") and not k.startswith("GGUF.")}
    tensors: dict[str, TensorSpec] = {}
    for t in r.tensors:
        tensors[t.name] = spec_for(t.name, int(t.tensor_type), [int(d) for d in t.shape],
                                   int(t.data_offset))
        if tensors[t.name].nbytes != int(t.n_bytes):
            raise GGUFError(f"{path}: tensor {t.name}: size mismatch")
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise GGUFError(f"{path}: tensor token_embd.weight is missing")
    try:
        cfg = Qwen35Config.from_metadata(md, n_vocab=emb.ne[1], has_output="output.weight" in tensors)
    except ConfigError as e:
        raise GGUFError(f"{path}: {e}") from e
    expect = cfg.tensor_shapes(include_mtp=True)
    for name, shape in expect.items():
        if name not in tensors:
            raise GGUFError(f"{path}: tensor {name} is missing")
        if tensors[name].ne != tuple(shape):
            raise GGUFError(f"{path}: tensor {name} has ne {tensors[name].ne}, expected {tuple(shape)}")
    del r  # drop the mapping; upload re-maps the file read-only
    return ModelInventory(cfg, tensors, path, path)


def load_inventory(model: str | None = None, preset: str | None = None) -> ModelInventory:
    if (model is None) == (preset is None):
        raise UserError("give either a GGUF path or --preset NAME")
    return inventory_from_preset(preset) if preset else inventory_from_gguf(model)  # type: ignore[arg-type]


# ---- placement -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Rows [row_start, row_end) of `tensor`; bytes [byte_start, byte_end) of its data. GPU
    segments sit at `arena_offset` in the device arena; host segments are read in place from the
    mmap at file offset `tensor.offset + byte_start`."""
    tensor: str
    where: str
    row_start: int
    row_end: int
    byte_start: int
    byte_end: int
    arena_offset: int | None = None

    @property
    def nbytes(self) -> int:
        return self.byte_end - self.byte_start


def align_up(n: int, a: int = ARENA_ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass
class Placement:
    """Per tensor, its segments in row order: at most a GPU prefix and a host suffix."""
    segments: dict[str, list[Segment]] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()
    weights_region_bytes: int = 0   # arena bytes used by GPU segments, alignment included

    def gpu_segments(self) -> list[Segment]:
        return [s for segs in self.segments.values() for s in segs if s.where == GPU]

    def host_segments(self) -> list[Segment]:
        return [s for segs in self.segments.values() for s in segs if s.where == HOST]

    @property
    def gpu_bytes(self) -> int:
        return sum(s.nbytes for s in self.gpu_segments())

    @property
    def host_bytes(self) -> int:
        return sum(s.nbytes for s in self.host_segments())

    @property
    def padding_bytes(self) -> int:
        return self.weights_region_bytes - self.gpu_bytes

    def split_tensors(self) -> list[str]:
        return [n for n, segs in self.segments.items() if any(s.where == HOST for s in segs)]

    def summary(self, tensors: Mapping[str, TensorSpec]) -> dict[str, Any]:
        host = []
        for name in self.split_tensors():
            t = tensors[name]
            hs = [s for s in self.segments[name] if s.where == HOST]
            host.append({"tensor": name, "type": type_name(t.qtype), "rows": t.n_rows,
                         "host_rows": [hs[0].row_start, hs[-1].row_end],
                         "host_bytes": sum(s.nbytes for s in hs)})
        return {"gpu_tensors": sum(1 for segs in self.segments.values()
                                   if any(s.where == GPU for s in segs)),
                "gpu_bytes": self.gpu_bytes, "host_bytes": self.host_bytes,
                "alignment_bytes": self.padding_bytes, "excluded": list(self.excluded),
                "host": host}


def build_placement(tensors: Iterable[TensorSpec], host_rows: Mapping[str, int],
                    excluded: Iterable[str] = ()) -> Placement:
    """Lay out GPU prefixes in file order at ARENA_ALIGN offsets; `host_rows[name]` rows at the END
    of a matrix (its suffix) stay on the host. A tensor absent from `host_rows` is wholly on GPU."""
    p = Placement(excluded=tuple(excluded))
    off = 0
    for t in tensors:
        k = int(host_rows.get(t.name, 0))
        split = t.n_rows - k
        rb = t.row_bytes
        segs: list[Segment] = []
        if split > 0:
            segs.append(Segment(t.name, GPU, 0, split, 0, split * rb, off))
            off = align_up(off + split * rb)
        if k > 0:
            segs.append(Segment(t.name, HOST, split, t.n_rows, split * rb, t.nbytes))
        p.segments[t.name] = segs
    p.weights_region_bytes = off
    return p
