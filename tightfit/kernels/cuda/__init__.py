"""CUDA C++ sources of the GEMV kernel (headers *.cuh, contract in CONTRACT.md); assembled into one
translation unit by tightfit.kernels.cuda_source."""
