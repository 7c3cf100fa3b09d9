"""Offline model-file tools: repack (lossless base-3 ternary), prune-vocab, GGUF rewriting."""
