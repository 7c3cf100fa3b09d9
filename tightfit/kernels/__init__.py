"""Triton kernels, each beside its reference.

GEMV on raw GGUF blocks: `gemv` (dispatcher, gemv.py), reference `gemv_ref`; activation int8
quantization (quantize_act.py); embedding rows from the compressed table (embed.py).
"""
