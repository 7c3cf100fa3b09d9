"""GGUF tensor types: traits table, NumPy reference dequantization, simple quantizers.

    TRAITS[type_id] -> QuantTraits(name, type_id, block_size, type_size, gguf_dequant,
                                   bits_per_weight, align)
    traits(qtype), row_bytes(qtype, n), tensor_bytes(qtype, ne)   (GGUFError on bad input)
    dequantize(raw_uint8, qtype, shape=None) -> float32
    quantize(x_float32[..., cols], qtype) -> uint8[..., row_bytes]
"""
from tightfit.quant.traits import (Q2_0, QTYPES_BY_NAME, TRAITS, QuantTraits, row_bytes,
                                   tensor_bytes, traits)
from tightfit.quant.dequant import dequantize
from tightfit.quant.quantize import quantize

__all__ = ["TRAITS", "QTYPES_BY_NAME", "Q2_0", "QuantTraits", "traits", "row_bytes",
           "tensor_bytes", "dequantize", "quantize"]
