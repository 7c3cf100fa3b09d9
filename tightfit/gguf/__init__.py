"""GGUF reading with strict validation.

    GGUFFile(path)          metadata / metadata_types / array_types / tensors (TensorInfo), mmap
    read_header_only(path)  the same without keeping the file mapped (planner)
    qtypes(), qtype_name()  the tensor type table the validator accepts
"""
from tightfit.gguf.reader import GGUFFile, TensorInfo, read_header_only  # noqa: F401
from tightfit.gguf.validate import qtype_name, qtypes  # noqa: F401
