"""Public entry points. `open_model` is the stable API: it opens, validates and classifies a qwen35
GGUF without reading tensor data. `load` will grow into "return a ready engine"; today it returns
the `ModelFile` that `open_model` gives."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tightfit.errors import GGUFError
from tightfit.gguf.reader import GGUFFile, TensorInfo
from tightfit.model.config import ConfigError, Qwen35Config
from tightfit.model.inventory import Inventory, check_inventory


@dataclass
class ModelFile:
    path: str
    gguf: GGUFFile
    config: Qwen35Config
    trunk_tensors: dict[str, TensorInfo]      # what the main logits use (file order)
    mtp_tensors: dict[str, TensorInfo]        # nextn blocks, excluded from the trunk
    tokenizer_metadata: dict[str, Any]        # every tokenizer.* key
    inventory: Inventory = field(repr=False, default_factory=Inventory)

    @property
    def trunk_bytes(self) -> int:
        return sum(t.nbytes for t in self.trunk_tensors.values())

    def close(self) -> None:
        self.gguf.close()

    def __enter__(self) -> "ModelFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def config_from_gguf(g: GGUFFile) -> Qwen35Config:
    """Qwen35Config from a file's metadata; n_vocab is the tokenizer's token count (llama.cpp's
    rule) or, for a file without tokenizer, token_embd's row count."""
    n_vocab = None
    if "tokenizer.ggml.tokens" not in g.metadata and "token_embd.weight" in g.tensors:
        ne = g.tensors["token_embd.weight"].ne
        n_vocab = ne[1] if len(ne) > 1 else None
    try:
        cfg = Qwen35Config.from_metadata(g.metadata, n_vocab=n_vocab,
                                         has_output="output.weight" in g.tensors)
    except ConfigError as e:
        raise GGUFError(f"{g.name}: {e}") from None
    except (TypeError, ValueError, ArithmeticError) as e:   # e.g. a value of an unexpected type
        raise GGUFError(f"{g.name}: invalid qwen35 metadata: {e}") from None
    # Bounds the config does not check but that later loops rely on: a corrupt block_count of
    # 2**32 would otherwise make the inventory enumerate billions of blocks.
    if cfg.full_attention_interval < 1:
        raise GGUFError(f"{g.name}: qwen35.full_attention_interval must be >= 1, got "
                        f"{cfg.full_attention_interval}")
    if cfg.block_count > len(g.tensors):
        raise GGUFError(f"{g.name}: qwen35.block_count is {cfg.block_count} but the file has only "
                        f"{len(g.tensors)} tensors")
    return cfg


def open_model(path: str | os.PathLike[str]) -> ModelFile:
    """Open a qwen35 GGUF: strict file validation, config, and tensor inventory."""
    g = GGUFFile(path)
    try:
        cfg = config_from_gguf(g)
        inv = check_inventory(g, cfg)
    except BaseException:
        g.close()
        raise
    tok = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}
    return ModelFile(path=str(path), gguf=g, config=cfg, trunk_tensors=inv.trunk,
                     mtp_tensors=inv.mtp, tokenizer_metadata=tok, inventory=inv)


def load(path: str | os.PathLike[str], device: str = "cpu", n_ctx: int | None = None, **kw: Any):
    """Open, validate and load a model for inference. Returns a `tightfit.runtime.engine.Engine`
    (`.config`, `.file` (the ModelFile: tensor views), `.tokenizer`, `.logits(ids)`,
    `.generate(prompt, ...)`, `.chat(messages, ...)`). `device`: "cpu" (reference forward) or
    "cuda[:N]" (graph-captured GPU executor)."""
    from tightfit.runtime.loader import load_engine
    return load_engine(os.fspath(path), device=device, n_ctx=n_ctx, **kw)
