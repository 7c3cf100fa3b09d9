#!/bin/bash
# Next session, device call 1 (carry [".whl", ".tcache_in", ".fixtures"]; .fixtures holds copies of
# ../shared/fixtures/Qwen3.5-4B.jinja and ggml-vocab-qwen35.gguf, which the golden files embed):
# the device tests that close issues 6 and 7 and check issue 11's kernels.
#  - issue 7: the GPU executor vs llama.cpp's logits on every golden file (every quant type, the
#    27B-geometry 4-layer slice among them);
#  - issue 6: the GEMV device test at every listed shape (5120->6144 / 10240 / 12288 added);
#  - issue 11: the quantized-KV kernel tests (lost in session 6 call 1).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 590 \
 "goldens|240|python3 -m pytest -q -s tests/test_goldens_executor.py -k gpu 2>&1 | grep -E 'vs llama|passed|failed|Error' | tail -45" \
 "gemvtest|150|python3 -m pytest -q tests/test_gemv_cuda_device.py 2>&1 | tail -5" \
 "kvtests|120|python3 -m pytest -q tests/test_attn_decode_q_extras.py tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py 2>&1 | tail -5"
